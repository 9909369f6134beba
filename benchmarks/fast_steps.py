"""Fast steps: near-empty traced steps at a fixed rate per rank, shipped to a real receiver on
loopback, with the exact loss counted end to end.

Each rank is a separate process running ``with traceml.trace_step(): pass`` paced at ``--rate``
steps per second (busy-waiting between steps, so the pacing itself never sleeps past a deadline),
then an unthrottled run to show the ceiling. The receiver is
``python -m traceml_core.wire.sink`` in its own process; it counts every record it decodes and
every gap in the per-rank sequence numbers, so "lost" below is measured at the receiving end, not
assumed from the sender's counters.

    python benchmarks/fast_steps.py                 # 1 rank, 20,000 steps/s for 5 s, then max
    python benchmarks/fast_steps.py --quick         # 2 s each
    python benchmarks/fast_steps.py --relay         # also through a relay into a real aggregator
    python benchmarks/fast_steps.py --ranks 2

Target: zero lost steps at 20,000 steps/s per rank.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_common import REPO, RUN, TOKEN, SinkProcess, machine, maybe_json  # noqa: E402

TARGET_RATE = 20_000


def worker(args: argparse.Namespace) -> int:
    import traceml_core as traceml

    traceml.init(aggregator=f"127.0.0.1:{args.port}", token=TOKEN, run_name=RUN, rank=args.rank,
                 world_size=args.ranks, connect_wait=10)
    pc = time.perf_counter_ns
    trace_step = traceml.trace_step
    n = int(args.rate * args.seconds) if args.rate > 0 else 0
    period = int(1e9 / args.rate) if args.rate > 0 else 0
    t_start = pc()
    if period:
        deadline = t_start
        late = 0
        for _ in range(n):
            deadline += period
            with trace_step():
                pass
            now = pc()
            if now > deadline + period:
                late += 1
            while now < deadline:
                now = pc()
    else:
        late = 0
        end = t_start + int(args.seconds * 1e9)
        while pc() < end:
            for _ in range(1000):
                with trace_step():
                    pass
            n += 1000
    elapsed = (pc() - t_start) / 1e9
    t0 = time.perf_counter()
    traceml.shutdown()
    flush_s = time.perf_counter() - t0
    st = traceml.stats()
    print(json.dumps({"rank": args.rank, "steps": st["steps"], "elapsed_s": elapsed,
                      "rate": st["steps"] / elapsed, "sent": st["sent"], "lost": st["lost"],
                      "late_steps": late, "flush_s": flush_s, "bye": st["bye_sent"]}))
    return 0


def run(rate: float, seconds: float, ranks: int) -> dict:
    sink = SinkProcess(expect_byes=ranks)
    procs = []
    try:
        for r in range(ranks):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--port", str(sink.port), "--rank", str(r),
                 "--ranks", str(ranks), "--rate", str(rate), "--seconds", str(seconds)],
                stdout=subprocess.PIPE, text=True, cwd=REPO,
            ))
        results = [json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
                   for p in procs]
        totals = sink.totals()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        sink.kill()
    for res in results:
        got = totals["ranks"].get(str(res["rank"]), {})
        res["received"] = got.get("records", 0)
        res["gaps"] = got.get("gaps", 0)
        res["lost_end_to_end"] = res["steps"] - res["received"]
    return {"rate_target": rate, "seconds": seconds, "ranks": results}


def run_via_relay(rate: float, seconds: float, ranks: int) -> dict:
    """The same, through the real path of ``traceml run``: ranks -> this node's relay (a thread
    here) -> a real aggregator process; loss read from the aggregator's final summary."""
    import tempfile

    from traceml_core.aggregator.settings import AggregatorSettings

    from _bench_common import LocalRun

    tmp = Path(tempfile.mkdtemp(prefix="traceml-bench-"))
    run = LocalRun(AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=tmp / RUN, port=0,
                                      nnodes=1, nproc_per_node=ranks, drain_s=5.0), flush_s=1.0)
    relay = run.relay
    procs = []
    try:
        for r in range(ranks):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--port", str(relay.port), "--rank", str(r),
                 "--ranks", str(ranks), "--rate", str(rate), "--seconds", str(seconds)],
                stdout=subprocess.PIPE, text=True, cwd=REPO,
            ))
        results = [json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
                   for p in procs]
        res = run.finish(0)
        relay_stats = run.relay_stats
        summary = json.loads(res.summary_json.read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if run.handle.alive():
            run.kill()
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    for res_ in results:
        got = by_rank.get(res_["rank"], {})
        res_["received"] = got.get("steps", 0)
        res_["gaps"] = (got.get("telemetry") or {}).get("gaps", 0)
        res_["lost_end_to_end"] = res_["steps"] - res_["received"]
    return {"rate_target": rate, "seconds": seconds, "ranks": results,
            "relay_dropped": relay_stats.records_dropped,
            "relay_frames": [relay_stats.frames_in, relay_stats.frames_forwarded]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=TARGET_RATE, help="steps per second per rank")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 s per run")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--relay", action="store_true",
                    help="also run the paced case through a relay into a real aggregator")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.seconds = 2.0

    print(f"machine: {machine()}")
    out = {}
    runs = [("paced", args.rate, run), ("unthrottled", 0.0, run)]
    if args.relay:
        runs.append(("paced+relay", args.rate, run_via_relay))
    for label, rate, fn in runs:
        res = fn(rate, args.seconds, args.ranks)
        out[label] = res
        for r in res["ranks"]:
            want = f"{rate:,.0f}/s target" if rate else "as fast as possible"
            print(f"{label:13} rank {r['rank']}: {r['steps']:>9,} steps in {r['elapsed_s']:.2f} s = "
                  f"{r['rate']:>9,.0f} steps/s ({want}); received {r['received']:,}, "
                  f"lost {r['lost_end_to_end']} (client counted {r['lost']}, gaps {r['gaps']}), "
                  f"exit flush {r['flush_s'] * 1000:.0f} ms")
    paced = out["paced"]["ranks"] + (out["paced+relay"]["ranks"] if args.relay else [])
    met = all(r["lost_end_to_end"] == 0 and r["rate"] >= 0.98 * args.rate for r in paced)
    print(f"target: zero lost steps at {args.rate:,.0f} steps/s per rank: {'MET' if met else 'NOT MET'}")
    out["met"] = met
    out["machine"] = machine()
    maybe_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
