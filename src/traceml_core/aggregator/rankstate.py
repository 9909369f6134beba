"""Everything the aggregator keeps about one rank, and the hot path that ingests a ``steps`` frame.

Memory is bounded by the number of phases, never by the run's length: per phase a handful of
integers and one :class:`~.sketch.QuantileSketch`; one :class:`~.series.Series`; a raw tail of at
most :data:`TAIL_RECORDS` records (for live views; never persisted).

Cost per batch is a fixed number of C-level passes over each column (``max``, ``sum``, and
``array('f')`` + ``_count_elements`` over at most ``sketch_sample_cap`` values), never a Python
statement per record. Exactness: counts, sums (hence means) and maxima use every record; quantiles
come from the sketch (about 0.8 % relative error) fed by a systematic, weighted sample when a batch
holds more than ``sketch_sample_cap`` records; minima are taken over the sketched values.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

from ..report.thresholds import WARMUP_STEPS
from ..wire.protocol import STEP_COLUMNS, ProtocolError
from .series import Series
from .sketch import QuantileSketch, column_keys

#: step columns that are durations in ns and get full statistics (order = report order)
DURATION_COLUMNS = ("step_ns", "input_ns", "forward_ns", "backward_ns", "optimizer_ns", "h2d_ns")
#: records kept per rank for live views
TAIL_RECORDS = 256
_INF = float("inf")


class PhaseStats:
    __slots__ = ("count", "sum", "max", "min", "warm_count", "warm_sum", "unmeasured", "sketch")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0
        self.max = -1
        self.min = -1  # over sketched values; -1 until something was measured
        self.warm_count = 0  # records with seq < WARMUP_STEPS (excluded from steady means)
        self.warm_sum = 0
        self.unmeasured = 0  # records where this phase was -1
        self.sketch = QuantileSketch()

    def to_data(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "max": self.max, "min": self.min,
                "warm_count": self.warm_count, "warm_sum": self.warm_sum,
                "unmeasured": self.unmeasured, "sketch": self.sketch.to_data()}


class RankState:
    """Statistics, identity, loss accounting and ending of one global rank."""

    __slots__ = (
        "rank", "node", "host", "local_rank", "pid", "joined_at", "last_seen", "connected",
        "closed_at", "connections", "bye", "received", "gaps", "duplicates", "client_dropped",
        "next_seq", "last_step", "first_t_end", "last_t_end", "phases", "_phase_items",
        "mem_count", "mem_sum", "mem_max", "outside_sum", "outside_n", "series", "tail",
        "tail_n", "events", "event_count", "sketched",
    )

    def __init__(self, rank: int) -> None:
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
        self.bye: Optional[dict[str, Any]] = None
        self.received = 0  # unique records ingested
        self.gaps = 0  # records skipped in seq (never received)
        self.duplicates = 0  # records received twice (a batch resent after a reconnect)
        self.client_dropped = 0  # the client's own cumulative drop count
        self.next_seq = 0
        self.last_step = -1
        self.first_t_end: Optional[int] = None
        self.last_t_end: Optional[int] = None
        self.phases = {name: PhaseStats() for name in DURATION_COLUMNS}
        self._phase_items = tuple(self.phases.items())
        self.mem_count = 0
        self.mem_sum = 0
        self.mem_max = -1
        #: time between the end of one traced step and the end of the next one's step_ns window
        self.outside_sum = 0
        self.outside_n = 0
        self.series = Series()
        self.tail: deque = deque()
        self.tail_n = 0
        self.events: deque = deque(maxlen=8)
        self.event_count = 0
        self.sketched = 0  # records that fed the sketches (weighted), vs received

    # --- the hot path --------------------------------------------------------------------------
    def ingest_steps(self, msg: dict[str, Any], cap: int) -> int:
        """Ingest one ``steps`` frame; returns the number of new records. Raises ProtocolError
        (the connection is then closed) on any malformed content, before changing any state."""
        seq = msg["seq"]
        n = msg["n"]
        cols = msg["cols"]
        dropped = msg.get("dropped", 0)
        if type(seq) is not int or type(n) is not int or type(dropped) is not int or seq < 0 or n < 0:
            raise ProtocolError("steps: seq, n and dropped must be non-negative integers")
        if type(cols) is not dict:
            raise ProtocolError("steps: cols must be a map")
        try:
            for name in STEP_COLUMNS:
                col = cols[name]
                if type(col) is not list or len(col) != n:
                    raise ProtocolError(f"steps: column {name!r} is not a list of {n} values")
        except KeyError as exc:
            raise ProtocolError(f"steps: missing column {exc}") from None
        if dropped > self.client_dropped:
            self.client_dropped = dropped
        if n == 0:
            return 0
        expected = self.next_seq
        skip = 0
        if seq < expected:  # overlap with what we already have: a resend after reconnecting
            skip = expected - seq
            if skip >= n:
                self.duplicates += n
                return 0
            cols = {k: v[skip:] for k, v in cols.items() if k in STEP_COLUMNS}
            seq += skip
            n -= skip
        gap = seq - expected

        # compute everything first (any TypeError/OverflowError = malformed; no state touched)
        steps_col = cols["step"]
        t_end = cols["t_end_ns"]
        last_step = steps_col[-1]
        t_first = t_end[0]
        t_last = t_end[-1]
        if type(last_step) is not int or type(t_first) is not int or type(t_last) is not int:
            raise ProtocolError("steps: step and t_end_ns must be integers")
        stride = 1 if n <= cap else -(-n // cap)
        off = (seq * 2654435761) % stride if stride > 1 else 0  # varies per batch: no aliasing
        updates = []
        for name, ph in self._phase_items:
            col = cols[name]
            mx = max(col)
            if mx < 0:
                updates.append((ph, None, n, 0, 0, 0, None))
                continue
            sample = col if stride == 1 else col[off::stride]
            mn = min(sample)
            unmeasured = 0
            if mn < 0:  # some records not measured: filter exactly (rare; not the fast path)
                col = [v for v in col if v >= 0]
                unmeasured = n - len(col)
                sample = col if stride == 1 else col[off % len(col)::stride] or col
                mn = min(sample)
            s = sum(col)
            if type(s) is not int:
                raise ProtocolError(f"steps: column {name!r} holds non-integers")
            updates.append((ph, column_keys(sample), unmeasured, s, mx, mn, col))
        mem = cols["mem_peak"]
        mem_max = max(mem)
        mem_sum = 0
        mem_n = 0
        if mem_max >= 0:
            mvals = mem if min(mem) >= 0 else [v for v in mem if v >= 0]
            mem_sum = sum(mvals)
            mem_n = len(mvals)
            if type(mem_sum) is not int:
                raise ProtocolError("steps: mem_peak holds non-integers")

        # --- apply -------------------------------------------------------------------------------
        self.gaps += gap if gap > 0 else 0
        self.duplicates += skip
        self.next_seq = seq + n
        self.received += n
        self.last_step = last_step
        warm = WARMUP_STEPS - seq if seq < WARMUP_STEPS else 0
        if warm > n:
            warm = n
        step_ph = self._phase_items[0][1]
        step_sum = step_cnt = 0
        step_max = step_first = -1
        for ph, keys, unmeasured, s, mx, mn, col in updates:
            if keys is None:
                ph.unmeasured += unmeasured
                continue
            ph.unmeasured += unmeasured
            ph.count += len(col)
            ph.sum += s
            if mx > ph.max:
                ph.max = mx
            if ph.min < 0 or mn < ph.min:
                ph.min = mn
            ph.sketch.add_keys(keys, stride)
            if ph is step_ph:
                step_sum, step_max, step_first, step_cnt = s, mx, col[0], len(col)
        if warm:
            for name, ph in self._phase_items:
                wv = [v for v in cols[name][:warm] if v >= 0]
                ph.warm_count += len(wv)
                ph.warm_sum += sum(wv)
        self.sketched += stride * len(updates[0][1]) if updates[0][1] is not None else 0
        if mem_n:
            self.mem_count += mem_n
            self.mem_sum += mem_sum
            if mem_max > self.mem_max:
                self.mem_max = mem_max
        # time outside trace_step: wall time between step ends minus the steps' own time
        if step_max >= 0 and updates[0][2] == 0:
            outside = (t_last - t_first) - (step_sum - step_first)
            intervals = n - 1
            if gap == 0 and skip == 0 and self.last_t_end is not None:
                outside += t_first - self.last_t_end - step_first
                intervals += 1
            self.outside_sum += outside
            self.outside_n += intervals
        if self.first_t_end is None:
            self.first_t_end = t_first
        self.last_t_end = t_last
        self.series.add(seq, cols["step_ns"], mem, step_sum, step_cnt, step_max, mem_max)
        # raw tail for live views: keep references to whole batches, trimmed by record count
        if n > TAIL_RECORDS:
            cols = {k: v[-TAIL_RECORDS:] for k, v in cols.items()}
            seq += n - TAIL_RECORDS
            n = TAIL_RECORDS
        self.tail.append((seq, n, cols))
        self.tail_n += n
        while self.tail_n - self.tail[0][1] >= TAIL_RECORDS:
            self.tail_n -= self.tail.popleft()[1]
        return n

    # --- other frames -----------------------------------------------------------------------
    def note_event(self, kind: str, text: str, ts: float) -> None:
        self.event_count += 1
        self.events.append({"kind": kind[:64], "text": text[:2000], "ts": ts})

    def tail_records(self) -> list[dict[str, int]]:
        """The last records (oldest first) as dicts, for live views."""
        out: list[dict[str, int]] = []
        for seq, n, cols in self.tail:
            for i in range(n):
                rec = {k: cols[k][i] for k in STEP_COLUMNS if k in cols}
                rec["seq"] = seq + i
                out.append(rec)
        return out[-TAIL_RECORDS:]

    def to_data(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "node": self.node, "host": self.host, "local_rank": self.local_rank,
            "pid": self.pid, "joined_at": self.joined_at, "last_seen": self.last_seen,
            "connected": self.connected, "closed_at": self.closed_at,
            "connections": self.connections, "bye": self.bye, "received": self.received,
            "gaps": self.gaps, "duplicates": self.duplicates, "client_dropped": self.client_dropped,
            "next_seq": self.next_seq, "last_step": self.last_step,
            "first_t_end": self.first_t_end, "last_t_end": self.last_t_end,
            "phases": {name: ph.to_data() for name, ph in self._phase_items},
            "mem": {"count": self.mem_count, "sum": self.mem_sum, "max": self.mem_max},
            "outside": {"sum": self.outside_sum, "count": self.outside_n},
            "series": self.series.to_data(),
            "events": list(self.events), "event_count": self.event_count,
            "sketched": self.sketched,
        }
