"""The aggregator's side of the live views: the ``snapshot`` frame, one :class:`LiveSnapshot`.

:func:`snapshot_frame` runs **inside the aggregator's loop** when node 0's launcher asks on its
control connection (wire/protocol.py). A rank's recent statistics are the window value
(``WindowStats.of_columns``) of its last records (kept in the live modes only), its whole-run series
the report's. It costs O(ranks x recent records), plus a provisional summary when the verdict is
asked for (every few seconds), and never raises: an internal error comes back as the record's
``error``, so a bug here cannot close the launcher's control connection.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any

from ..codec import encode
from ..livesnapshot import PHASES, LiveSnapshot, LiveVerdict, RankSeries, RankSnap, Recent
from ..rundata import RankData
from ..statistics.columns import DURATION_COLUMNS
from ..statistics.window import WindowStats
from .state import RunState

#: at most this many ranks are described in one frame (live views are single-node: 8-16 ranks)
MAX_RANKS = 128
#: the "recent" statistics of a rank use its last records, at most this many
RECENT_RECORDS = 64
#: recent step times sent per rank for the terminal's sparkline
SPARK_POINTS = 32


def snapshot_frame(state: RunState, msg: dict[str, Any]) -> dict[str, Any]:
    """The ``snapshot`` reply for one request, from the run state alone; never raises."""
    try:
        snap = build(state, bool(msg.get("series")), bool(msg.get("verdict")))
    except Exception as exc:  # never let a view's request hurt the aggregator
        snap = LiveSnapshot(error=f"{type(exc).__name__}: {str(exc)[:200]}")
    return {"t": "snapshot", "id": msg.get("id"), **encode(snap)}


def _recent_stats(rs: Any) -> Recent:
    if not rs.tail or not rs.tail["step"]:
        return Recent()
    n = min(RECENT_RECORDS, len(rs.tail["step"]))
    cols = {c: list(islice(d, len(d) - n, None)) for c, d in rs.tail.items()}
    try:
        w = WindowStats.of_columns(rs.tail_end - n, cols, cap=RECENT_RECORDS)
    except ValueError:  # sums past a window's bound (absurd values): this rank shows none
        return Recent()
    span = (w.field("t_last") - w.field("t_first")) / 1e9
    mem = w.field("mem_peak.max")
    return Recent(
        last_t_end_ns=w.field("t_last"),
        steps_per_s=round((n - 1) / span, 3) if span > 0 else None,
        ms={p: None if (m := w.median(c)) is None else round(m / 1e6, 4) for p, c in zip(PHASES, DURATION_COLUMNS)},
        mem_peak=mem if mem >= 0 else None,
        spark_ms=[round(v / 1e6, 3) for v in cols["step_ns"][-SPARK_POINTS:] if v >= 0])


def _series(rs: Any) -> RankSeries:
    """The whole run so far, per step bucket (the same series as the report's)."""
    from ..report.timeline import rank_series

    s = rs.series
    per = rank_series(RankData(rs.rank, node=rs.node, host=rs.host, series=s.to_data()), s.width, s.used, 0.0)
    return RankSeries(s.width, per.step_ms, per.own_ms, per.phases_ms, per.mem_max_bytes or [None] * s.used)


def _rank(rs: Any, series: bool) -> RankSnap:
    bye = rs.bye
    return RankSnap(
        rank=rs.rank, node=rs.node, host=rs.host, local_rank=rs.local_rank, connected=rs.connected,
        last_seen=rs.last_seen, closed_at=rs.closed_at, bye=bye.status if bye else None,
        error=((bye.error if bye else None) or "")[:300] or None, received=rs.received, last_step=rs.last_step,
        recent=_recent_stats(rs), series=_series(rs) if series else None)


def build(st: RunState, series: bool = False, verdict: bool = False) -> LiveSnapshot:
    """The live snapshot of the run now (``series``: each rank's whole run so far; ``verdict``:
    the verdict of a provisional summary)."""
    s = st.settings
    so_far = None
    if verdict and s.world_size <= MAX_RANKS:
        from ..report.summary import build_document
        from .adapter import run_data

        v = build_document(run_data(st), provisional=True).verdict
        so_far = LiveVerdict(v.kind, v.severity, v.why, v.next_step, v.culprit)
    return LiveSnapshot(
        server_time=time.time(), started_at=s.started_at, run_name=s.run_name, world_size=s.world_size,
        nnodes=s.nnodes, nproc_per_node=s.nproc_per_node, records=st.records, finishing=st.finish is not None,
        ranks=[_rank(st.ranks[r], series) for r in sorted(st.ranks)[:MAX_RANKS]],
        nodes=[st.system[n].now(over_time=False) for n in sorted(st.system)[:MAX_RANKS]], verdict=so_far)
