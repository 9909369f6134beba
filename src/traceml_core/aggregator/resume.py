"""An aggregator restarted mid-run goes on from its predecessor's last checkpoint.

When node 0's aggregator dies (SIGKILL, an OOM kill), node 0's launcher starts a new one on the
same port with the last checkpoint (``AggregatorSettings.resume_from``). The relays reconnect on
their own, re-announce their ranks and send what they still hold, so what is lost is only what
reached the dead process after that checkpoint, and it is *counted*: each rank's sequence numbers
go on from the checkpoint's (:func:`seed_rank`), so a record that never made it into any statistics is
a gap.

Each rank's statistics go on from the checkpoint's: its running value
(:class:`~traceml_core.statistics.window.WindowStats`) is the checkpoint's, and every window received
after the restart is merged into it, as before the restart (the interval between the last step
before and the first after included). The rest of the checkpoint is kept as a frozen base (typed
run data), and :func:`combine` adds what this process counted on top into one
:class:`~traceml_core.rundata.RunData` (checkpoints and the summary read nothing else); the node
metrics over time are the newer process's where it has any (a coarser view of the part before the
restart is kept in the base's samples and means).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Optional

from ..codec import encode
from ..rundata import GPU_METRICS, GpuData, NodeData, RankData, Running, RunData, SystemData
from ..statistics.window import WindowStats
from .rankstate import RankState

#: rank fields that add up, fields that take the larger, fields where the newer one wins if set
_ADD = ("received", "gaps", "duplicates", "event_count", "connections")
_MAX = ("client_dropped", "relay_dropped", "relay_seq_end", "next_seq")
_NEWER = ("node", "host", "local_rank", "pid", "connected", "closed_at", "bye", "open_bound",
          "last_open", "counts", "step_source", "last_seen", "facts")


def seed_rank(rs: RankState, r: RankData, buckets: int) -> None:
    """Start a restarted aggregator's rank where the checkpoint's rank ``r`` left off: its
    sequence number (gaps then count exactly what never arrived), identity, and statistics (the
    checkpoint's value, which every later window is merged into)."""
    rs.next_seq = r.next_seq
    for k in ("node", "host", "local_rank", "pid", "joined_at", "step_source"):
        if getattr(r, k) is not None:
            setattr(rs, k, getattr(r, k))
    rs.connected = False
    rs.stats = WindowStats.from_data(encode(r), buckets)  # the statistics' own plain form
    rs.facts = copy.deepcopy(r.facts)  # later events add to it


def seed_node(ni: NodeData, n: NodeData) -> None:
    """The checkpoint's node ``n``, for a restarted aggregator: nodes rejoin rather than join."""
    for k in ("host", "joined_at", "via", "nproc", "left_at", "bye", "lifecycle"):
        if getattr(n, k) is not None:
            setattr(ni, k, getattr(n, k))
    ni.connected = False


def combine(base: Optional[RunData], live: RunData) -> RunData:
    """The run's data: the checkpoint it resumed from plus what this process received (``live``,
    made for this call, is completed in place)."""
    if base is None:
        return live
    live.aggregator_started_at = base.aggregator_started_at
    # live.records was seeded from the base, so it is already the total
    live.counters = {k: base.counters.get(k, 0) + v for k, v in live.counters.items()}
    live.resumed = base.resumed + 1
    live.hangs = base.hangs + live.hangs
    live.probe = live.probe or base.probe  # measured before the restart
    ranks = {r.rank: r for r in base.ranks}
    for r in live.ranks:
        ranks[r.rank] = _rank(ranks[r.rank], r) if r.rank in ranks else r
    live.ranks = [ranks[k] for k in sorted(ranks)]
    nodes = {n.node: n for n in base.nodes}
    nodes.update((n.node, n) for n in live.nodes)  # seeded from the base: already the latest
    live.nodes = [nodes[k] for k in sorted(nodes)]
    systems = {s.node: s for s in base.system}
    for s in live.system:
        systems[s.node] = _system(systems[s.node], s) if s.node in systems else s
    live.system = [systems[k] for k in sorted(systems)]
    return live


def _rank(b: RankData, l: RankData) -> RankData:
    out = replace(b)
    for k in _ADD:
        setattr(out, k, getattr(b, k) + getattr(l, k))
    for k in _MAX:
        setattr(out, k, max(getattr(b, k), getattr(l, k)))
    for k in _NEWER:
        if getattr(l, k) is not None:
            setattr(out, k, getattr(l, k))
    out.joined_at = b.joined_at or l.joined_at
    out.events = (b.events + l.events)[-8:]
    # the statistics: the live rank's value went on from the checkpoint's (seed)
    for k in _STATS:
        setattr(out, k, getattr(l, k))
    return out


#: a rank's statistics in its plain data (WindowStats.to_data)
_STATS = tuple(WindowStats().to_data())


def _system(b: SystemData, l: SystemData) -> SystemData:
    gpus = {g.index: g for g in b.gpus}
    for g in l.gpus:
        old = gpus.get(g.index)
        gpus[g.index] = g if old is None else GpuData(g.index, *(
            _running(getattr(old, m), getattr(g, m)) for m in GPU_METRICS))
    return replace(l, samples=b.samples + l.samples,
                   first_ts=b.first_ts if b.first_ts is not None else l.first_ts,
                   cpu_pct=_running(b.cpu_pct, l.cpu_pct), ram_used=_running(b.ram_used, l.ram_used),
                   ram_total=_running(b.ram_total, l.ram_total), gpus=[gpus[i] for i in sorted(gpus)],
                   over_time=l.over_time if l.over_time.used else b.over_time)


def _running(b: Running, l: Running) -> Running:
    mx = [m for m in (b.max, l.max) if m is not None]
    return Running(b.n + l.n, b.sum + l.sum, max(mx) if mx else None)
