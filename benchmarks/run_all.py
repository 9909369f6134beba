"""Every benchmark of issue 8 in one command, then one table of headline figures against targets.

Each benchmark runs as its own process (its full output is printed as it goes) and writes its
figures as JSON into a results directory; the closing table quotes them against the issue's
targets and says which are met. Nothing here is a pass/fail test: the exit code is 0 unless a
benchmark itself failed to run.

    python benchmarks/run_all.py            # the issue's sizes (~15-25 minutes on a small machine)
    python benchmarks/run_all.py --quick    # smaller sizes (~5 minutes)
    python benchmarks/run_all.py --only ingest,cli

GPU figures come from ``benchmarks/gpu_check.py``, which skips cleanly without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from _bench_common import machine  # noqa: E402


def plan(quick: bool) -> list[tuple[str, str, list[str]]]:
    """(key, script, arguments) in running order."""
    return [
        ("cli", "cli_latency.py", ["--reps", "5" if quick else "10"]),
        ("step", "step_overhead.py", ["--quick"] if quick else []),
        ("comm", "comm_overhead.py", ["--quick"] if quick else []),
        ("fast", "fast_steps.py", ["--relay"] + (["--quick"] if quick else [])),
        ("ingest", "aggregator_ingest.py",
         ["--ranks", "1,64,512" if quick else "1,64,512,4096", "--records", "5",
          "--seconds", "3" if quick else "6"]),
        ("memory", "aggregator_memory.py",
         ["--ranks", "64", "--steps", "100000" if quick else "1000000", "--summary-ranks", "4096"]),
        ("launcher", "launcher_fixed_cost.py", ["--reps", "2" if quick else "5"]),
        ("gpu", "gpu_check.py", ["--quick"] if quick else []),
    ]


def _get(data: Any, *path: Any) -> Any:
    for p in path:
        if data is None:
            return None
        try:
            data = data[p]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def headline(results: dict[str, Any]) -> list[tuple[str, str, str, Optional[bool]]]:
    """(what, figure, target, met) rows for the closing table."""
    rows: list[tuple[str, str, str, Optional[bool]]] = []

    def add(what: str, value: Any, fmt: Callable[[Any], str], target: str, met: Optional[bool]) -> None:
        rows.append((what, "not measured" if value is None else fmt(value), target,
                     None if value is None else met))

    v = _get(results, "step", "median_step", "overhead_us")
    add("trace_step overhead per step (CPU, tiny MLP)", v, lambda x: f"{x:.2f} us", "<= 5 us",
        v is not None and v <= 5.0)
    c = _get(results, "comm", "world_1", "comm-on - comm-off, median step", "per_bucket_us")
    add("communication timing per DDP bucket (1 rank, 8 buckets)", c, lambda x: f"{x:+.1f} us",
        "a few us per bucket", c is not None and c <= 10.0)
    fast = results.get("fast")
    paced = _get(fast, "paced", "ranks")
    relayed = _get(fast, "paced+relay", "ranks")
    if paced is not None and relayed is not None:
        paced = paced + [dict(r, rate=r["rate"]) for r in relayed]
    add("fast steps, zero loss (per rank; direct, then via relay)", paced,
        lambda rs: ", ".join(f"{r['rate']:,.0f} steps/s, lost {r['lost_end_to_end']}" for r in rs),
        ">= 20,000/s, 0 lost", bool(fast and fast.get("met")))
    ingest = results.get("ingest") or []
    for mode in ("direct", "relay"):
        r = next((x for x in ingest if x["ranks"] == 4096 and x["mode"] == mode), None)
        if r is None:
            big = [x for x in ingest if x["mode"] == mode]
            r = max(big, key=lambda x: x["ranks"]) if big else None
        if r is None:
            continue
        n = r["ranks"]
        add(f"ingest {n} ranks x 10 batches/s, {mode}: loss, one core", r,
            lambda x: f"lost {x['lost']}, {x['rec_per_s']:,.0f} rec/s at {x['agg_cpu_s'] / x['wall_s']:.0%} "
                      f"of a core; latency p50 {x['lat_p50_s']:.2f} s; RSS {x['hwm_mb']:.0f} MB",
            "no loss at 4,096 ranks", r["lost"] == 0 and n == 4096)
        add(f"ingest {n} ranks, {mode}: ratio to bare decode", r,
            lambda x: f"{x['ratio']:.2f} (frames received, {x['records_per_agg_frame']:.0f} rec) / "
                      f"{x['ratio_rank_frames']:.2f} (ranks' frames)", ">= 0.5",
            r["ratio"] >= 0.5)
    mem = _get(results, "memory", "memory")
    full = mem is not None and mem["steps_per_rank"] >= 1_000_000
    add("aggregator RSS after 10^6 steps/rank, 64 ranks", mem,
        lambda m: f"{m['rss_mb']:.0f} MB (+{m['growth_mb']:.1f} MB) after {m['steps_per_rank']:,} steps/rank",
        "< 200 MB" if full or mem is None else "< 200 MB (quick: 10^5 steps)",
        (mem["rss_mb"] < 200) if full else None)
    fin = _get(results, "memory", "final_summary")
    add("final summary for 4,096 ranks", fin, lambda f: f"{f['total_s']:.2f} s", "(no target)", None)
    lc = results.get("launcher")
    add("launcher fixed cost vs torchrun", lc, lambda x: f"{x['fixed_cost_s']:+.2f} s, {x['ratio']:.2f}x",
        "about +1 s", lc is not None and lc["fixed_cost_s"] <= 1.0)
    cli = results.get("cli") or {}
    for key, target in (("help", 0.150), ("print-config", 0.300), ("print-config (Slurm step)", 0.300)):
        c = cli.get(key)
        add(f"traceml {'--help' if key == 'help' else 'run --' + key}", c,
            lambda x: f"{1e3 * x['median_s']:.0f} ms, torch {'imported' if x['torch_imported'] else 'not imported'}",
            f"< {1e3 * target:.0f} ms, no torch", c is not None and c["median_s"] < target and not c["torch_imported"])
    gpu = results.get("gpu")
    add("GPU check", gpu, lambda g: f"{sum(c['ok'] for c in g['checks'])}/{len(g['checks'])} checks passed",
        "all pass", gpu is not None and all(c["ok"] for c in gpu["checks"]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    ap.add_argument("--only", help="comma-separated keys: cli, step, fast, ingest, memory, launcher, gpu")
    ap.add_argument("--out", help="directory for the JSON results (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="traceml-bench-results-"))
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TRACEML_RUN_INFO", None)
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f}; results in {out}", flush=True)
    results: dict[str, Any] = {}
    failed = []
    for key, script, extra in plan(args.quick):
        if only and key not in only:
            continue
        dest = out / f"{key}.json"
        print(f"\n=== {script} {' '.join(extra)}", flush=True)
        t0 = time.monotonic()
        code = subprocess.run([sys.executable, str(HERE / script), *extra, "--json", str(dest)],
                              env=env).returncode
        print(f"=== {script}: exit {code}, {time.monotonic() - t0:.0f} s", flush=True)
        if code != 0 and not (key == "gpu" and dest.exists()):
            failed.append(script)
        if dest.exists():
            results[key] = json.loads(dest.read_text())
    rows = headline(results)
    w = max(len(r[0]) for r in rows)
    print(f"\n{'figure':<{w}}  {'measured':<60}  {'target':<22}  met")
    for what, fig, target, met in rows:
        mark = "-" if met is None else ("yes" if met else "NO")
        print(f"{what:<{w}}  {fig:<60}  {target:<22}  {mark}")
    (out / "headline.json").write_text(json.dumps(rows, indent=2) + "\n")
    if failed:
        print(f"\nbenchmarks that did not run to the end: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
