"""An aggregator restarted mid-run goes on from its predecessor's last checkpoint.

When node 0's aggregator dies (SIGKILL, an OOM kill), node 0's launcher starts a new one on the
same port with the last checkpoint (``AggregatorSettings.resume_from``). The relays reconnect on
their own, re-announce their ranks and send what they still hold, so what is lost is only what
reached the dead process after that checkpoint, and it is *counted*: each rank's sequence numbers
go on from the checkpoint's (:func:`seed`), so a record that never made it into any statistics is
a gap.

The new process keeps the checkpoint as a frozen base and adds what it receives on top;
:func:`combine` merges the two into the one plain-data shape of :meth:`RunState.to_data`
(checkpoints and the summary read nothing else). Counts, sums and maxima combine exactly, the
quantile sketches merge, the per-step series align their bucket widths; the node metrics over
time are the newer process's where it has any (a coarser view of the part before the restart is
kept in the base's samples and means).
"""

from __future__ import annotations

from typing import Any, Optional

from .series import Series
from .sketch import QuantileSketch
from .state import RunState

#: rank fields that add up, fields that take the larger, fields where the newer one wins if set
_ADD = ("received", "gaps", "duplicates", "rejected", "event_count", "sketched", "connections")
_MAX = ("client_dropped", "relay_dropped", "relay_seq_end", "next_seq")
_NEWER = ("node", "host", "local_rank", "pid", "connected", "closed_at", "bye", "open_bound",
          "last_open", "counts", "step_source", "last_seen")


def seed(state: RunState, base: dict[str, Any]) -> None:
    """Start a restarted aggregator's state where the checkpoint ``base`` left off: sequence
    numbers, identities and nodes, so gaps count exactly what never arrived and nodes rejoin."""
    state.base = base
    state.records = int(base.get("records", 0))
    for r in base.get("ranks", []):
        rs = state.rank(r["rank"])
        rs.next_seq = rs._proc_next = int(r.get("next_seq", 0))
        for k in ("node", "host", "local_rank", "pid", "joined_at", "step_source"):
            if r.get(k) is not None:
                setattr(rs, k, r[k])
        rs.connected = False
        rs.last_t_end = r.get("last_t_end")
        rs.first_t_end = r.get("first_t_end")
    for n in base.get("nodes", []):
        ni = state.node(n["node"])
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
    if l.get("received"):
        out["last_step"], out["last_t_end"] = l["last_step"], l["last_t_end"]
    out["first_t_end"] = b.get("first_t_end") if b.get("first_t_end") is not None else l.get("first_t_end")
    out["joined_at"] = b.get("joined_at") or l.get("joined_at")
    out["events"] = (list(b.get("events", [])) + list(l.get("events", [])))[-8:]
    out["phases"] = {k: _phase(b["phases"].get(k), v) for k, v in l["phases"].items()}
    out["sums"] = {k: _totals(b.get("sums", {}).get(k), v) for k, v in l.get("sums", {}).items()}
    bm, lm = b["mem"], l["mem"]
    out["mem"] = {"count": bm["count"] + lm["count"], "sum": bm["sum"] + lm["sum"],
                  "max": max(bm["max"], lm["max"])}
    out["outside"] = {"sum": b["outside"]["sum"] + l["outside"]["sum"],
                      "count": b["outside"]["count"] + l["outside"]["count"]}
    out["series"] = _series(b["series"], l["series"])
    return out


def _phase(b: Optional[dict[str, Any]], l: dict[str, Any]) -> dict[str, Any]:
    if not b:
        return l
    out = _totals(b, l)
    out["unmeasured"] = b.get("unmeasured", 0) + l.get("unmeasured", 0)
    mins = [m for m in (b.get("min", -1), l.get("min", -1)) if m is not None and m >= 0]
    out["min"] = min(mins) if mins else -1
    sk = QuantileSketch.from_data(b["sketch"])
    sk.merge(QuantileSketch.from_data(l["sketch"]))
    out["sketch"] = sk.to_data()
    return out


def _totals(b: Optional[dict[str, Any]], l: dict[str, Any]) -> dict[str, Any]:
    if not b:
        return l
    out = dict(l)
    for k in ("count", "sum", "warm_count", "warm_sum"):
        out[k] = b.get(k, 0) + l.get(k, 0)
    out["max"] = max(b.get("max", -1), l.get("max", -1))
    return out


def _series(b: dict[str, Any], l: dict[str, Any]) -> dict[str, Any]:
    """Bucket-wise: both brought to the wider width (pairs merged), then summed / maxed."""
    if not b.get("used"):
        return l
    if not l.get("used"):
        return b
    return Series.from_data(b).merged(Series.from_data(l)).to_data()


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

