"""Node 0 at 4,096, 16,384 and 65,536 ranks (issue 23 item 6), side by side in one run.

Ranks step 10 times a second. What node 0 receives is made by the real code of the relays and
replayed through node 0's real code, in a process of its own, so its CPU and peak RSS are node
0's alone:

* **node relays** (``launcher/relay.py``): each rank's 1 s window of records (10 records, the
  columns a DDP job sends) becomes its ``WindowStats`` and ``fold`` frame. Timed apart (``node
  relay us/rank-s``: CPU per rank and second on its node, on a sample of ranks; the values of
  identical windows are then reused for the other ranks, each frame encoded for its own rank);
* **group relays** (``launcher/grouprelay.GroupMerge``, the tree, from 512 nodes on: groups of
  about sqrt(nodes) nodes): decode and check each node frame, merge each rank's windows for
  ``group_flush_s(ranks)`` seconds (2 s at 16,384 ranks, 8 s at 65,536), re-encode. Timed
  (``group relay us/rank-s``: CPU per rank and second on its group's first node);
* **node 0** (``aggregator/ingest.py``): for every byte of every link, ``FrameBuffer.feed``
  (msgpack decode), ``wire.frames.validate`` (the window's check), ``Ingest.node_frame`` /
  ``group_frame`` (sequence accounting, the merge into the rank's value); ``cores`` = its CPU per
  second of the run. Then one checkpoint (``RunState.to_data`` + ``pack_checkpoint``, what node 0
  writes every few minutes): its CPU time and size (writing the bytes is not included). ``peak
  RSS`` is node 0's process (its state, one second of input, the checkpoint), not the replay's.

The quantile sketches' folds of keys into their dense stores happen every 2,048 values per phase
(every ~3.5 minutes at 10 steps/s), so hardly ever inside the replayed seconds; they are measured
apart in steady state (``sketch_fold_us``) and shown beside ``cores`` (``+folds``, for the ranks
whose windows come as keys: those on direct links; a group relay's windows come counted): add
the two.

Every record is accounted for: the script asserts node 0's record count and each rank's.

    PYTHONPATH=src python benchmarks/node0_scale.py                    # 4,096, 16,384, 65,536
    PYTHONPATH=src python benchmarks/node0_scale.py --ranks 512 --per-relay 8 --quick
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregator_ingest import make_cols  # noqa: E402
from traceml_core.launcher.grouprelay import GroupMerge, fan_in, group_flush_s  # noqa: E402
from traceml_core.launcher.outqueue import OutQueue, Outgoing  # noqa: E402
from traceml_core.statistics.window import WindowStats  # noqa: E402
from traceml_core.wire.fold import fold_frame  # noqa: E402
from traceml_core.wire.frames import validate  # noqa: E402
from traceml_core.wire.protocol import FrameBuffer, encode  # noqa: E402

STEPS_PER_S = 10
#: ranks whose node-relay work is timed one by one (the per-rank cost does not depend on the size)
RELAY_SAMPLE = 1024


# --- node 0, in its own process --------------------------------------------------------------------
def node0(conn: Any, ranks: int, per_node: int, fan: int, at_step: int, tmp: str) -> None:
    """Node 0's aggregator state fed what the links send, second by second, from ``conn``."""
    from traceml_core.aggregator.adapter import checkpoint_data
    from traceml_core.aggregator.ingest import Ingest
    from traceml_core.rundir import pack_checkpoint
    from traceml_core.aggregator.settings import AggregatorSettings
    from traceml_core.aggregator.state import RunState
    from traceml_core.wire.auth import Identity

    nodes = ranks // per_node
    settings = AggregatorSettings(run_name="bench", run_dir=Path(tmp) / "bench", nnodes=nodes,
                                  nproc_per_node=per_node, token="x", relay_fan_in=fan)
    state = RunState(settings)
    ingest = Ingest(state, lambda _m: None)
    now = time.time()
    links: list[tuple[Any, Identity]] = []
    if fan:  # group 0's nodes connect directly; each other group through its group relay
        groups = range(0, nodes, fan)
        for head in groups:
            link = object()
            if head == 0:
                continue
            ident = Identity("group", head, -1, f"n{head}", None)
            ingest.group_joined(link, ident)
            links.append((link, ident))
        direct = range(0, min(fan, nodes))
    else:
        direct = range(nodes)
    direct_links = []
    for n in direct:
        link, ident = object(), Identity("node", n, -1, f"n{n}", None, nproc=per_node)
        ingest.node_joined(link, ident, now)
        direct_links.append((link, ident))
    links = direct_links + links
    bufs = [FrameBuffer() for _ in links]
    gc.collect()
    cpu = 0.0
    conn.send("ready")
    while True:
        batch = conn.recv()
        if batch is None:
            break
        t0 = time.process_time()
        for i, data in batch:
            link, ident = links[i]
            if ident.kind == "group":
                for msg in bufs[i].feed(data):
                    ingest.group_frame(link, ident, validate("group", msg), now, finishing=False)
            else:
                for msg in bufs[i].feed(data):
                    ingest.node_frame(link, ident, validate("node", msg))
        cpu += time.process_time() - t0
        del batch
    rss_ingest = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    records = state.records
    per_rank = {rs.received for rs in state.ranks.values()}
    t0 = time.process_time()  # CPU time: what it costs node 0, whatever else the machine runs
    blob = pack_checkpoint(checkpoint_data(state), final=False)
    ckpt = time.process_time() - t0
    size = len(blob)
    del blob
    t0 = time.process_time()  # again: in steady state (the first one folded every sketch's keys)
    pack_checkpoint(checkpoint_data(state), final=False)
    ckpt2 = time.process_time() - t0
    conn.send({"cpu": cpu, "records": records, "per_rank": sorted(per_rank), "ranks": len(state.ranks),
               "ckpt_s": ckpt, "ckpt2_s": ckpt2, "ckpt_mb": size / 1e6, "rss_ingest_mb": rss_ingest,
               "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


# --- the relays, in this process -------------------------------------------------------------------
def run(ranks: int, per_node: int, seconds: int, tmp: Path, at_step: int = 0, tree: str = "auto") -> dict[str, Any]:
    """One size: ``ranks`` in nodes of ``per_node``, ``seconds`` replayed from step ``at_step``
    (an hour in is 36,000: each rank's value goes on from there, so its series has the width it
    has then); ``tree``: ``auto`` (group relays from 512 nodes on) or ``off``."""
    nodes = ranks // per_node
    fan = fan_in(nodes) if tree == "auto" else 0
    flush_every = max(1, round(group_flush_s(ranks))) if fan else 1
    rnd = random.Random(0)
    variants = [make_cols(STEPS_PER_S, rnd) for _ in range(8)]
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=node0, args=(child, ranks, per_node, fan, at_step, str(tmp)))
    proc.start()
    assert parent.recv() == "ready"
    # who is where: link index of each node (direct) / of each group (tree)
    direct = range(min(fan, nodes)) if fan else range(nodes)
    heads = list(range(fan, nodes, fan)) if fan else []
    merges = {h: GroupMerge(OutQueue(), per_node) for h in heads}
    gbufs = {h: FrameBuffer() for h in heads}
    node_us = group_cpu = 0.0
    sent = 0

    def window(s: int, r: int) -> bytes:
        return encode(fold_frame(r, values[(r + s) % 8]))

    # the joins (not timed at node 0: the start of the run)
    first: list[tuple[int, bytes]] = []
    for n in range(nodes):
        data = b"".join(encode({"t": "join", "rank": r, "local_rank": r % per_node, "host": f"n{n}",
                                "pid": r, "new": True}) for r in range(n * per_node, (n + 1) * per_node))
        if n in direct:
            first.append((n, data))
        else:  # the group relay says the node is there (its link opened), then passes its joins on
            h = (n // fan) * fan
            merges[h].out.put(Outgoing(encode({"t": "node", "node": n, "host": f"n{n}", "nproc": per_node})))
            _feed(merges[h], gbufs[h], n, data)
    for h in heads:
        first.append((len(direct) + heads.index(h), _drain(merges[h].out)))
    parent.send(first)
    for s in range(seconds):
        seq = at_step + s * STEPS_PER_S
        # the node relays' work for this second: timed on a sample, values reused for the rest
        t0 = time.process_time()
        for r in range(min(RELAY_SAMPLE, ranks)):
            WindowStats.of_columns(seq, variants[(r + s) % 8])
            encode(fold_frame(r, WindowStats.of_columns(seq, variants[(r + s) % 8])))
        node_us += (time.process_time() - t0) / 2 / min(RELAY_SAMPLE, ranks) * 1e6
        values = [WindowStats.of_columns(seq, v) for v in variants]
        batch: list[tuple[int, bytes]] = []
        for n in range(nodes):
            data = b"".join(window(s, r) for r in range(n * per_node, (n + 1) * per_node))
            if n in direct:
                batch.append((n, data))
                continue
            h = (n // fan) * fan
            t0 = time.process_time()
            _feed(merges[h], gbufs[h], n, data)
            group_cpu += time.process_time() - t0
        if heads:
            last = s == seconds - 1
            t0 = time.process_time()
            for h in heads:
                if last or (s + 1) % flush_every == 0:
                    merges[h].flush()
                data = _drain(merges[h].out)
                if data:
                    batch.append((len(direct) + heads.index(h), data))
            group_cpu += time.process_time() - t0
        sent += sum(len(d) for _, d in batch)
        parent.send(batch)
        del batch
    parent.send(None)
    res = parent.recv()
    proc.join()
    records = ranks * STEPS_PER_S * seconds
    assert res["records"] == records and res["per_rank"] == [STEPS_PER_S * seconds] and res["ranks"] == ranks, res
    grouped = ranks - len(direct) * per_node if fan else 0
    return {"at": at_step, "ranks": ranks, "nodes": nodes, "links": len(direct) + len(heads),
            "keyed": len(direct) * per_node,
            "fan": fan, "group_s": flush_every if fan else 0, "records": records,
            "cores": res["cpu"] / seconds, "rec_per_cpu_s": records / res["cpu"], "mb": sent / 1e6,
            "node_us": node_us / seconds, "group_us": group_cpu / (grouped * seconds) * 1e6 if grouped else 0.0,
            **{k: res[k] for k in ("ckpt_s", "ckpt2_s", "ckpt_mb", "rss_mb", "rss_ingest_mb")}}


def _feed(merge: GroupMerge, buf: FrameBuffer, node: int, data: bytes) -> None:
    """A group relay's work on one node link's bytes (GroupRelay.on_frame without the socket)."""
    for msg in buf.feed(data):
        checked = validate("node", msg)
        if checked["t"] == "fold":
            merge.frame(node, checked, b"")
        else:
            merge.frame(node, checked, encode(msg))


def _drain(out: OutQueue) -> bytes:
    parts = []
    while True:
        item = out.pop()
        if item is None:
            return b"".join(parts)
        parts.append(item.data)
        out.recycle(item)


def sketch_fold_us(sample: int = 64, windows: int = 410) -> float:
    """CPU per rank and second of the quantile sketches' folds, in steady state: ``sample`` ranks
    merge ``windows`` 1 s windows each (two folds per phase); only the folds are timed."""
    from traceml_core.aggregator.rankstate import RankState
    from traceml_core.statistics.sketch import QuantileSketch

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
        value = WindowStats.of_columns(w * STEPS_PER_S, make_cols(STEPS_PER_S, rnd))
        msgs.append(encode(fold_frame(0, value)))
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


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4096,16384,65536", help="comma-separated rank counts")
    ap.add_argument("--per-relay", default="16,8,8", help="ranks per node, one per size (256 / 2,048 / 8,192 nodes)")
    ap.add_argument("--seconds", type=int, default=12, help="seconds of the run replayed per size")
    ap.add_argument("--at-steps", default="0,36000",
                    help="where in the run the replayed seconds start, in steps (36,000: an hour in)")
    ap.add_argument("--tree", default="auto",
                    help="auto (group relays from 512 nodes on), off, or both (the two side by side); "
                         "one per size, comma-separated (e.g. both,both,auto: 65,536 ranks on direct links "
                         "would need ~9 GB)")
    ap.add_argument("--quick", action="store_true", help="a smoke run (tests): 2 s")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",")]
    per = [int(x) for x in args.per_relay.split(",")]
    per += [per[-1]] * (len(sizes) - len(per))
    seconds = 2 if args.quick else args.seconds
    tree_of = args.tree.split(",")
    tree_of += [tree_of[-1]] * (len(sizes) - len(tree_of))
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for at in (int(x) for x in args.at_steps.split(",")):
            for ranks, pr, how in zip(sizes, per, tree_of):
                trees = ["auto", "off"] if how == "both" else [how]
                for tree in trees:
                    if tree == "off" and not fan_in(ranks // pr) and "auto" in trees:
                        continue  # the same run: no tree at this size
                    rows.append(run(ranks, pr, seconds, Path(tmp), at, tree))
                    gc.collect()
    fold_us = sketch_fold_us(16 if args.quick else 64, 205 if args.quick else 410)
    for r in rows:  # (ranks behind a group relay get counted sketches: nothing to fold)
        r["fold_cores"] = fold_us * r["keyed"] / 1e6
    print(f"node 0 through the relays, {STEPS_PER_S} steps/s per rank, {seconds} s of the run replayed "
          f"(Python {sys.version.split()[0]})")
    print(f"quantile sketch folds, steady state: {fold_us:.1f} us per rank and second (+folds)")
    print(f"{'from step':>9} {'ranks':>7} {'nodes':>6} {'links':>6} {'group':>7} {'records':>10} {'wire MB':>8} "
          f"{'cores':>6} {'+folds':>6} {'rec/cpu-s':>10} {'node relay':>10} {'group relay':>11} "
          f"{'checkpoint':>10} {'again':>6} {'ckpt MB':>8} {'peak RSS':>9}")
    for r in rows:
        group = f"{r['fan']}x{r['group_s']}s" if r["fan"] else "-"
        grp = f"{r['group_us']:>8.0f} us" if r["fan"] else f"{'-':>11}"
        print(f"{r['at']:>9,} {r['ranks']:>7,} {r['nodes']:>6,} {r['links']:>6,} {group:>7} {r['records']:>10,} "
              f"{r['mb']:>8.1f} {r['cores']:>6.3f} {r['fold_cores']:>6.3f} {r['rec_per_cpu_s']:>10,.0f} "
              f"{r['node_us']:>7.0f} us {grp} {r['ckpt_s']:>9.2f}s {r['ckpt2_s']:>5.2f}s {r['ckpt_mb']:>8.1f} "
              f"{r['rss_mb']:>7.0f}MB")
    for at in sorted({r["at"] for r in rows}):
        here = [r for r in rows if r["at"] == at]
        treed = {r["ranks"] for r in here if r["fan"]}
        same = [r for r in here if r["fan"] or r["ranks"] not in treed]  # the tree where it ran
        for a, b in zip(same, same[1:]):
            print(f"ratio {b['ranks']:,}/{a['ranks']:,} ranks, from step {at:,}: cores x{b['cores'] / a['cores']:.2f} "
                  f"(ranks x{b['ranks'] / a['ranks']:.0f}), cost per record x{a['rec_per_cpu_s'] / b['rec_per_cpu_s']:.2f}")
        for r in here:  # the tree against direct links, where both ran
            d = next((x for x in here if x["ranks"] == r["ranks"] and not x["fan"]), None)
            if r["fan"] and d is not None:
                print(f"{r['ranks']:,} ranks, from step {at:,}, group relays / direct links: "
                      f"cores x{r['cores'] / d['cores']:.2f}, peak RSS x{r['rss_mb'] / d['rss_mb']:.2f}, "
                      f"checkpoint x{r['ckpt2_s'] / max(d['ckpt2_s'], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
