"""Everything the aggregator keeps about one rank, and the hot path that ingests a ``steps`` frame.

Memory is bounded by the number of phases, never by the run's length: per phase a handful of
integers and one :class:`~.sketch.QuantileSketch`; one :class:`~.series.Series`; a raw tail of at
most :data:`TAIL_RECORDS` records (live-view modes only; never persisted).

Cost per batch is a fixed number of C-level passes over each column (``max``, ``sum``, and
``array('f')`` + ``_count_elements`` over at most ``sketch_sample_cap`` values), never a Python
statement per record. Exactness: counts, sums (hence means) and maxima use every record; quantiles
come from the sketch (about 0.8 % relative error) fed by a systematic, weighted sample when a batch
holds more than ``sketch_sample_cap`` records; minima are taken over the sketched values.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

from ..rankfacts import RankFacts
from ..report.thresholds import WARMUP_STEPS
from ..wire import fold
from ..wire.frames import MAX_VALUE
from ..wire.protocol import DURATION_COLUMNS, STEP_COLUMNS, SUM_COLUMNS, ProtocolError
from .series import Series
from .sketch import QuantileSketch, column_keys

#: records kept per rank for live views (modes cli and dashboard; none in summary mode)
TAIL_RECORDS = 256
#: pending records that trigger computing the statistics (the server also flushes every second)
FLUSH_RECORDS = 64


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


class SumStats:
    __slots__ = ("count", "sum", "max", "warm_count", "warm_sum")

    def __init__(self) -> None:
        self.count = self.sum = self.warm_count = self.warm_sum = 0
        self.max = -1

    def add(self, seq: int, col: list) -> None:
        """Add one checked batch (records from ``seq``); -1 values (not measured) are left out."""
        if seq < WARMUP_STEPS:
            warm = [v for v in col[:WARMUP_STEPS - seq] if v >= 0]
            self.warm_count += len(warm)
            self.warm_sum += sum(warm)
        if min(col) < 0:
            col = [v for v in col if v >= 0]
        self.count += len(col)
        self.sum += sum(col)
        mx = max(col)
        if mx > self.max:
            self.max = mx

    def to_data(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "max": self.max,
                "warm_count": self.warm_count, "warm_sum": self.warm_sum}


class RankState:
    """Statistics, identity, loss accounting and ending of one global rank."""

    __slots__ = (
        "rank", "node", "host", "local_rank", "pid", "joined_at", "last_seen", "connected",
        "closed_at", "connections", "bye", "received", "gaps", "duplicates", "client_dropped",
        "next_seq", "last_step", "first_t_end", "last_t_end", "phases", "_phase_items",
        "mem_count", "mem_sum", "mem_max", "outside_sum", "outside_n", "series", "tail",
        "tail_n", "tail_keep", "events", "event_count", "sketched", "_step_phase", "rejected",
        "pending", "pending_n", "_proc_next", "_phase_list", "_sum_list", "sketch_cap", "relay_dropped", "relay_seq_end",
        "open_bound", "last_open", "counts", "step_source", "sums", "facts",
    )

    def __init__(self, rank: int, tail_records: int = 0, sketch_cap: int = 16) -> None:
        self.rank = rank
        #: at most this many records of one batch feed the sketches (see AggregatorSettings)
        self.sketch_cap = max(1, sketch_cap)
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
        self.last_step = -1
        self.first_t_end: Optional[int] = None
        self.last_t_end: Optional[int] = None
        self.phases = {name: PhaseStats() for name in DURATION_COLUMNS}
        self._phase_items = tuple(self.phases.items())
        self._phase_list = tuple(self.phases.values())
        self._step_phase = self.phases["step_ns"]
        self.sums = {name: SumStats() for name in SUM_COLUMNS}
        self._sum_list = tuple(self.sums.values())
        self.mem_count = 0
        self.mem_sum = 0
        self.mem_max = -1
        #: time between the end of one traced step and the end of the next one's step_ns window
        self.outside_sum = 0
        self.outside_n = 0
        self.series = Series(DURATION_COLUMNS)
        self.tail: deque = deque()
        self.tail_n = 0
        self.tail_keep = max(0, tail_records)
        self.events: deque = deque(maxlen=8)
        self.event_count = 0
        #: how this rank's steps are found (the latest ``step_source`` event; None: not said,
        #: i.e. a process that called traceml itself without the worker bootstrap)
        self.step_source: Optional[dict[str, Any]] = None
        #: checkpoint spans, progress and declared work (its span/progress/work events)
        self.facts = RankFacts()
        self.sketched = 0  # records that fed the sketches (weighted), vs received
        self.rejected = 0  # records of frames found malformed when their statistics were computed
        self.pending: list = []  # accepted frames whose statistics are not computed yet
        self.pending_n = 0
        self._proc_next = 0  # seq after the last record whose statistics were computed

    # --- the hot path --------------------------------------------------------------------------
    def ingest_steps(self, msg: dict[str, Any]) -> int:
        """Accept one ``steps`` frame; returns the number of new records.

        Only O(1) work happens here (shape checks, sequence accounting); the statistics are
        computed by :meth:`flush` over several frames at once, so their fixed cost per call is
        shared by all frames of a second (the common case at scale: thousands of ranks sending a
        few records ten times a second). Raises ProtocolError for a malformed frame.
        """
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
        if seq < expected:  # overlap with what we already have: a resend after reconnecting
            skip = expected - seq
            if skip >= n:
                self.duplicates += n
                return 0
            cols = {k: cols[k][skip:] for k in STEP_COLUMNS}
            self.duplicates += skip
            seq += skip
            n -= skip
        elif seq > expected:
            self.gaps += seq - expected
            if self.pending:  # keep each pending run contiguous
                self.flush()
        self.next_seq = seq + n
        self.received += n
        self.pending.append((seq, n, cols))
        self.pending_n += n
        if self.pending_n >= FLUSH_RECORDS:
            self.flush()
        return n

    def flush(self) -> int:
        """Compute the statistics of the pending frames; returns how many records were rejected.

        A frame whose content turns out malformed (a string among the numbers, a value out of
        range) is rejected whole: its records leave ``received`` (they count as lost) and the
        caller closes the connection and counts it.
        """
        pending = self.pending
        if not pending:
            return 0
        self.pending = []
        self.pending_n = 0
        if len(pending) == 1:
            runs = pending
        else:
            seq0, total = pending[0][0], 0
            bulk: dict[str, list] = {k: [] for k in STEP_COLUMNS}
            for _, n, cols in pending:
                total += n
                for k in STEP_COLUMNS:
                    bulk[k] += cols[k]
            runs = [(seq0, total, bulk)]
        try:
            self._process(*runs[0])
            return 0
        except (ProtocolError, TypeError, ValueError, OverflowError, IndexError, AttributeError, KeyError):
            pass
        rejected = 0
        for seq, n, cols in pending:  # find the bad frame(s); the others still count
            try:
                self._process(seq, n, cols)
            except (ProtocolError, TypeError, ValueError, OverflowError, IndexError, AttributeError, KeyError):
                rejected += n
                self.received -= n
                self.rejected += n
        return rejected

    def _process(self, seq: int, n: int, cols: dict[str, list]) -> None:
        """Statistics of ``n`` contiguous records from ``seq``: compute all, then apply (a
        malformed value raises before any state changes)."""
        # compute everything first (any TypeError/OverflowError = malformed; no state touched)
        t_end = cols["t_end_ns"]
        last_step = cols["step"][-1]
        t_first = t_end[0]
        t_last = t_end[-1]
        if type(last_step) is not int or type(t_first) is not int or type(t_last) is not int:
            raise ProtocolError("steps: step and t_end_ns must be integers")
        if not (0 <= t_first <= MAX_VALUE and 0 <= t_last <= MAX_VALUE):
            raise ProtocolError("steps: t_end_ns holds a value out of range")
        w = self.series.width
        if seq // w != (seq + n - 1) // w:  # straddles series buckets: each one's end is read
            if type(sum(t_end)) is not int or min(t_end) < 0 or max(t_end) > MAX_VALUE:
                raise ProtocolError("steps: t_end_ns holds a value out of range")
        cap = self.sketch_cap
        if n <= cap:
            stride = 1
            off = 0
        else:
            stride = -(-n // cap)
            off = (seq * 2654435761) % stride  # varies per batch, so no aliasing with periods
        measured = []  # (PhaseStats, col, sketched count, sum, max, min, unmeasured)
        unmeasured_all = []
        flat: list = []
        for name, ph in self._phase_items:
            col = cols[name]
            mx = max(col)
            if mx < 0:
                unmeasured_all.append(ph)
                continue
            if mx > MAX_VALUE:
                raise ProtocolError(f"steps: column {name!r} holds a value out of range")
            total = sum(col)  # over every value: one float anywhere makes it a float
            if type(total) is not int:
                raise ProtocolError(f"steps: column {name!r} holds non-integers")
            sample = col if stride == 1 else col[off::stride]
            mn = min(sample) if stride == 1 else min(col)
            if mn < 0:  # some records not measured: filter exactly (rare; not the fast path)
                col = [v for v in col if v >= 0]
                sample = col if stride == 1 else (col[off % len(col)::stride] or col)
                mn = min(sample)
                total = sum(col)
            elif stride != 1:
                mn = min(sample)
            measured.append((ph, col, len(sample), total, mx, mn, name, cols[name]))
            flat += sample
        keys = column_keys(flat)  # one C conversion for every sketched value of the frame
        mem = cols["mem_peak"]
        mem_max = max(mem)
        mem_sum = mem_n = 0
        if mem_max > MAX_VALUE:
            raise ProtocolError("steps: mem_peak holds a value out of range")
        mem_series = None
        if mem_max >= 0:
            mem_series = mem
            mem_sum = sum(mem)
            if type(mem_sum) is not int:
                raise ProtocolError("steps: mem_peak holds non-integers")
            if min(mem) < 0:
                mem = [v for v in mem if v >= 0]
                mem_sum = sum(mem)
            mem_n = len(mem)

        sums = []
        for name in SUM_COLUMNS:   # checked before anything is applied, like the phases
            col = cols[name]
            mx = max(col)
            if mx >= 0:
                if mx > MAX_VALUE or type(sum(col)) is not int:
                    raise ProtocolError(f"steps: column {name!r} holds a value out of range")
                sums.append((self.sums[name], col))

        # --- apply -------------------------------------------------------------------------------
        for st, col in sums:
            st.add(seq, col)
        contiguous = seq == self._proc_next
        self._proc_next = seq + n
        self.last_step = last_step
        for ph in unmeasured_all:
            ph.unmeasured += n
        pos = 0
        for ph, col, m, total, mx, mn, _name, _orig in measured:
            cnt = len(col)
            ph.count += cnt
            ph.sum += total
            if mx > ph.max:
                ph.max = mx
            if mn < ph.min or ph.min < 0:
                ph.min = mn
            if cnt != n:
                ph.unmeasured += n - cnt
            ph.sketch.add_keys(keys[pos:pos + m], stride)
            pos += m
        if seq < WARMUP_STEPS:
            warm = min(n, WARMUP_STEPS - seq)
            for name, ph in self._phase_items:
                wv = [v for v in cols[name][:warm] if v >= 0]
                ph.warm_count += len(wv)
                ph.warm_sum += sum(wv)
        step_sum = step_cnt = 0
        step_max = -1
        outside_batch = None
        if measured and measured[0][0] is self._step_phase:
            _, col, m, step_sum, step_max, _, _, _ = measured[0]
            step_cnt = len(col)
            self.sketched += m * stride
            # time outside trace_step: wall time between step ends minus the steps' own time
            if step_cnt == n:
                step_first = col[0]
                outside = (t_last - t_first) - (step_sum - step_first)
                intervals = n - 1
                if contiguous and self.last_t_end is not None:
                    outside += t_first - self.last_t_end - step_first
                    intervals += 1
                self.outside_sum += outside
                self.outside_n += intervals
                outside_batch = (outside, intervals)
        if mem_n:
            self.mem_count += mem_n
            self.mem_sum += mem_sum
            if mem_max > self.mem_max:
                self.mem_max = mem_max
        if self.first_t_end is None:
            self.first_t_end = t_first
        self.last_t_end = t_last
        self.series.add(seq, n, measured, mem_series, mem_max, t_end, outside_batch)
        # raw tail for live views (cli/dashboard modes): references to whole batches, trimmed
        # by record count; summary mode keeps none (it is never read, and costs memory per rank)
        keep = self.tail_keep
        if keep:
            if n > keep:
                cols = {k: v[-keep:] for k, v in cols.items()}
                seq += n - keep
                n = keep
            tail = self.tail
            tail.append((seq, n, cols))
            self.tail_n += n
            while self.tail_n - tail[0][1] >= keep:
                self.tail_n -= tail.popleft()[1]

    # --- folded windows (the relays' partial statistics) ---------------------------------------
    def ingest_fold(self, msg: dict[str, Any]) -> int:
        """Add one validated ``fold`` frame (wire/fold.py): the same sequence and loss accounting
        as :meth:`ingest_steps`, then the window's partial statistics, added with a fixed number
        of operations (no per-record work: the relay did that). Returns the new records.

        The caller computes pending ``steps`` frames of this rank first (one rank's frames are
        applied in order). A window that partly overlaps what was received (a relay folds each
        record once, in order, so this does not happen) counts the overlap as duplicates and adds
        the window's statistics whole."""
        seq, n, v = msg["seq"], msg["n"], msg["v"]
        dropped = msg["dropped"]
        if dropped > self.client_dropped:
            self.client_dropped = dropped
        expected = self.next_seq
        skip = 0
        if seq < expected:
            skip = expected - seq
            if skip >= n:
                self.duplicates += n
                return 0
            self.duplicates += skip
        elif seq > expected:
            self.gaps += seq - expected
        self.next_seq = seq + n
        self.received += n - skip
        contiguous = seq == self._proc_next
        self._proc_next = seq + n
        self.last_step = v[fold.H_LAST_STEP]
        t_first, t_last = v[fold.H_T_FIRST], v[fold.H_T_LAST]
        keys = msg["keys"]
        weight = v[fold.H_WEIGHT]
        pos = 0
        i = fold.PHASE0
        for ph in self._phase_list:
            cnt = v[i]
            if cnt:
                ph.count += cnt
                ph.sum += v[i + 1]
                if v[i + 2] > ph.max:
                    ph.max = v[i + 2]
                mn = v[i + 3]
                if mn < ph.min or ph.min < 0:
                    ph.min = mn
                ph.warm_count += v[i + 4]
                ph.warm_sum += v[i + 5]
            ph.unmeasured += n - cnt
            m = v[i + 6]
            if m:
                ph.sketch.add_keys(keys[pos:pos + m], weight)
                pos += m
            i += fold.PW
        if v[fold.PHASE0]:
            self.sketched += v[fold.PHASE0 + fold.P_NKEYS] * weight
        i = fold.MEM0
        if v[i]:
            self.mem_count += v[i]
            self.mem_sum += v[i + 1]
            if v[i + 2] > self.mem_max:
                self.mem_max = v[i + 2]
        i = fold.SUM0
        for st in self._sum_list:
            if v[i]:
                st.count += v[i]
                st.sum += v[i + 1]
                if v[i + 2] > st.max:
                    st.max = v[i + 2]
                st.warm_count += v[i + 3]
                st.warm_sum += v[i + 4]
            i += 5
        extra = None
        out_n = v[fold.H_OUT_N]
        if out_n >= 0:
            o = msg["o"]
            outside = o[0]
            if contiguous and self.last_t_end is not None:
                # the interval from the previous window's last step end to this one's first
                extra = t_first - self.last_t_end - v[fold.H_STEP_FIRST]
                outside += extra
                out_n += 1
            self.outside_sum += outside
            self.outside_n += out_n
        if self.first_t_end is None:
            self.first_t_end = t_first
        self.last_t_end = t_last
        self.series.add_rows(seq, n, v, msg["o"], extra, msg.get("va"), msg.get("oa"))
        return n - skip

    # --- other frames -----------------------------------------------------------------------
    def note_event(self, kind: str, text: str, ts: float) -> None:
        self.event_count += 1
        self.events.append({"kind": kind[:64], "text": text[:2000], "ts": ts})

    def to_data(self) -> dict[str, Any]:
        """Plain data for checkpoints and the summary (pending frames are computed first; a
        rejected one shows in ``rejected``; the server closes such a connection on its next flush)."""
        self.flush()
        return {
            "rank": self.rank, "node": self.node, "host": self.host, "local_rank": self.local_rank,
            "pid": self.pid, "joined_at": self.joined_at, "last_seen": self.last_seen,
            "connected": self.connected, "closed_at": self.closed_at,
            "connections": self.connections, "bye": self.bye, "received": self.received,
            "gaps": self.gaps, "duplicates": self.duplicates, "client_dropped": self.client_dropped,
            "relay_dropped": self.relay_dropped, "relay_seq_end": self.relay_seq_end,
            "open_bound": self.open_bound, "last_open": self.last_open, "counts": self.counts,
            "next_seq": self.next_seq, "last_step": self.last_step,
            "first_t_end": self.first_t_end, "last_t_end": self.last_t_end,
            "phases": {name: ph.to_data() for name, ph in self._phase_items},
            "sums": {name: st.to_data() for name, st in self.sums.items()},
            "mem": {"count": self.mem_count, "sum": self.mem_sum, "max": self.mem_max},
            "outside": {"sum": self.outside_sum, "count": self.outside_n},
            "series": self.series.to_data(),
            "events": list(self.events), "event_count": self.event_count,
            "step_source": self.step_source,
            "sketched": self.sketched, "rejected": self.rejected,
            "facts": self.facts.to_checkpoint(),
        }
