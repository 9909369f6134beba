"""The live snapshot: what node 0's aggregator tells the live views, as one typed record.

Below both, so that neither reads the other's code: the aggregator builds it (aggregator/snapshot.py),
the launcher's views read it (views/snapshot.py). The one codec (``traceml_core/codec.py``) writes
the ``snapshot`` frame and reads it back: the fields are declared once, here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .rundata import SystemData
from .statistics.columns import DURATION_COLUMNS

#: the phases of the recent medians, in report order (``comm`` is the exposed communication, the
#: wait, measured on distributed runs only)
PHASES = tuple(c[:-3] for c in DURATION_COLUMNS)


@dataclass(frozen=True)
class Recent:
    """A rank's last records (at most aggregator/snapshot.RECENT_RECORDS)."""

    #: the rank's own clock at its latest step's end: a viewer's rate between two snapshots
    #: divides the steps by this, not by when they happened to arrive
    last_t_end_ns: Optional[int] = None
    steps_per_s: Optional[float] = None
    #: per phase (:data:`PHASES`), the median of those records in ms; None: not measured
    ms: dict[str, Optional[float]] = field(default_factory=dict)
    #: the highest peak memory of those records (bytes)
    mem_peak: Optional[int] = None
    #: the latest step times (ms), oldest first, for the terminal's sparkline
    spark_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RankSeries:
    """A rank's run so far, per bucket of ``width`` steps (the report's series, up to now)."""

    width: int = 1
    step_ms: list[Optional[float]] = field(default_factory=list)
    own_ms: list[Optional[float]] = field(default_factory=list)
    phases_ms: dict[str, list[Optional[float]]] = field(default_factory=dict)
    mem_max: list[Optional[int]] = field(default_factory=list)


@dataclass(frozen=True)
class RankSnap:
    rank: int
    node: Optional[int] = None
    host: str = ""
    local_rank: Optional[int] = None
    connected: bool = False
    #: the aggregator's clock at the rank's last data, and when its connection closed
    last_seen: Optional[float] = None
    closed_at: Optional[float] = None
    #: the status its ``bye`` said (None: no bye yet), and the error it carried
    bye: Optional[str] = None
    error: Optional[str] = None
    received: int = 0
    last_step: int = -1
    recent: Recent = Recent()
    #: the whole run so far (asked for by the dashboard only)
    series: Optional[RankSeries] = None


@dataclass(frozen=True)
class LiveVerdict:
    """The verdict of a provisional summary of the run so far."""

    kind: str = ""
    severity: str = ""
    why: str = ""
    next_step: str = ""
    culprit: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class LiveSnapshot:
    """One ``snapshot`` answer. ``error`` alone is set when the aggregator could not build it."""

    #: the aggregator's clock when it built this (ages are taken on it: no clock skew)
    server_time: float = 0.0
    started_at: Optional[float] = None
    run_name: str = ""
    world_size: int = 0
    nnodes: int = 1
    nproc_per_node: int = 1
    records: int = 0
    finishing: bool = False
    ranks: list[RankSnap] = field(default_factory=list)
    #: each node's system samples so far (the run data's type, without its samples over time)
    nodes: list[SystemData] = field(default_factory=list)
    #: asked for every few seconds; None when not asked for this time
    verdict: Optional[LiveVerdict] = None
    error: Optional[str] = None
