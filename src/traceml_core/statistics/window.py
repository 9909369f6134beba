"""One mergeable value for the statistics of one rank's step records: :class:`WindowStats`.

Why one value: node 0 must keep per-rank statistics of every rank for the whole run while its
cost grows with nodes, not with steps x ranks. So the statistics of a window of records are
computed once, where the records are (a node's relay, :meth:`WindowStats.of_columns`), and from
then on only *merged*: a group relay merges a rank's consecutive windows, node 0 merges each
window into the rank's running value, a restarted aggregator merges its checkpoint's value with
its own, and the summary merges ranks' sketches. It is a monoid: an empty value is the identity,
and ``a.merge(b)`` (``b``'s records after ``a``'s) gives what :meth:`of_columns` gives for
``a``'s and ``b``'s records together: counts, sums, extremes, the warm-up split, the time
outside ``trace_step`` and the per-step-bucket series exactly, the quantile sketch up to its
systematic sample (at most :data:`SKETCH_CAP` records per phase and window, each standing for
``stride`` records).

What it holds, per duration column (``step_ns``, ``forward_ns``, ...): measured records, their
sum, max and min, the warm-up steps' count and sum (records with ``seq`` < :data:`WARMUP_STEPS`,
left out of steady means), the records where it was not measured, and a quantile sketch; per
peak column (memory): count, sum, max; per sum column (communication totals): count, sum, max
and the warm-up split; the time between one step's end and the next one's start (only between
consecutive records whose step time was measured); the per-step-bucket :class:`~.series.Series`.

The field list below is the one definition of the value's layout: the fixed fields are one
vector ``v`` in sections by how they merge (:data:`FIELDS`: head, added counts, added sums,
maxima, minima), so a merge is a few C-level passes however many columns there are; the ``fold``
frame carries exactly that vector as int64s (:meth:`to_wire`), and its validator is
:meth:`WindowStats.from_wire`, which checks every rule of the value (counts within the window's
records, ranges, the series rows' alignment, the sketches' buckets) once, where the frame enters
node 0. Sketches travel as their sampled keys (a node relay's window) or counted (a group relay's
merged windows: node 0 then adds each phase's buckets as one integer, ``sketch.QuantileSketch``).

Bounds: a window travels as int64s, every field in -1..:data:`MAX_VALUE` (2**62); a window whose
sums would pass it is refused (:meth:`of_columns` raises ValueError) and its relay sends the
records in smaller windows (every value is bounded at the trust boundary, so one record always
fits). A rank's running value (node 0's) keeps its fixed fields as Python integers, so its sums
are exact however long the run (a checkpoint stores integers past 64 bits exactly,
``traceml_core.rundir``). Only the time outside the steps is signed.
"""

from __future__ import annotations

import sys
from array import array
from heapq import nlargest
from operator import add, itemgetter, sub
from typing import Any, Optional, Sequence

from .columns import DURATION_COLUMNS, PEAK_COLUMNS, SUM_COLUMNS
from .series import (
    BUCKETS, MAX_ROWS, R, R_MEM_MAX, R_OUT_CNT, R_PHASE_CNT, R_PHASE_SUM, R_STEP_CNT, R_STEP_MAX,
    R_STEP_SUM, R_T_END, ROW, ROW_COUNTS, SERIES_PHASES, SPAN, Series, series_width,
)
from .sketch import QuantileSketch, bucket_value, column_keys

#: The first steps of each rank are left out of the "steady" means the verdicts use: CUDA context
#: creation, cuDNN autotuning, allocator growth, DataLoader worker start-up and torch.compile all
#: land there and can be 10-1000x a normal step. Five covers the usual eager-mode warm-up.
WARMUP_STEPS = 5
#: a window's sketch gets at most this many records per phase (a systematic sample, weighted)
SKETCH_CAP = 16
#: ... and its time between steps, besides that sample, its longest gaps exactly: a pause every
#: k steps is a few long gaps among many short ones, which a systematic sample misses or aliases
GAP_EXACT = 8
#: every field of a window is at most this (2**62 ns is 146 years; 2**62 bytes is 4 EiB)
MAX_VALUE = 1 << 62
#: records one window may hold (a relay merges at most 32,768)
MAX_RECORDS = 1 << 20

assert PEAK_COLUMNS == ("mem_peak",), "the plain data calls the one peak column 'mem'"
#: the time between one traced step's end and the next one's start: sketched like a duration
#: column (its distribution tells pauses every k steps from time spread over every step, at any
#: window or bucket width), summed apart (signed)
OUTSIDE = "outside"
#: what the sketches are of, in order: every duration column, then the time between steps
SKETCHED_COLUMNS = (*DURATION_COLUMNS, OUTSIDE)
#: the gaps' sketch has 1/4-octave buckets (``QuantileSketch.shift``): their range is wide (0.1 ms
#: typical, pauses of seconds; 1/64-octave lanes over it cost ~6 KB per rank, +60 % of node 0's
#: checkpoint at 65,536 ranks) and the pause rule needs their shape, not exact quantiles
GAP_SHIFT = 4


def _sketches() -> list[QuantileSketch]:
    """An empty sketch per sketched column, each at its resolution."""
    return [QuantileSketch() for _ in DURATION_COLUMNS] + [QuantileSketch(GAP_SHIFT)]

# --- the field list ------------------------------------------------------------------------------
#: (name, rule) of each fixed field, in ``v``'s order. Rules: ``head`` (position in the run: the
#: merge keeps the first window's first and the last window's last), ``count`` (added; at most
#: the records), ``sum`` (added), ``max``, ``min`` (-1: none)
_D, _P, _S = DURATION_COLUMNS, PEAK_COLUMNS, SUM_COLUMNS
FIELDS: tuple[tuple[str, str], ...] = (
    # last_step: the user's step index of the last record; t_first/t_last: the first and last
    # record's end (wall clock, ns); step_first: the first record's step time (-1: not
    # measured), which the interval before it needs; weight: records each sketch key stands for
    # (a window's; 0 once windows of different weights were merged)
    *((f, "head") for f in ("last_step", "t_first", "t_last", "step_first", "weight")),
    ("records", "count"),
    *((f"{c}.{f}", "count") for c in _D for f in ("count", "warm_count", "unmeasured", "nkeys")),
    *((f"{c}.count", "count") for c in _P),
    *((f"{c}.{f}", "count") for c in _S for f in ("count", "warm_count")),
    # the gaps' keys: nkeys in all, the last ``exact`` of them standing for one gap each
    ("outside.count", "count"), ("outside.nkeys", "count"), ("outside.exact", "count"),
    *((f"{c}.{f}", "sum") for c in _D for f in ("sum", "warm_sum")),
    *((f"{c}.sum", "sum") for c in _P),
    *((f"{c}.{f}", "sum") for c in _S for f in ("sum", "warm_sum")),
    ("sketched", "sum"),    # records the sketches stand for (keys x weight), vs received
    *((f"{c}.max", "max") for c in (*_D, *_P, *_S)),
    *((f"{c}.min", "min") for c in _D),
)
NAMES = tuple(f for f, _ in FIELDS)
AT = {f: i for i, f in enumerate(NAMES)}
_RULES = [r for _, r in FIELDS]
assert _RULES == sorted(_RULES, key=("head", "count", "sum", "max", "min").index), "sections in order"
COUNT0, SUM0, MAX0, MIN0 = (_RULES.index(r) for r in ("count", "sum", "max", "min"))
#: fixed fields; then, for the series: its sub-bucket width g, first sub-bucket b0, rows k (k is
#: 0 on the wire when the window lies in one sub-bucket: that row would repeat the totals), then
#: the k rows (series.ROW each)
FIXED = len(FIELDS)
S_G, S_B0, S_K = FIXED, FIXED + 1, FIXED + 2
ROWS0 = FIXED + 3

H_LAST_STEP, H_T_FIRST, H_T_LAST, H_STEP_FIRST, H_WEIGHT = range(5)
RECORDS, SKETCHED, OUT_CNT = AT["records"], AT["sketched"], AT["outside.count"]
STEP_COUNT = AT["step_ns.count"]
#: per duration column: where its fields are
_PH = [{f: AT[f"{c}.{f}"] for f in ("count", "sum", "max", "min", "warm_count", "warm_sum",
                                      "unmeasured", "nkeys")} for c in _D]
_PH_COUNT = [p["count"] for p in _PH]
_PH_UNMEASURED = [p["unmeasured"] for p in _PH]
_PH_NKEYS = [p["nkeys"] for p in _PH]
_counts_of = itemgetter(*_PH_COUNT)
_unmeasured_of = itemgetter(*_PH_UNMEASURED)
#: the sketched values: each duration column's, then the time between steps' (:data:`SKETCHED_COLUMNS`)
_nkeys_of = itemgetter(*_PH_NKEYS, AT["outside.nkeys"])
OUT_NKEYS, OUT_EXACT = AT["outside.nkeys"], AT["outside.exact"]
#: a window's one series row, read off its totals (the row left out of the wire when k is 0)
_ROW_FROM_V = [0] * R
_ROW_FROM_V[R_STEP_CNT] = AT["step_ns.count"]
_ROW_FROM_V[R_STEP_SUM] = AT["step_ns.sum"]
_ROW_FROM_V[R_STEP_MAX] = AT["step_ns.max"]
_ROW_FROM_V[R_MEM_MAX] = AT["mem_peak.max"]
_ROW_FROM_V[R_T_END] = H_T_LAST
_ROW_FROM_V[R_OUT_CNT] = OUT_CNT
for _i, _p in enumerate(SERIES_PHASES):
    _ROW_FROM_V[R_PHASE_CNT + _i] = AT[f"{_p}.count"]
    _ROW_FROM_V[R_PHASE_SUM + _i] = AT[f"{_p}.sum"]
_row_of = itemgetter(*_ROW_FROM_V)
#: an empty value's fixed fields
_EMPTY = [-1, -1, -1, -1, 0] + [0] * (MAX0 - COUNT0) + [-1] * (FIXED - MAX0)


def fold_len(k: int) -> int:
    """Length of a window's ``v`` on the wire with ``k`` series rows."""
    return ROWS0 + k * R


def _min_measured(a: int, b: int) -> int:
    return b if a < 0 else a if b < 0 or a < b else b


class WindowStats:
    """The statistics of records ``seq..end-1`` of one rank (see the module docstring).

    A window's sketch is its sampled keys (``keys``, phase after phase, ``nkeys`` each, each
    standing for ``weight`` records), as they travel; merged into a rank's running value they are
    counted into one :class:`~.sketch.QuantileSketch` per duration column (``sketches``)."""

    __slots__ = ("seq", "end", "v", "outside", "keys", "dense", "sketches", "series", "travels")

    def __init__(self, seq: int = 0) -> None:
        self.seq = seq
        self.end = seq
        #: a window that travels (a relay's): its series rows stay within what a fold frame
        #: carries; a rank's running value (node 0's) is not one
        self.travels = True
        #: the fixed fields (FIELDS), Python integers: a running value's sums are exact
        self.v: list[int] = list(_EMPTY)
        #: time outside trace_step over the records (signed: a clock step can make it negative)
        self.outside = 0
        self.keys: Optional[array] = array("H")
        #: a window's counted sketches as they came from the wire: per phase (lo, buckets, zeros,
        #: negatives), and the buckets' counts as little-endian uint64 bytes (a group relay's)
        self.dense: Optional[tuple[array, bytes]] = None
        self.sketches: Optional[list[QuantileSketch]] = None
        self.series = Series()

    @classmethod
    def running(cls, buckets: int = BUCKETS) -> "WindowStats":
        """An empty running value (a rank's, at node 0): windows merged into it have their keys
        counted into its sketches; its series keeps at most ``buckets`` buckets."""
        st = cls()
        st.keys, st.sketches = None, _sketches()
        st.series.limit = buckets
        st.travels = False
        return st

    # --- reading -------------------------------------------------------------------------------
    @property
    def records(self) -> int:
        return self.v[RECORDS]

    def field(self, name: str) -> int:
        return self.v[AT[name]]

    def sketch(self, column: str) -> QuantileSketch:
        """The quantile sketch of a duration column or of ``outside`` (a running value's)."""
        self.count_sketches()
        assert self.sketches is not None
        return self.sketches[SKETCHED_COLUMNS.index(column)]

    def median(self, column: str) -> Optional[float]:
        """The median of a duration column's measured records (its sketch's, within 0.78 %, kept
        within the records' exact extremes: steps of one length give that length); None when
        none was measured."""
        i = _D.index(column)
        at, v, keys = _PH[i], self.v, self.keys
        if not v[at["count"]]:
            return None
        if self.sketches is None and keys is not None and v[H_WEIGHT] == 1:
            # a window's keys, one per record: the middle one (as its sketch would count it)
            pos = sum(v[p["nkeys"]] for p in _PH[:i])
            mid = sorted(keys[pos:pos + v[at["nkeys"]]])[(v[at["nkeys"]] - 1) // 2]
            est: Optional[float] = bucket_value(mid >> 1) if mid else 0.0
        else:
            est = self.sketch(column).quantiles((0.5,))[0]
        return None if est is None else min(max(est, float(v[at["min"]])), float(v[at["max"]]))

    # --- from records ----------------------------------------------------------------------------
    @classmethod
    def of_columns(cls, seq: int, cols: dict[str, Sequence[int]], cap: int = SKETCH_CAP) -> "WindowStats":
        """The statistics of ``n`` contiguous records from ``seq`` (validated columns: lists of
        ``n`` integers in -1..MAX_VALUE). Cost: C-level passes over each column and each series
        row's slice, never a Python statement per record (but where a column is partly
        unmeasured, which is rare)."""
        t_end, steps = cols["t_end_ns"], cols["step_ns"]
        n = len(t_end)
        if not n:
            return cls(seq)
        g = series_width(seq, n)
        b0 = seq // g
        k = (seq + n - 1) // g - b0 + 1
        bounds = [(max(b * g - seq, 0), min((b + 1) * g - seq, n)) for b in range(b0, b0 + k)]
        if n <= cap:
            stride, off = 1, 0
        else:
            stride = -(-n // cap)
            off = (seq * 2654435761) % stride  # varies per window, so no aliasing with periods
        warm = WARMUP_STEPS - seq  # records of this window in the warm-up (if > 0)
        v = list(_EMPTY)
        v[H_LAST_STEP], v[H_T_FIRST], v[H_T_LAST], v[H_STEP_FIRST] = cols["step"][-1], t_end[0], t_end[-1], steps[0]
        v[RECORDS] = n
        rows = [[0] * k for _ in ROW]  # rows[f][i]: field f of row i
        rows[R_STEP_MAX] = [-1] * k
        rows[R_MEM_MAX] = [-1] * k
        rows[R_T_END] = [t_end[hi - 1] for _lo, hi in bounds]
        keys: list[int] = []
        sampled = 0
        gaps: list[int] = []
        for name, at in zip(_D, _PH):
            col = cols[name]
            mx = max(col)
            if mx < 0:
                v[at["unmeasured"]] = n
                continue
            every = min(col) >= 0
            measured = col if every else [x for x in col if x >= 0]
            sample = measured if stride == 1 else (
                col[off::stride] if every else (measured[off % len(measured)::stride] or measured))
            wv = (col[:warm] if every else [x for x in col[:warm] if x >= 0]) if warm > 0 else ()
            v[at["count"]], v[at["sum"]], v[at["max"]], v[at["min"]] = len(measured), sum(measured), mx, min(measured)
            v[at["warm_count"]], v[at["warm_sum"]] = len(wv), sum(wv)
            v[at["unmeasured"]], v[at["nkeys"]] = n - len(measured), len(sample)
            keys += sample
            if name == "step_ns":
                sampled = len(sample)
                sums, cnts, maxs = rows[R_STEP_SUM], rows[R_STEP_CNT], rows[R_STEP_MAX]
            else:
                i = SERIES_PHASES.index(name)
                sums, cnts, maxs = rows[R_PHASE_SUM + i], rows[R_PHASE_CNT + i], None
            for i, (lo, hi) in enumerate(bounds):
                part = col[lo:hi] if every else [x for x in col[lo:hi] if x >= 0]
                if part:
                    sums[i] = sum(part)
                    cnts[i] = len(part)
                    if maxs is not None:
                        maxs[i] = max(part)
        v[H_WEIGHT] = stride
        v[SKETCHED] = sampled * stride
        for name in _P:
            col = cols[name]
            mx = max(col)
            v[AT[f"{name}.max"]] = mx
            if mx >= 0:
                measured = col if min(col) >= 0 else [x for x in col if x >= 0]
                v[AT[f"{name}.count"]], v[AT[f"{name}.sum"]] = len(measured), sum(measured)
                rows[R_MEM_MAX] = [max(col[lo:hi]) for lo, hi in bounds]
        for name in _S:
            col = cols[name]
            mx = max(col)
            v[AT[f"{name}.max"]] = mx
            if mx < 0:
                continue
            measured = col if min(col) >= 0 else [x for x in col if x >= 0]
            wv = [x for x in col[:warm] if x >= 0] if warm > 0 else ()
            v[AT[f"{name}.count"]], v[AT[f"{name}.sum"]] = len(measured), sum(measured)
            v[AT[f"{name}.warm_count"]], v[AT[f"{name}.warm_sum"]] = len(wv), sum(wv)
        # outside trace_step: from one record's end to the next one's, less the next one's step
        outs = [0] * k
        out_cnt = rows[R_OUT_CNT]
        if min(steps) >= 0:
            outside = (t_end[-1] - t_end[0]) - (sum(steps) - steps[0])
            v[OUT_CNT] = n - 1
            gaps = list(map(sub, map(sub, t_end[1:], t_end[:-1]), steps[1:]))  # C-level
            for i, (lo, hi) in enumerate(bounds):
                if lo == 0:
                    outs[i] = (t_end[hi - 1] - t_end[0]) - sum(steps[1:hi])
                    out_cnt[i] = hi - 1
                else:
                    outs[i] = (t_end[hi - 1] - t_end[lo - 1]) - sum(steps[lo:hi])
                    out_cnt[i] = hi - lo
        else:  # some step times not measured (rare): record by record
            some = [(t_end[j] - t_end[j - 1] - steps[j]) if steps[j] >= 0 else None for j in range(1, n)]
            outside = sum(x for x in some if x is not None)
            v[OUT_CNT] = sum(1 for x in some if x is not None)
            for i, (lo, hi) in enumerate(bounds):
                part = [x for x in some[max(lo, 1) - 1:hi - 1] if x is not None]
                outs[i], out_cnt[i] = sum(part), len(part)
            gaps = [x for x in some if x is not None]
        # the steady gaps' sketch keys (those after the warm-up steps, whose first intervals hold
        # one-off set-up; a negative gap, from a clock step, counts as not measured)
        if warm > 1:
            gaps = gaps[warm - 1:]
        if gaps:
            if stride == 1:
                gs = gaps
            else:  # the longest gaps exactly (weight 1, last), a sample of the others (weight stride)
                top = nlargest(min(GAP_EXACT, len(gaps)), range(len(gaps)), key=gaps.__getitem__)
                rest = list(gaps)
                for i in sorted(top, reverse=True):
                    del rest[i]
                gs = rest[off::stride] + [gaps[i] for i in top]
                v[OUT_EXACT] = len(top)
            v[OUT_NKEYS] = len(gs)
            keys += gs
        st = cls(seq)
        st.end = seq + n
        flat = [x for row in zip(*rows) for x in row]
        if max(v) > MAX_VALUE or max(flat) > MAX_VALUE or abs(outside) > MAX_VALUE \
                or max(map(abs, outs)) > MAX_VALUE:
            # sums of values near their bound (valid one by one): the caller cuts the window
            raise ValueError(f"the sums of these {n} records do not fit a window (at most 2**62)")
        st.v = v
        st.outside = outside
        st.keys = array("H", column_keys(keys)) if keys else array("H")
        st.series = Series.of_rows(g, b0, array("q", flat), outs)
        return st

    # --- the merge -----------------------------------------------------------------------------
    def merge(self, other: "WindowStats") -> "WindowStats":
        """Add ``other``, whose records come after this value's (a later window of the rank, or
        the value a restarted aggregator built after its checkpoint's); returns self. ``other``
        is left alone (its arrays may be shared until it is dropped).

        Keys in flight stay keys when both sides hold keys of the same weight (a group relay
        merging a rank's windows); otherwise they are counted into the sketches."""
        ov = other.v
        if not ov[RECORDS]:
            return self
        v = self.v
        window = self.keys is not None and other.keys is not None and (
            not v[RECORDS] or v[H_WEIGHT] == ov[H_WEIGHT])
        if not window:
            self.count_sketches()  # (before the key counts below change)
        if not v[RECORDS]:
            self.seq, self.end = other.seq, other.end
            self.v = list(ov)
            self.outside = other.outside
            if window:
                self.keys = other.keys
            else:
                self.v[H_WEIGHT] = 0
                self._add_sketches(other)
            self.series.merge(other.series)
            return self
        # the interval between the two values, when they touch and the later one's first step
        # time was measured: counted once, in the bucket of the later one's first record
        extra = None
        if other.seq == self.end and ov[H_STEP_FIRST] >= 0 and v[H_T_LAST] >= 0:
            extra = ov[H_T_FIRST] - v[H_T_LAST] - ov[H_STEP_FIRST]
        if window:
            keys = _interleave(self, other)
        v[COUNT0:MAX0] = map(add, v[COUNT0:MAX0], ov[COUNT0:MAX0])  # C-level, exact
        v[MAX0:MIN0] = map(max, v[MAX0:MIN0], ov[MAX0:MIN0])
        v[MIN0:FIXED] = map(_min_measured, v[MIN0:FIXED], ov[MIN0:FIXED])
        v[H_LAST_STEP], v[H_T_LAST] = ov[H_LAST_STEP], ov[H_T_LAST]
        if v[H_T_FIRST] < 0:
            v[H_T_FIRST] = ov[H_T_FIRST]
        self.outside += other.outside + (extra or 0)
        if extra is not None:
            v[OUT_CNT] += 1
        width = None
        if self.travels:  # a window's rows stay few: at most SPAN buckets (what the wire allows)
            width = series_width(self.seq, other.end - self.seq, max(self.series.width, other.series.width))
        if window:
            self.keys = keys
        else:
            v[H_WEIGHT] = 0
            self._add_sketches(other)
        if extra is not None and other.seq >= WARMUP_STEPS:
            self._sketch_gap(extra)
        if self.end < other.end:
            self.end = other.end
        self.series.merge(other.series, width, extra, other.seq)
        return self

    def _sketch_gap(self, gap: int) -> None:
        """Sketch the gap between two merged values, exactly (weight 1): a pause between steps
        often falls there, since a rank flushes its records while it pauses. Keys in flight take
        it as one more exact key (the gaps' segment is last, its exact keys at its end), so every
        route to node 0 counts the same gaps with the same weights."""
        if self.sketches is None and self.keys is not None:
            self.keys.extend(column_keys([gap]))
            self.v[OUT_NKEYS] += 1
            self.v[OUT_EXACT] += 1
            return
        assert self.sketches is not None
        self.sketches[-1].add_keys(column_keys([gap]))

    def joins(self, other: "WindowStats") -> bool:
        """Whether ``other`` continues this window as one window (what a group relay merges
        before forwarding): its next records, the whole within one window's bounds (its records,
        and sums that still travel as int64s)."""
        if not (self.travels and other.seq == self.end and other.end - self.seq <= MAX_RECORDS):
            return False
        # (a row's sums are at most the window's: they fit when these do)
        return max(map(add, self.v[SUM0:MAX0], other.v[SUM0:MAX0])) <= MAX_VALUE \
            and abs(self.outside + other.outside) <= MAX_VALUE // 2

    def count_sketches(self) -> None:
        """From keys in flight (or a window's counted buckets) to sketches (when merged with a
        value of another weight, into a rank's running value, or before a group relay forwards
        the window)."""
        if self.sketches is not None:
            return
        self.sketches = _sketches()
        self._add_sketches(self)
        self.keys = self.dense = None

    def _add_sketches(self, other: "WindowStats") -> None:
        sks = self.sketches
        assert sks is not None
        if other.sketches is not None and other is not self:
            for a, b in zip(sks, other.sketches):
                a.merge(b)
            return
        if other.dense is not None:
            heads, counts = other.dense
            pos = 0
            for p, sk in enumerate(sks):
                lo, k, zero, neg = heads[4 * p:4 * p + 4]
                if k or zero or neg:
                    sk.add_dense(lo, counts[pos:pos + 8 * k], zero, neg)
                    pos += 8 * k
            return
        keys, weight, pos = other.keys, other.v[H_WEIGHT] or 1, 0
        assert keys is not None
        nkeys = _nkeys_of(other.v)
        for sk, m in zip(self.sketches[:-1], nkeys):
            if m:
                sk.add_keys(keys[pos:pos + m], weight)
                pos += m
        # the gaps': a sample standing for ``weight`` gaps each, then the exact keys, one each
        exact = other.v[OUT_EXACT]
        m = nkeys[-1]
        if m > exact:
            self.sketches[-1].add_keys(keys[pos:pos + m - exact], weight)
        if exact:
            self.sketches[-1].add_keys(keys[pos + m - exact:pos + m], 1)

    # --- the wire (the ``fold`` frame) -----------------------------------------------------------
    def to_wire(self) -> dict[str, bytes]:
        """A window's fields of a ``fold`` frame: ``v`` (packed little-endian int64s: the fixed
        fields, the series head and rows), ``o`` (int64s: the outside time, then each row's),
        and its sketches: ``keys`` (uint16s, phase after phase, ``nkeys`` each) while they are
        keys in flight, else counted (a group relay's merged windows): ``sk`` (int64s: per phase
        the first bucket, the number of buckets, zeros, negatives) and ``sc`` (uint64s: the
        buckets' counts, phase after phase: node 0 adds them as one integer each)."""
        s = self.series
        k = s.used
        v = array("q", self.v)  # (a window's fields fit: of_columns and joins see to it)
        v.extend((s.width, s.base, 0 if k == 1 else k))
        o = array("q", [self.outside])
        if k != 1:
            v.extend(s.cells)
            o.extend(s.out_sum)
        out = {"v": _bytes(v), "o": _bytes(o)}
        if self.keys is not None:
            out["keys"] = _bytes(self.keys)
            return out
        if self.dense is not None:
            out["sk"], out["sc"] = _bytes(self.dense[0]), self.dense[1]
            return out
        assert self.sketches is not None
        heads = array("q")
        counts = []
        for sk in self.sketches:
            sk.fold()
            heads.extend((sk.lo, sk.n, sk.zero, sk.negative))
            counts.append(sk.lanes.to_bytes(8 * sk.n, "little"))
        out["sk"], out["sc"] = _bytes(heads), b"".join(counts)
        return out

    @classmethod
    def from_wire(cls, seq: int, n: int, fields: dict[str, Any]) -> "WindowStats":
        """The window a ``fold`` frame carries for records ``seq..seq+n-1``, checked against every
        rule of the value (raises ValueError naming the first one broken): lengths, every field in
        -1..MAX_VALUE, counts within the ``n`` records (each phase's measured and unmeasured
        records making ``n``), sketch keys as counted, the series rows aligned sub-buckets of
        the records. After this node 0 merges it without another check."""
        v, o = fields.get("v"), fields.get("o")
        counted = "sk" in fields
        keys = fields.get("sc" if counted else "keys")
        if type(v) is not bytes or type(o) is not bytes or type(keys) is not bytes \
                or len(v) % 8 or len(o) % 8 or len(keys) % (8 if counted else 2):
            raise ValueError("v, o and the sketches must be packed arrays (bytes)")
        if not 1 <= n <= MAX_RECORDS:
            raise ValueError(f"a window holds 1..{MAX_RECORDS} records")
        va = unpack(v, "q")
        if len(va) < ROWS0 or not in_range(v, va):
            raise ValueError("v must hold integers in -1..2**62")
        oa = unpack(o, "q")
        g, b0, k = va[S_G], va[S_B0], va[S_K]
        if not (0 <= k <= MAX_ROWS and len(va) == fold_len(k) and len(oa) == k + 1):
            raise ValueError("v and o do not have the length of their k series rows")
        if g < 1 or g & (g - 1) or b0 != seq // g or (seq + n - 1) // g != b0 + max(k, 1) - 1 \
                or n > SPAN * g or k == 1:
            raise ValueError("the series rows are not aligned sub-buckets of the records")
        counts, nkeys = (*_counts_of(va), va[OUT_CNT]), _nkeys_of(va)
        if va[RECORDS] != n or max(va[COUNT0:SUM0]) > n or set(map(add, counts, _unmeasured_of(va))) != {n} \
                or min(map(sub, counts, nkeys)) < 0 or va[OUT_CNT] >= n or va[OUT_EXACT] > va[OUT_NKEYS]:
            raise ValueError("counts do not fit the records")
        dense = None
        if counted:
            dense = _counted_of(fields.get("sk"), keys, counts)
            ka = None
            if not 0 <= va[H_WEIGHT] <= n or va[SKETCHED] > 2 * n:
                raise ValueError("the sketches do not fit the records")
        else:
            ka = unpack(keys, "H")
            if len(ka) != sum(nkeys) or not 1 <= va[H_WEIGHT] <= n or va[SKETCHED] != nkeys[0] * va[H_WEIGHT]:
                raise ValueError("sketch keys do not fit the records")
        if k and max(max(va[a:a + len(ROW_COUNTS)]) for a in range(ROWS0, ROWS0 + k * R, R)) > n:
            raise ValueError("a series row counts more records than the window holds")
        st = cls.__new__(cls)
        st.seq, st.end = seq, seq + n
        st.v = va[:FIXED].tolist()
        st.outside = oa[0]
        st.keys, st.dense, st.sketches = ka, dense, None
        st.travels = True
        if k:
            st.series = Series.of_rows(g, b0, va[ROWS0:], oa[1:])
        else:  # the one row is the window's totals
            st.series = Series.of_rows(g, b0, array("q", _row_of(va)), oa[:1])
        return st

    # --- plain data (checkpoints, the summary) ----------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """The plain-data shape of a rank's statistics in ``RunState.to_data`` / checkpoints."""
        self.count_sketches()
        v = self.v
        assert self.sketches is not None
        phases = {}
        for name, at, sk in zip(_D, _PH, self.sketches):
            phases[name] = {"count": v[at["count"]], "sum": v[at["sum"]], "max": v[at["max"]],
                            "min": v[at["min"]], "warm_count": v[at["warm_count"]],
                            "warm_sum": v[at["warm_sum"]], "unmeasured": v[at["unmeasured"]],
                            "sketch": sk.to_data()}
        sums = {name: {"count": v[AT[f"{name}.count"]], "sum": v[AT[f"{name}.sum"]],
                       "max": v[AT[f"{name}.max"]], "warm_count": v[AT[f"{name}.warm_count"]],
                       "warm_sum": v[AT[f"{name}.warm_sum"]]} for name in _S}
        mem = _P[0]
        some = v[RECORDS] > 0
        out: dict[str, Any] = {
            "phases": phases, "sums": sums,
            "mem": {"count": v[AT[f"{mem}.count"]], "sum": v[AT[f"{mem}.sum"]], "max": v[AT[f"{mem}.max"]]},
            "outside": {"sum": self.outside, "count": v[OUT_CNT], "sketch": self.sketches[-1].to_data()},
            "series": self.series.to_data(), "sketched": v[SKETCHED],
            "first_seq": self.seq,
            "first_t_end": v[H_T_FIRST] if some else None, "last_t_end": v[H_T_LAST] if some else None,
            "last_step": v[H_LAST_STEP] if some else -1,
        }
        return out

    @classmethod
    def from_data(cls, d: dict[str, Any], limit: Optional[int] = None) -> "WindowStats":
        """The value :meth:`to_data` wrote (a rank of ``RunState.to_data`` / a checkpoint: its
        ``received`` records up to ``next_seq``); an older checkpoint's missing fields are
        empty."""
        st = cls(int(d.get("first_seq") or 0))
        st.travels = False
        st.end = int(d.get("next_seq") or st.seq)
        v = st.v
        v[RECORDS] = int(d.get("received") or 0)
        if v[RECORDS]:
            v[H_LAST_STEP] = int(d.get("last_step", -1))
            v[H_T_FIRST] = int(d.get("first_t_end") if d.get("first_t_end") is not None else -1)
            v[H_T_LAST] = int(d.get("last_t_end") if d.get("last_t_end") is not None else -1)
        v[H_WEIGHT] = 0
        sks = []
        for name, at in zip(_D, _PH):
            ph = (d.get("phases") or {}).get(name) or {}
            for f in ("count", "sum", "max", "min", "warm_count", "warm_sum", "unmeasured"):
                v[at[f]] = int(ph.get(f, -1 if f in ("max", "min") else 0))
            sks.append(QuantileSketch.from_data(ph["sketch"]) if ph.get("sketch") else QuantileSketch())
        for name in _S:
            s = (d.get("sums") or {}).get(name) or {}
            for f in ("count", "sum", "max", "warm_count", "warm_sum"):
                v[AT[f"{name}.{f}"]] = int(s.get(f, -1 if f == "max" else 0))
        mem = d.get("mem") or {}
        for f in ("count", "sum", "max"):
            v[AT[f"{_P[0]}.{f}"]] = int(mem.get(f, -1 if f == "max" else 0))
        outside = d.get("outside") or {}
        st.outside = int(outside.get("sum", 0))
        v[OUT_CNT] = int(outside.get("count", 0))
        # (a checkpoint before the time between steps was sketched: an empty sketch)
        gap_sk = QuantileSketch.from_data(outside["sketch"]) if outside.get("sketch") else None
        sks.append(gap_sk if gap_sk is not None and gap_sk.shift == GAP_SHIFT else QuantileSketch(GAP_SHIFT))
        v[SKETCHED] = int(d.get("sketched", 0))
        # the step phase's first record is not kept: a checkpoint's value joins what follows it
        # through the interval the later value's first record knows (step_first stays -1 here)
        st.keys, st.sketches = None, sks
        if d.get("series"):
            st.series = Series.from_data(d["series"], **({"limit": limit} if limit else {}))
        elif limit:
            st.series.limit = limit
        return st



def _interleave(first: WindowStats, second: WindowStats) -> array:
    """The keys of two windows of the same weight, phase after phase; in the gaps' segment (the
    last), both samples first, then both windows' exact keys."""
    a, b = first.keys, second.keys
    assert a is not None and b is not None
    out = array("H")
    pa = pb = 0
    for ma, mb in zip(_nkeys_of(first.v), _nkeys_of(second.v)):
        out.extend(a[pa:pa + ma])
        out.extend(b[pb:pb + mb])
        pa += ma
        pb += mb
    ea, eb = first.v[OUT_EXACT], second.v[OUT_EXACT]
    if ea and second.v[OUT_NKEYS] > eb:  # the first one's exact keys after the second one's sample
        ma, mb = first.v[OUT_NKEYS], second.v[OUT_NKEYS]
        start = len(out) - ma - mb
        gaps = out[start:]
        out[start:] = gaps[:ma - ea] + gaps[ma:ma + mb - eb] + gaps[ma - ea:ma] + gaps[ma + mb - eb:]
    return out


def _counted_of(heads: Any, raw: bytes, measured: Sequence[int]) -> tuple[array, bytes]:
    """A window's counted sketches from the wire (``sk``; ``sc``: little-endian uint64 counts),
    checked: buckets within the sketch's range, counts within what the phase's measured records
    can stand for."""
    if type(heads) is not bytes or len(heads) != 32 * len(SKETCHED_COLUMNS):
        raise ValueError("sk must hold lo, buckets, zeros and negatives per phase")
    ha = unpack(heads, "q")
    counts = unpack(raw, "Q")
    if min(ha) < 0 or sum(ha[1::4]) != len(counts):
        raise ValueError("the sketches' buckets do not fit their counts")
    pos = 0
    for p, m in enumerate(measured):
        lo, k, zero, neg = ha[4 * p:4 * p + 4]
        if k and (lo < 1 or lo + k > _KEY6_END or sum(counts[pos:pos + k]) + zero + neg > 2 * m):
            raise ValueError("a sketch holds more than its phase's records, or buckets out of range")
        if zero + neg > 2 * m:
            raise ValueError("a sketch holds more than its phase's records")
        pos += k
    return ha, raw


#: bucket indices of a sketch are below this (the float32's top 15 bits, sign excluded)
_KEY6_END = 1 << 15


def _bytes(a: array) -> bytes:
    """``a`` as packed little-endian bytes."""
    if _SWAP:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


# --- packed arrays ---------------------------------------------------------------------------------
_SWAP = sys.byteorder != "little"


def pack(values: Sequence[int], code: str = "q") -> bytes:
    """``values`` as a packed little-endian array (``q``: int64, ``H``: uint16)."""
    a = array(code, values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def unpack(data: bytes, code: str = "q") -> array:
    """The array :func:`pack` made (raises ValueError when ``data`` is not whole items)."""
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a


#: top bytes (the last of each little-endian int64) of values certainly in 0..MAX_VALUE - 1, and
#: of -1; deleted by :func:`_in_range`, which then decides the rest exactly
_FAST_TOPS = bytes(range(MAX_VALUE >> 56)) + b"\xff"


def in_range(data: bytes, values: Sequence[int]) -> bool:
    """Whether every value is in -1..:data:`MAX_VALUE`; ``values`` is ``data`` unpacked.

    Why not ``min``/``max`` alone: they compare each (large) Python int twice, a third of the
    validation of a window with series rows. The common case is C-level passes over the bytes:
    every top byte below MAX_VALUE's (so 0 <= value < MAX_VALUE) or 0xff (a negative value of at
    least -2**56), and as many 0xff top bytes as values equal to -1 (so every such negative value
    is -1). Anything else (e.g. a value of exactly MAX_VALUE) is decided by ``min``/``max``, so
    the answer is always theirs."""
    tops = data[7::8]
    if not tops.translate(None, _FAST_TOPS) and tops.count(0xFF) == values.count(-1):
        return True
    return not values or (max(values) <= MAX_VALUE and min(values) >= -1)
