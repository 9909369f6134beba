"""Node 0's ingest cost at issue 17's sizes: 4,096 ranks / 256 relays and 16,384 ranks / 2,048
relays, 10 steps/s each, side by side, in one process.

What node 0 really receives from the relays is replayed through its real code, for both kinds of
relay frames side by side (``--kinds``): ``fold`` (summary mode, every multi-node run: each rank's
1 s window folded by the relay into partial statistics, ``launcher/relayframes.fold_frame``) and
``steps`` (the records themselves: the live modes, and what every relay sent before folding; the
"before" figures). One frame per rank per 1 s window, 10 records each, the columns a DDP job
sends, concatenated per link as a relay writes them, then the aggregator's own path for every
byte: ``FrameBuffer.feed`` (msgpack decode), ``wire.frames.validate("node", ...)``,
``Ingest.node_frame`` (sequence accounting, and for ``fold`` the partials added) and
``RunState.flush`` (for ``steps``: the statistics: phases, sketches, series, sums), once per
simulated second. The relays' own folding is timed apart (``relay us/rank-s``: CPU per rank and
second on its node, where there are 8-16 ranks). No sockets and no senders: the figure is node
0's own CPU per second of the run (cores), which is what the target bounds (16,384 ranks: < 1 core;
4,096: < 0.25 core). The socket layer is measured end to end, with real relays and senders, by
``aggregator_ingest.py`` (4,096 ranks: 29 % of a core through 64 relays).

The quantile sketches' folds (``+folds``: each phase's sketch counts keys in a dict and folds them
into its dense store every 2,048 values, about every 2 minutes at 10 steps/s, so few fall inside
the replayed seconds) are done after them for everything received and shown per second beside
``cores``: add the two for node 0's whole cost (an upper bound: folding less often repeats more
keys, each folded once). A checkpoint (every few seconds, capped at 2 % of the wall clock by the
server) is timed once per size after those folds and printed beside it, not added.

    PYTHONPATH=src python benchmarks/node0_scale.py                   # 4,096 and 16,384 ranks, both kinds
    PYTHONPATH=src python benchmarks/node0_scale.py --ranks 512 --seconds 3 --quick
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregator_ingest import make_cols  # noqa: E402
from traceml_core.aggregator.ingest import Ingest  # noqa: E402
from traceml_core.rundir import pack_checkpoint  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402
from traceml_core.aggregator.state import RunState  # noqa: E402
from traceml_core.launcher.relayframes import fold_frame  # noqa: E402
from traceml_core.wire.auth import Identity  # noqa: E402
from traceml_core.wire.frames import validate  # noqa: E402
from traceml_core.wire.protocol import FrameBuffer, encode  # noqa: E402

STEPS_PER_S = 10


def run(ranks: int, per_relay: int, seconds: int, tmp: Path, at_step: int = 0,
        kind: str = "fold") -> dict[str, float]:
    """``at_step``: the replayed seconds start this many steps into the run (each rank's state
    goes on from there, as after a checkpoint), so the per-step series has the width it has then
    (early on a 10-record window straddles several narrow buckets, the slow path). ``kind``:
    ``fold`` (what relays send in summary mode: each window folded into partial statistics) or
    ``steps`` (the records themselves, as before folding, and in the live modes)."""
    nodes = ranks // per_relay
    settings = AggregatorSettings(run_name="bench", run_dir=tmp / "bench", nnodes=nodes,
                                  nproc_per_node=per_relay, token="x")
    state = RunState(settings)
    ingest = Ingest(state, lambda _m: None)
    rnd = random.Random(0)
    variants = [make_cols(STEPS_PER_S, rnd) for _ in range(8)]
    links, idents = [], []
    for node in range(nodes):
        link, ident = object(), Identity("node", node, -1, f"n{node}", None, nproc=per_relay)
        ingest.node_joined(link, ident, time.time())
        for r in range(node * per_relay, (node + 1) * per_relay):
            ingest.node_frame(link, ident, validate("node", {"t": "join", "rank": r, "local_rank": r % per_relay,
                                                             "host": f"n{node}", "pid": r, "new": True}))
        links.append(link)
        idents.append(ident)
    for rs in state.ranks.values():
        rs.next_seq = rs._proc_next = at_step
    # the bytes of each second, per link, built before the clock starts (the relays' work)
    wire: list[list[bytes]] = []
    fold_cpu = 0.0  # the relays' folding, all of them together (spread over the nodes)
    for s in range(seconds):
        per_link = []
        for node in range(nodes):
            frames = ({"t": "steps", "rank": r, "seq": at_step + s * STEPS_PER_S, "n": STEPS_PER_S,
                       "cols": variants[(r + s) % 8], "dropped": 0, "open": 0}
                      for r in range(node * per_relay, (node + 1) * per_relay))
            if kind == "fold":
                t0 = time.process_time()
                frames = [fold_frame(f) for f in frames]
                fold_cpu += time.process_time() - t0
            per_link.append(b"".join(encode(f) for f in frames))
        wire.append(per_link)
    nbytes = sum(len(b) for sec in wire for b in sec)
    bufs = [FrameBuffer() for _ in range(nodes)]
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for sec in wire:
        for node in range(nodes):
            link, ident = links[node], idents[node]
            for msg in bufs[node].feed(sec[node]):
                ingest.node_frame(link, ident, validate("node", msg))
        state.flush()
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    records = ranks * STEPS_PER_S * seconds
    assert state.records == records and all(rs.received == STEPS_PER_S * seconds for rs in state.ranks.values())
    t0 = time.perf_counter()
    blob = pack_checkpoint(state.to_data(), final=False)
    ckpt = time.perf_counter() - t0
    # again: a checkpoint in steady state (the first one above also folded every sketch's keys
    # for the first time, growing its dense store)
    t0 = time.perf_counter()
    pack_checkpoint(state.to_data(), final=False)
    ckpt2 = time.perf_counter() - t0
    return {"kind": kind, "relay_us": fold_cpu / (ranks * seconds) * 1e6, "at": at_step, "ranks": ranks, "relays": nodes, "records": records, "cpu": cpu, "wall": wall,
            "cores": cpu / seconds, "rec_per_cpu_s": records / cpu, "mb": nbytes / 1e6,
            "ckpt_s": ckpt, "ckpt2_s": ckpt2, "ckpt_mb": len(blob) / 1e6,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def sketch_fold_us(sample: int = 64, windows: int = 410) -> float:
    """CPU per rank and second of the quantile sketches' folds, in steady state.

    Each phase's sketch counts keys in a dict and folds them into its dense store every 2,048
    values: at 10 steps/s about every 205 s, so almost none fall inside the replayed seconds of
    :func:`run`. Here ``sample`` ranks receive ``windows`` folded 1 s windows each (two folds per
    phase), through the real validation and ``RankState.ingest_fold``, and only the folds are
    timed (the first fold of each sketch, which grows its dense store, included)."""
    from traceml_core.aggregator.rankstate import RankState
    from traceml_core.aggregator.sketch import QuantileSketch

    spent = [0.0]
    real = QuantileSketch.fold

    def timed(self: QuantileSketch) -> None:
        t0 = time.process_time()
        real(self)
        spent[0] += time.process_time() - t0

    rnd = random.Random(1)
    ranks = [RankState(r) for r in range(sample)]
    msgs = []
    for w in range(windows):
        cols = make_cols(STEPS_PER_S, rnd)
        msgs.append(encode(fold_frame({"t": "steps", "rank": 0, "seq": w * STEPS_PER_S, "n": STEPS_PER_S,
                                       "cols": cols, "dropped": 0})))
    QuantileSketch.fold = timed  # type: ignore[method-assign]
    try:
        for rs in ranks:
            buf = FrameBuffer()
            for raw in msgs:
                for msg in buf.feed(raw):
                    rs.ingest_fold(validate("node", msg))
    finally:
        QuantileSketch.fold = real  # type: ignore[method-assign]
    return spent[0] / (sample * windows) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4096,16384", help="comma-separated rank counts")
    ap.add_argument("--per-relay", default="16,8", help="ranks per relay, one per size (256 / 2,048 relays)")
    ap.add_argument("--seconds", type=int, default=10, help="seconds of the run replayed per size")
    ap.add_argument("--at-steps", default="0,36000",
                    help="where in the run the replayed seconds start, in steps (36,000: an hour in)")
    ap.add_argument("--kinds", default="steps,fold",
                    help="what the relays send: steps (the records: before folding, and live modes), "
                         "fold (partial statistics per rank and window: summary mode)")
    ap.add_argument("--quick", action="store_true", help="a smoke run (tests): 2 s")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    sizes = [int(x) for x in args.ranks.split(",")]
    per = [int(x) for x in args.per_relay.split(",")]
    per += [per[-1]] * (len(sizes) - len(per))
    seconds = 2 if args.quick else args.seconds
    import tempfile
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for at in (int(x) for x in args.at_steps.split(",")):
            for ranks, pr in zip(sizes, per):
                for kind in kinds:
                    rows.append(run(ranks, pr, seconds, Path(tmp), at, kind))
                    gc.collect()
    fold_us = sketch_fold_us(16 if args.quick else 64, 205 if args.quick else 410)
    for r in rows:
        r["fold_cores"] = fold_us * r["ranks"] / 1e6  # both kinds sketch 10 keys per phase and second
    print(f"node 0's ingest through relays, {STEPS_PER_S} steps/s per rank, {seconds} s of the run replayed "
          f"(Python {sys.version.split()[0]})")
    print(f"quantile sketch folds, steady state: {fold_us:.1f} us per rank and second (+folds)")
    print(f"{'sent':>5} {'from step':>9} {'ranks':>7} {'relays':>6} {'records':>10} {'wire MB':>8} {'node 0 CPU':>10} "
          f"{'cores':>6} {'+folds':>6} {'rec/cpu-s':>10} {'relay us/rank-s':>15} {'checkpoint':>10} {'again':>6} {'ckpt MB':>8} {'peak RSS':>9}")
    for r in rows:
        relay = f"{r['relay_us']:>15.0f}" if r["kind"] == "fold" else f"{'-':>15}"
        print(f"{r['kind']:>5} {r['at']:>9,} {r['ranks']:>7,} {r['relays']:>6,} {r['records']:>10,} {r['mb']:>8.1f} "
              f"{r['cpu']:>9.2f}s {r['cores']:>6.3f} {r['fold_cores']:>6.3f} {r['rec_per_cpu_s']:>10,.0f} {relay} {r['ckpt_s']:>9.2f}s {r['ckpt2_s']:>5.2f}s "
              f"{r['ckpt_mb']:>8.1f} {r['rss_mb']:>7.0f}MB")
    for at in sorted({r["at"] for r in rows}):
        for kind in kinds:
            same = [r for r in rows if r["at"] == at and r["kind"] == kind]
            if len(same) > 1:
                a, b = same[0], same[-1]
                print(f"ratio {b['ranks']:,}/{a['ranks']:,} ranks, {kind}, from step {at:,}: cores "
                      f"x{b['cores'] / a['cores']:.2f} (ranks x{b['ranks'] / a['ranks']:.0f}), cost per record x"
                      f"{a['rec_per_cpu_s'] / b['rec_per_cpu_s']:.2f}")
        for ranks in sizes:
            pair = {r["kind"]: r for r in rows if r["at"] == at and r["ranks"] == ranks}
            if "steps" in pair and "fold" in pair:
                print(f"{ranks:,} ranks from step {at:,}: node 0 cores folded / unfolded = "
                      f"{pair['fold']['cores'] / pair['steps']['cores']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
