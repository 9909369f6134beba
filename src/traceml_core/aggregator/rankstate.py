"""Everything the aggregator keeps about one rank: identity, loss accounting, ending, statistics.

The statistics are one running :class:`~traceml_core.statistics.window.WindowStats`: each ``fold``
frame's window (already checked where it entered, wire/frames.check_fold) is merged into it, a
fixed number of C-level passes however many records the window holds. Memory is bounded by the
number of phases and series buckets, never by the run's length. In the live modes a raw tail of
at most :data:`TAIL_RECORDS` records is kept too, from ``tail`` frames (never persisted).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

from ..rankfacts import RankFacts
from ..rundata import RankBye, RankEvent, StepSource
from ..statistics.columns import STEP_COLUMNS
from ..statistics.series import BUCKETS, Series
from ..statistics.window import WindowStats

#: records kept per rank for live views (modes cli and dashboard; none in summary mode)
TAIL_RECORDS = 256


class RankState:
    """Statistics, identity, loss accounting and ending of one global rank."""

    __slots__ = (
        "rank", "node", "host", "local_rank", "pid", "joined_at", "last_seen", "connected",
        "closed_at", "connections", "bye", "received", "gaps", "duplicates", "client_dropped",
        "next_seq", "stats", "tail", "tail_end", "events", "event_count",
        "relay_dropped", "relay_seq_end", "open_bound", "last_open", "counts", "step_source", "facts",
    )

    def __init__(self, rank: int, tail_records: int = 0, buckets: int = BUCKETS) -> None:
        self.rank = rank
        self.node: Optional[int] = None
        self.host = ""
        self.local_rank: Optional[int] = None
        self.pid: Optional[int] = None
        self.joined_at: Optional[float] = None
        self.last_seen: Optional[float] = None
        self.connected = False
        self.closed_at: Optional[float] = None
        self.connections = 0  # accepted hellos (>1 means it reconnected)
        self.bye: Optional[RankBye] = None
        self.received = 0  # unique records ingested
        self.gaps = 0  # records skipped in seq (never received)
        self.duplicates = 0  # records received twice (a batch resent after a reconnect)
        self.client_dropped = 0  # the client's own cumulative drop count
        self.relay_dropped = 0  # records its node's relay had to drop (budget full), cumulative
        self.relay_seq_end = 0  # seq after the last record the relay received from it
        #: records the rank last said it held unsent (its relay reports it when it goes): what
        #: may have died with it; None when it never said
        self.open_bound: Optional[int] = None
        #: what the rank said it held unsent in its latest steps frame
        self.last_open: Optional[int] = None
        #: its answer to the last ``counts`` request (wire/frames.REQUESTS), with ``at``
        self.counts: Optional[dict[str, Any]] = None
        self.next_seq = 0
        #: the statistics of every record received (the windows merged, in order)
        self.stats = WindowStats.running(buckets)
        #: (live modes only; summary mode keeps none: memory at scale) each column of its last
        #: records, and the seq after the last one
        self.tail: Optional[dict[str, deque]] = (
            {c: deque(maxlen=tail_records) for c in STEP_COLUMNS} if tail_records > 0 else None)
        self.tail_end = 0
        self.events: Optional[deque[RankEvent]] = None  # the last 8, made at the first (most have none)
        self.event_count = 0
        #: how this rank's steps are found (the latest ``step_source`` event; None: not said,
        #: i.e. a process that called traceml itself without the worker bootstrap)
        self.step_source: Optional[StepSource] = None
        #: checkpoint spans, progress and declared work (its span/progress/work events)
        self.facts = RankFacts()

    # --- reading ---------------------------------------------------------------------------
    @property
    def series(self) -> Series:
        return self.stats.series

    @property
    def last_step(self) -> int:
        """The user's step index of the last record received (-1: none yet)."""
        return self.stats.field("last_step") if self.stats.records else -1

    # --- windows (the relays' statistics) ---------------------------------------------------
    def ingest_fold(self, msg: dict[str, Any]) -> int:
        """Merge one checked ``fold`` frame (wire/fold.py): sequence and loss accounting from its
        ``seq``/``n``/``dropped``, then its window's value (``msg["value"]``) merged into the
        rank's. Returns the new records.

        A window that partly overlaps what was received (a relay folds each record once, in order,
        so this does not happen) counts the overlap as duplicates and is merged whole."""
        seq, n = msg["seq"], msg["n"]
        dropped = msg["dropped"]
        if dropped > self.client_dropped:
            self.client_dropped = dropped
        expected = self.next_seq
        skip = 0
        if seq < expected:  # a resend after reconnecting
            skip = expected - seq
            if skip >= n:
                self.duplicates += n
                return 0
            self.duplicates += skip
        elif seq > expected:
            self.gaps += seq - expected
        self.next_seq = seq + n
        self.received += n - skip
        self.stats.merge(msg["value"])
        return n - skip

    def note_tail(self, msg: dict[str, Any]) -> None:
        """A checked ``tail`` frame: a window's last records, kept for the live views (summary
        mode keeps none: they are never read there, and cost memory per rank)."""
        if self.tail is not None:
            for c, d in self.tail.items():
                d.extend(msg["cols"][c])
            self.tail_end = msg["seq"] + msg["n"]

    # --- other frames -----------------------------------------------------------------------
    def note_event(self, kind: str, text: str, ts: float) -> None:
        self.event_count += 1
        if self.events is None:
            self.events = deque(maxlen=8)
        self.events.append(RankEvent(kind[:64], text[:2000], ts))
