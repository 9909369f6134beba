"""The aggregator's side of the live views: the ``snapshot`` frame.

:func:`snapshot_frame` runs **inside the aggregator's loop** when node 0's launcher sends
``{"t": "snapshot", "id": N, "series": bool, "verdict": bool}`` on its control connection (see
wire/protocol.py). It first computes the statistics of frames still pending, then reads the
per-rank raw tail (kept in ``cli``/``dashboard`` modes only) and counters the aggregator already
keeps, costs O(ranks x recent records) (plus a provisional summary of the typed run data when
``verdict`` is asked for, every few seconds) and never raises: an internal error comes back as
``"error"`` in the frame, so a bug here cannot close the launcher's control connection. The
launcher reads the frames with :func:`traceml_core.views.snapshot.read_snapshot`.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..rundata import RankData
from .state import RunState

#: at most this many ranks are described in one frame (live views are single-node: 8-16 ranks)
MAX_RANKS = 128
#: the "recent" statistics of a rank use its last records, at most this many
RECENT_RECORDS = 64
#: recent step times sent per rank for the terminal's sparkline
SPARK_POINTS = 32

#: ``comm`` is the exposed communication (the wait), measured on distributed runs only
PHASES = ("step", "input", "forward", "backward", "optimizer", "h2d", "comm")
_COLS = tuple(p + "_ns" for p in PHASES)


def snapshot_frame(state: RunState, msg: dict[str, Any]) -> dict[str, Any]:
    """The ``snapshot`` reply for one request, from the run state alone; never raises."""
    rid = msg.get("id")
    try:
        return _build(state, msg, rid)
    except Exception as exc:  # never let a view's request hurt the aggregator
        return {"t": "snapshot", "id": rid, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _recent(rs: Any, k: int) -> dict[str, list[int]]:
    """The last ``k`` records of a rank's raw tail, per column (oldest first)."""
    parts: list[dict[str, list[int]]] = []
    have = 0
    for _seq, n, cols in reversed(rs.tail):
        take = min(n, k - have)
        parts.append({c: cols[c][n - take:] for c in _COLS + ("t_end_ns", "mem_peak")})
        have += take
        if have >= k:
            break
    out: dict[str, list[int]] = {c: [] for c in _COLS + ("t_end_ns", "mem_peak")}
    for p in reversed(parts):
        for c, v in p.items():
            out[c].extend(v)
    return out


def _median(xs: list[int]) -> Optional[float]:
    vals = sorted(v for v in xs if v >= 0)
    if not vals:
        return None
    m = len(vals) // 2
    return float(vals[m]) if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2.0


def _rank(rs: Any, series: bool) -> dict[str, Any]:
    rec = _recent(rs, RECENT_RECORDS)
    t = rec["t_end_ns"]
    span = (t[-1] - t[0]) / 1e9 if len(t) >= 2 else 0.0
    mem = [m for m in rec["mem_peak"] if m >= 0]
    out = {
        "rank": rs.rank, "node": rs.node, "host": rs.host, "local_rank": rs.local_rank, "pid": rs.pid,
        "connected": rs.connected, "joined_at": rs.joined_at, "last_seen": rs.last_seen,
        "closed_at": rs.closed_at, "bye": (rs.bye or {}).get("status"),
        "error": ((rs.bye or {}).get("error") or "")[:300] or None,
        "received": rs.received, "last_step": rs.last_step, "gaps": rs.gaps,
        "client_dropped": rs.client_dropped,
        "recent": {
            "n": len(t), "span_s": round(span, 4),
            # the rank's own clock at its latest step's end: a viewer's rate between two
            # snapshots divides the steps by this, not by when they happened to arrive
            "last_t_end_ns": t[-1] if t else None,
            "steps_per_s": round((len(t) - 1) / span, 3) if span > 0 else None,
            "ms": {p: (None if (m := _median(rec[c])) is None else round(m / 1e6, 4))
                   for p, c in zip(PHASES, _COLS)},
            "mem_peak": mem[-1] if mem else None,
            "spark_ms": [round(v / 1e6, 3) for v in rec["step_ns"][-SPARK_POINTS:] if v >= 0],
        },
    }
    if series:  # the whole run so far, per step bucket (the same series as the report's)
        from ..report.timeline import rank_series

        s = rs.series
        per = rank_series(RankData(rs.rank, node=rs.node, host=rs.host, series=s.to_data()),
                          s.width, s.used, 0.0)
        out["series"] = {"width": s.width, "step_ms": per.step_ms, "own_ms": per.own_ms,
                         "phases_ms": per.phases_ms, "mem_max": per.mem_max_bytes or [None] * s.used}
    return out


def _build(st: RunState, msg: dict[str, Any], rid: Any) -> dict[str, Any]:
    s = st.settings
    frame: dict[str, Any] = {
        "t": "snapshot", "id": rid, "server_time": time.time(), "started_at": s.started_at,
        "run_name": s.run_name, "world_size": s.world_size, "nnodes": s.nnodes,
        "nproc_per_node": s.nproc_per_node, "mode": s.mode, "records": st.records,
        "finishing": st.finish is not None,
        "ranks": [_rank(st.ranks[r], bool(msg.get("series"))) for r in sorted(st.ranks)[:MAX_RANKS]],
        "system": [st.system[n].to_data() for n in sorted(st.system)[:MAX_RANKS]],
        "counters": dict(st.counters),
    }
    if msg.get("verdict") and s.world_size <= MAX_RANKS:
        from ..report.summary import build_summary
        from .adapter import run_data

        summ = build_summary(run_data(st), provisional=True)
        frame["verdict"] = {k: summ["verdict"].get(k) for k in ("kind", "severity", "why", "next_step", "culprit")}
    return frame
