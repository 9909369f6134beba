"""An aggregator restarted mid-run goes on from its predecessor's last checkpoint.

When node 0's aggregator dies (SIGKILL, an OOM kill), node 0's launcher starts a new one on the
same port with the last checkpoint (``AggregatorSettings.resume_from``). The relays reconnect on
their own, re-announce their ranks and send what they still hold, so what is lost is only what
reached the dead process after that checkpoint, and it is *counted*: each rank's sequence numbers
go on from the checkpoint's (:func:`seed`), so a record that never made it into any statistics is
a gap.

Each rank's statistics go on from the checkpoint's: its running value
(:class:`~traceml_core.statistics.window.WindowStats`) is the checkpoint's, and every window received
after the restart is merged into it, as before the restart (the interval between the last step
before and the first after included). The rest of the checkpoint is kept as a frozen base, and
:func:`combine` adds what this process counted on top into the one plain-data shape of
:meth:`RunState.to_data` (checkpoints and the summary read nothing else); the node metrics over
time are the newer process's where it has any (a coarser view of the part before the restart is
kept in the base's samples and means).
"""

from __future__ import annotations

from typing import Any, Optional

from ..rankfacts import RankFacts
from ..statistics.window import WindowStats
from .nodeinfo import NodeInfo
from .rankstate import RankState

#: rank fields that add up, fields that take the larger, fields where the newer one wins if set
_ADD = ("received", "gaps", "duplicates", "event_count", "connections")
_MAX = ("client_dropped", "relay_dropped", "relay_seq_end", "next_seq")
_NEWER = ("node", "host", "local_rank", "pid", "connected", "closed_at", "bye", "open_bound",
          "last_open", "counts", "step_source", "last_seen", "facts")


def seed_rank(rs: RankState, r: dict[str, Any], buckets: int) -> None:
    """Start a restarted aggregator's rank where the checkpoint's rank ``r`` left off: its
    sequence number (gaps then count exactly what never arrived), identity, and statistics (the
    checkpoint's value, which every later window is merged into)."""
    rs.next_seq = int(r.get("next_seq", 0))
    for k in ("node", "host", "local_rank", "pid", "joined_at", "step_source"):
        if r.get(k) is not None:
            setattr(rs, k, r[k])
    rs.connected = False
    rs.stats = WindowStats.from_data(r, buckets)
    rs.facts = RankFacts.from_checkpoint(r.get("facts"))  # later events add to it


def seed_node(ni: NodeInfo, n: dict[str, Any]) -> None:
    """The checkpoint's node ``n``, for a restarted aggregator: nodes rejoin rather than join."""
    for k in ("host", "joined_at", "via", "nproc", "left_at", "bye", "lifecycle"):
        if n.get(k) is not None:
            setattr(ni, k, n[k])
    ni.connected = False


def combine(base: Optional[dict[str, Any]], live: dict[str, Any]) -> dict[str, Any]:
    """The run's data: the checkpoint it resumed from plus what this process received."""
    if not base:
        return live
    out = dict(live)
    out["aggregator_started_at"] = base.get("aggregator_started_at", live["aggregator_started_at"])
    out["records"] = live["records"]  # seeded from the base, so already the total
    out["counters"] = {k: base.get("counters", {}).get(k, 0) + v for k, v in live["counters"].items()}
    out["resumed"] = (base.get("resumed") or 0) + 1
    out["hangs"] = list(base.get("hangs") or []) + list(live.get("hangs") or [])
    out["probe"] = live.get("probe") or base.get("probe")  # measured before the restart
    ranks = {r["rank"]: r for r in base.get("ranks", [])}
    for r in live["ranks"]:
        ranks[r["rank"]] = _rank(ranks[r["rank"]], r) if r["rank"] in ranks else r
    out["ranks"] = [ranks[k] for k in sorted(ranks)]
    nodes = {n["node"]: n for n in base.get("nodes", [])}
    for n in live["nodes"]:
        nodes[n["node"]] = n  # seeded from the base: already the latest
    out["nodes"] = [nodes[k] for k in sorted(nodes)]
    systems = {s["node"]: s for s in base.get("system", [])}
    for s in live["system"]:
        systems[s["node"]] = _system(systems[s["node"]], s) if s["node"] in systems else s
    out["system"] = [systems[k] for k in sorted(systems)]
    return out


def _rank(b: dict[str, Any], l: dict[str, Any]) -> dict[str, Any]:
    out = dict(b)
    for k in _ADD:
        out[k] = (b.get(k) or 0) + (l.get(k) or 0)
    for k in _MAX:
        out[k] = max(b.get(k) or 0, l.get(k) or 0)
    for k in _NEWER:
        if l.get(k) is not None:
            out[k] = l[k]
    out["joined_at"] = b.get("joined_at") or l.get("joined_at")
    out["events"] = (list(b.get("events", [])) + list(l.get("events", [])))[-8:]
    # the statistics: the live rank's value went on from the checkpoint's (seed)
    out.update({k: v for k, v in l.items() if k in _STATS})
    return out


#: a rank's statistics in its plain data (WindowStats.to_data)
_STATS = frozenset(WindowStats().to_data())


def _system(b: dict[str, Any], l: dict[str, Any]) -> dict[str, Any]:
    out = dict(l)
    out["samples"] = b.get("samples", 0) + l.get("samples", 0)
    out["first_ts"] = b.get("first_ts") if b.get("first_ts") is not None else l.get("first_ts")
    for k in ("cpu_pct", "ram_used", "ram_total"):
        out[k] = _running(b.get(k), l.get(k))
    gpus = {g["index"]: g for g in b.get("gpus", [])}
    for g in l.get("gpus", []):
        old = gpus.get(g["index"])
        gpus[g["index"]] = g if old is None else {"index": g["index"], **{
            m: _running(old.get(m), v) for m, v in g.items() if m != "index"}}
    out["gpus"] = [gpus[i] for i in sorted(gpus)]
    if not (l.get("over_time") or {}).get("used"):
        out["over_time"] = b.get("over_time")
    return out


def _running(b: Optional[dict[str, Any]], l: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not b:
        return l
    if not l:
        return b
    mx = [m for m in (b.get("max"), l.get("max")) if m is not None]
    return {"n": b["n"] + l["n"], "sum": b["sum"] + l["sum"], "max": max(mx) if mx else None}

