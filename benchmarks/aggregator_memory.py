"""Aggregator memory and finalisation cost, measured in-process (no sockets: the state alone).

1. Memory is bounded by ranks x phases, not by steps: feed R ranks S steps each (in windows of B
   records, folded as relays do and merged by the real ``RankState.ingest_fold``) and print the
   process RSS growth at several points of the run. Issue 8's target: under 200 MB after 10^6 steps per rank on 64 ranks
   (``--ranks 64 --steps 1000000``; minutes on a small machine).
2. Final-summary time for many ranks: checkpoint (``to_data`` + msgpack), ``build_summary``,
   JSON and text rendering for ``--summary-ranks`` ranks (default 4,096).

Run: ``PYTHONPATH=src python benchmarks/aggregator_memory.py [--ranks 64 --steps 100000]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregator_ingest import make_cols  # noqa: E402
from traceml_core.rundir import pack_checkpoint  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402
from traceml_core.aggregator.state import RunState  # noqa: E402
from traceml_core.report.render_txt import render  # noqa: E402
from traceml_core.report.summary import build_summary  # noqa: E402
from traceml_core.statistics.window import WindowStats  # noqa: E402
from traceml_core.aggregator.adapter import checkpoint_data  # noqa: E402
from traceml_core.codec import decode  # noqa: E402
from traceml_core.rundata import LaunchEnd, RankBye, RunData  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def window(seq: int, cols: dict) -> dict:
    """A checked ``fold`` frame as node 0 takes it: the window's statistics (the relay's work)."""
    n = len(cols["step"])
    return {"seq": seq, "n": n, "dropped": 0, "value": WindowStats.of_columns(seq, cols)}


def state_for(ranks: int) -> RunState:
    return RunState(AggregatorSettings(run_name="bench", token="t", run_dir=Path("/nonexistent"),
                                       nnodes=1, nproc_per_node=ranks))


def memory(args: argparse.Namespace) -> dict:
    rnd = random.Random(0)
    variants = [make_cols(args.batch, rnd) for _ in range(8)]
    st = state_for(args.ranks)
    base = rss_mb()
    print(f"memory: {args.ranks} ranks x {args.steps:,} steps in frames of {args.batch} "
          f"(RSS before: {base:.0f} MB)")
    print(f"{'steps/rank':>12} {'RSS MB':>8} {'growth MB':>10} {'ingest s':>9} {'rec/s':>11}")
    t0 = time.perf_counter()
    done = 0
    marks = sorted({args.steps // 10, args.steps // 2, args.steps})
    for mark in marks:
        while done < mark:
            for r in range(args.ranks):
                rs = st.rank(r)
                cols = variants[(r + done // args.batch) % 8]
                rs.ingest_fold(window(done, cols))
            done += args.batch
        checkpoint_data(st)  # checkpoint-equivalent: folds sketches
        el = time.perf_counter() - t0
        now = rss_mb()
        print(f"{done:>12,} {now:>8.0f} {now - base:>10.1f} {el:>9.1f} {done * args.ranks / el:>11,.0f}")
    return {"ranks": args.ranks, "steps_per_rank": done, "rss_mb": now, "growth_mb": now - base,
            "records_per_s": done * args.ranks / el}


def finalize(args: argparse.Namespace) -> dict:
    rnd = random.Random(1)
    variants = [make_cols(50, rnd) for _ in range(8)]
    st = state_for(args.summary_ranks)
    for r in range(args.summary_ranks):
        rs = st.rank(r)
        rs.node, rs.host = r // 8, f"node{r // 8:04d}"
        for b in range(4):
            rs.ingest_fold(window(b * 50, variants[(r + b) % 8]))
        rs.bye = RankBye("clean", 200, None, time.time())
    st.finish = LaunchEnd(exit_code=0, source="launcher", at=time.time())
    t0 = time.perf_counter()
    data = checkpoint_data(st)
    t1 = time.perf_counter()
    blob = pack_checkpoint(data, final=True)
    t2 = time.perf_counter()
    summary = build_summary(decode(RunData, data))
    t3 = time.perf_counter()
    text = json.dumps(summary, indent=1)
    t4 = time.perf_counter()
    render(summary)
    t5 = time.perf_counter()
    print(f"final summary for {args.summary_ranks:,} ranks: {t5 - t0:.2f} s in all "
          f"(state {t1 - t0:.2f}, checkpoint pack {t2 - t1:.2f} [{len(blob) / 1e6:.1f} MB], "
          f"summary {t3 - t2:.2f}, JSON {t4 - t3:.2f} [{len(text) / 1e6:.1f} MB], text {t5 - t4:.2f})")
    return {"ranks": args.summary_ranks, "total_s": t5 - t0, "state_s": t1 - t0, "pack_s": t2 - t1,
            "summary_s": t3 - t2, "json_s": t4 - t3, "text_s": t5 - t4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100_000, help="steps per rank")
    ap.add_argument("--batch", type=int, default=1000, help="records per frame")
    ap.add_argument("--summary-ranks", type=int, default=4096)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    out = {"memory": memory(args), "final_summary": finalize(args)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
