"""Per-rank series over the whole run, in a fixed number of buckets of consecutive steps.

Bucket ``i`` covers record indices (``seq``) ``[i*width, (i+1)*width)``. When a record lands past the
last bucket, neighbouring buckets are merged pairwise and ``width`` doubles, so memory stays at
:data:`BUCKETS` entries per metric however long the run is, and the series always spans it all.
Per bucket: step-time sum, count and max (mean and worst for live views and ``compare``), the
maximum peak memory (its trend is the memory-creep evidence), the last step's wall-clock end
(to put steps on a time axis), and sum + count of every other phase and of the time outside
``trace_step`` (each phase over the run, per rank, for the HTML report, the dashboard and the
exports). Per rank that is ``256 x 8 x 19`` bytes (18 fields and the outside sum): 38 KB, 7 KB
more than separate arrays with 32-bit counts, for the copy below (115 MB at 16,384 ranks).

Storage: one int64 array, bucket after bucket, each bucket the fields of a ``fold`` frame's series
row in their order (wire/fold.py: ``ROW``), plus the outside-step sums apart (signed). Why
bucket-major: at the start of a run the buckets are narrower than a relay's window, so a folded
window carries several rows, and the rows that land in buckets not touched yet are copied into the
array as bytes (one C call) instead of being added field by field (about 20 Python operations a
row: most of node 0's cost at 16,384 ranks early in a run). Sums are int64 nanoseconds (292 years);
values are checked below 2**62 at the trust boundary, so only absurd data can overflow a bucket:
that update is dropped and counted (``overflowed``), never raised.

A batch of records usually falls into one bucket, so the caller passes the batch totals it already
computed; only a batch straddling buckets is sliced (C-level ``sum``/``max`` per slice), and the
width also doubles until a batch spans at most :data:`SPAN` buckets, so a rank with very fast steps
never costs a Python loop per record.
"""

from __future__ import annotations

from array import array
from operator import add
from typing import Any, Optional, Sequence

from ..wire import fold
from ..wire.fold import BUCKETS, SPAN, series_width

#: BUCKETS per series; a batch may straddle at most SPAN buckets (else the width doubles): at the
#: start of a run with fast steps the series is a little coarser, and a batch costs at most SPAN
#: slices. Both are defined with the ``fold`` frame, whose rows follow the same rule.
__all__ = ["BUCKETS", "SPAN", "OUTSIDE", "Series", "series_phases", "series_values"]
#: the extra "phase" for time between traced steps (``outside`` in the summary)
OUTSIDE = "outside"

#: fields per bucket, and where a phase's count and sum are (wire/fold.py: ROW)
R = len(fold.ROW)
_MAX0 = fold.R_MAX0
_CNT_AT = {p: fold.R_PHASE_CNT + i for i, p in enumerate(fold.SERIES_PHASES)}
_SUM_AT = {p: fold.R_PHASE_SUM + i for i, p in enumerate(fold.SERIES_PHASES)}
_CNT_AT[OUTSIDE] = fold.R_OUT_CNT
_QMAX = (1 << 63) - 1
#: an empty bucket: sums and counts 0, maxima -1 (none)
_EMPTY = array("q", [0] * _MAX0 + [-1] * (R - _MAX0))
_FRESH = _EMPTY * BUCKETS
_ZEROS = array("q", bytes(8 * BUCKETS))


def _pairs(a: array, b: array, fn: Any) -> array:
    """``fn`` over two int64 arrays in C; saturated at int64's limit (absurd data only)."""
    try:
        return array("q", map(fn, a, b))
    except OverflowError:
        return array("q", (min(fn(x, y), _QMAX) for x, y in zip(a, b)))


#: one measured column of a batch, as the rank state computes it: (stats, measured values,
#: sketched count, sum, max, min, column name, all values with -1 = not measured); only the
#: measured values, sum, max, name and all values are read here
Measured = tuple[Any, Sequence[int], int, int, int, int, str, Sequence[int]]


def _gaps(n: int, measured: Sequence[Measured], t_end: Sequence[int],
          outside: Optional[tuple[int, int]]) -> Optional[list[int]]:
    """Each record's time between steps (ns): from the previous step's end to its own start,
    ``t_end[i] - t_end[i-1] - step[i]``; the first record's is what the batch total leaves (0
    when it had no predecessor). None when the batch's time between steps is not known."""
    if outside is None or outside[1] <= 0:
        return None
    steps = next((m_[7] for m_ in measured if m_[6] == "step_ns"), None)
    if steps is None or len(steps) != n:
        return None
    gaps = [t_end[i] - t_end[i - 1] - steps[i] for i in range(1, n)]
    return [outside[0] - sum(gaps)] + gaps


class Series:
    """``phases``: the duration columns besides ``step_ns`` whose sums are kept per bucket (those
    of the protocol, wire/fold.SERIES_PHASES; a bucket has room for exactly those)."""

    __slots__ = ("width", "cells", "out_sum", "used", "overflowed")

    def __init__(self, phases: Sequence[str] = ()) -> None:
        unknown = {p for p in phases if p != "step_ns"} - set(fold.SERIES_PHASES)
        if unknown:
            raise ValueError(f"series phases {sorted(unknown)} are not the protocol's")
        self.width = 1
        #: bucket ``b``'s field ``f`` (wire/fold.ROW) is ``cells[b * R + f]``
        self.cells = array("q", _FRESH)
        #: time outside ``trace_step`` per bucket, ns (signed: a clock step makes it negative)
        self.out_sum = array("q", _ZEROS)
        #: number of buckets touched so far (index of the last one + 1)
        self.used = 0
        #: updates dropped because a bucket's sum would pass int64 (absurd values only)
        self.overflowed = 0

    def _double(self) -> None:
        c, new = self.cells, array("q", _FRESH)
        half = BUCKETS // 2
        for f in range(R):
            new[f:half * R:R] = _pairs(c[f::2 * R], c[f + R::2 * R], add if f < _MAX0 else max)
        self.cells = new
        out = array("q", _ZEROS)
        out[:half] = _pairs(self.out_sum[0::2], self.out_sum[1::2], add)
        self.out_sum = out
        self.width *= 2
        self.used = (self.used + 1) // 2

    def _fit(self, width: int) -> None:
        if not self.used:  # first data: start at a width that fits it, no merging needed
            self.width = width
        while self.width < width:
            self._double()

    def add(self, seq: int, n: int, measured: Sequence[Measured], mems: Optional[Sequence[int]],
            mem_max: int, t_end: Sequence[int], outside: Optional[tuple[int, int]]) -> None:
        """Record ``n`` records starting at ``seq``.

        ``measured``: the duration columns that hold a measurement, with their batch totals over
        measured values; ``mems``/``mem_max``: the peak-memory column (``None``/``-1`` when not
        measured); ``outside``: ``(sum, intervals)`` of the batch's time between steps when known.
        """
        try:
            self._add(seq, n, measured, mems, mem_max, t_end, outside)
        except OverflowError:
            self.overflowed += 1

    def _add(self, seq: int, n: int, measured: Sequence[Measured], mems: Optional[Sequence[int]],
             mem_max: int, t_end: Sequence[int], outside: Optional[tuple[int, int]]) -> None:
        last = seq + n - 1
        self._fit(series_width(seq, n, self.width))
        w, c = self.width, self.cells
        first_b, last_b = seq // w, last // w
        cnt_at, sum_at = _CNT_AT, _SUM_AT
        if first_b == last_b:  # the usual case: batch totals into one bucket
            base = first_b * R
            for _st, col, _m, total, mx, _mn, name, _all in measured:
                if name == "step_ns":
                    c[base + fold.R_STEP_SUM] += total
                    c[base + fold.R_STEP_CNT] += len(col)
                    if mx > c[base + fold.R_STEP_MAX]:
                        c[base + fold.R_STEP_MAX] = mx
                else:
                    c[base + sum_at[name]] += total
                    c[base + cnt_at[name]] += len(col)
            if mem_max > c[base + fold.R_MEM_MAX]:
                c[base + fold.R_MEM_MAX] = mem_max
            if t_end[-1] > c[base + fold.R_T_END]:
                c[base + fold.R_T_END] = t_end[-1]
            if outside is not None and outside[1] > 0:
                self.out_sum[first_b] += outside[0]
                c[base + fold.R_OUT_CNT] += outside[1]
        else:
            # a batch straddling buckets: the batch totals of the step, every phase and the
            # outside time are shared out in proportion to the records in each bucket (counts
            # exact, sums exact in total, one batch's means taken as even, so a bucket's phases
            # stay consistent with its step); maxima (step, memory, step end) are exact per bucket,
            # and so is the time between steps (from each record's end and duration: a pause
            # every k steps lands in the bucket of the step after it, not spread over the batch)
            given: dict[str, int] = {}
            out_given = 0
            gaps = _gaps(n, measured, t_end, outside)
            for b in range(first_b, last_b + 1):
                base = b * R
                lo = max(b * w - seq, 0)
                hi = min((b + 1) * w - seq, n)
                final = b == last_b
                for m_ in measured:
                    name, vals = m_[6], m_[7]
                    if len(m_[1]) != n:  # some records not measured (rare): exactly
                        part = [v for v in vals[lo:hi] if v >= 0]
                        if not part:
                            continue
                        share, cnt, mx = sum(part), len(part), max(part)
                    else:
                        share = m_[3] - given.get(name, 0) if final else m_[3] * hi // n - m_[3] * lo // n
                        given[name] = given.get(name, 0) + share
                        cnt = hi - lo
                        mx = max(vals[lo:hi]) if name == "step_ns" else 0
                    if name == "step_ns":
                        c[base + fold.R_STEP_SUM] += share
                        c[base + fold.R_STEP_CNT] += cnt
                        if mx > c[base + fold.R_STEP_MAX]:
                            c[base + fold.R_STEP_MAX] = mx
                    else:
                        c[base + sum_at[name]] += share
                        c[base + cnt_at[name]] += cnt
                if mems is not None:
                    m = max(mems[lo:hi])
                    if m > c[base + fold.R_MEM_MAX]:
                        c[base + fold.R_MEM_MAX] = m
                if t_end[hi - 1] > c[base + fold.R_T_END]:
                    c[base + fold.R_T_END] = t_end[hi - 1]
                if outside is not None and outside[1] > 0:
                    # intervals: one per record, less the first when it had no predecessor
                    cnt = hi - lo - (1 if outside[1] < n and lo == 0 else 0)
                    if gaps is not None:
                        share = outside[0] - out_given if final else sum(gaps[lo:hi])
                    else:
                        share = (outside[0] - out_given if final
                                 else outside[0] * hi // n - outside[0] * lo // n)
                    out_given += share
                    self.out_sum[b] += share
                    c[base + fold.R_OUT_CNT] += cnt
        if last_b + 1 > self.used:
            self.used = last_b + 1

    def add_rows(self, seq: int, n: int, v: Sequence[int], o: Sequence[int], extra: Optional[int],
                 va: Optional[array] = None, oa: Optional[array] = None) -> None:
        """Add the series rows of a validated ``fold`` frame (wire/fold.py) for records ``seq..
        seq+n-1``: sub-buckets of width ``g`` (a power of two), so once this series' width is at
        least ``g`` each row lands in exactly one bucket. ``extra``: the outside-step interval
        before the window's first record (from the previous window), or None. ``va``/``oa``: ``v``
        and ``o`` as int64 arrays (the validator keeps them), from which rows that land in
        untouched buckets are copied whole."""
        try:
            self._add_rows(seq, n, v, o, extra, va, oa)
        except OverflowError:
            self.overflowed += 1

    def _add_rows(self, seq: int, n: int, v: Sequence[int], o: Sequence[int], extra: Optional[int],
                  va: Optional[array], oa: Optional[array]) -> None:
        g, b0, k = v[fold.S_G], v[fold.S_B0], v[fold.S_K]
        width = series_width(seq, n, self.width)
        while width < g:
            width *= 2
        self._fit(width)
        ratio = self.width // g
        c, out_sum = self.cells, self.out_sum
        if not k:  # one row: the window's totals
            b = b0 // ratio
            base = b * R
            i = fold.PHASE0
            c[base + fold.R_STEP_SUM] += v[i + fold.P_SUM]
            c[base + fold.R_STEP_CNT] += v[i]
            if v[i + fold.P_MAX] > c[base + fold.R_STEP_MAX]:
                c[base + fold.R_STEP_MAX] = v[i + fold.P_MAX]
            if v[fold.MEM0 + 2] > c[base + fold.R_MEM_MAX]:
                c[base + fold.R_MEM_MAX] = v[fold.MEM0 + 2]
            if v[fold.H_T_LAST] > c[base + fold.R_T_END]:
                c[base + fold.R_T_END] = v[fold.H_T_LAST]
            at = base + fold.R_PHASE_CNT
            for _p in fold.SERIES_PHASES:
                i += fold.PW
                if v[i]:
                    c[at] += v[i]
                    c[at + fold.R_PHASE_SUM - fold.R_PHASE_CNT] += v[i + fold.P_SUM]
                at += 1
            if v[fold.H_OUT_N] >= 0:
                out_sum[b] += o[0] if extra is None else o[0] + extra
                c[base + fold.R_OUT_CNT] += v[fold.H_OUT_N] + (extra is not None)
            if b + 1 > self.used:
                self.used = b + 1
            return
        r0 = fold.ROWS0
        # rows that land in buckets past the last one touched are copied whole (the bucket is
        # empty, and one row fills it: node 0's width is g); the others are added field by field
        fresh = k
        if ratio == 1 and va is not None and oa is not None:
            fresh = min(max(self.used - b0, 0), k)
            if fresh < k:
                c[(b0 + fresh) * R:(b0 + k) * R] = va[r0 + fresh * R:r0 + k * R]
                out_sum[b0 + fresh:b0 + k] = oa[1 + fresh:k + 1]
        for i in range(fresh):
            b = (b0 + i) // ratio
            base, a = b * R, r0 + i * R
            for f in range(_MAX0):
                c[base + f] += v[a + f]
            for f in range(_MAX0, R):
                if v[a + f] > c[base + f]:
                    c[base + f] = v[a + f]
            out_sum[b] += o[i + 1]
        if extra is not None:
            out_sum[b0 // ratio] += extra
            c[b0 // ratio * R + fold.R_OUT_CNT] += 1
        last = (b0 + k - 1) // ratio + 1
        if last > self.used:
            self.used = last

    def to_data(self) -> dict[str, Any]:
        """Plain data: the used buckets' cells and outside sums as raw int64 bytes (two C-level
        copies per rank, what a checkpoint of 16,384 ranks pays; read them with
        :func:`series_values`)."""
        u = self.used
        out: dict[str, Any] = {"width": self.width, "used": u, "layout": LAYOUT,
                               "cells": self.cells[:u * R].tobytes(), "out_sum": self.out_sum[:u].tobytes()}
        if self.overflowed:
            out["overflowed"] = self.overflowed
        return out

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Series":
        """The series :meth:`to_data` (or an older version) serialised."""
        s = cls(fold.SERIES_PHASES)
        s.width, s.used = int(data.get("width") or 1), int(data.get("used") or 0)
        for (key, phase), f in FIELDS.items():
            vals = series_values(data, key, phase)[:BUCKETS]
            s.cells[f:len(vals) * R:R] = array("q", map(int, vals))
        vals = series_values(data, "phase_sum", OUTSIDE)[:BUCKETS]
        s.out_sum[:len(vals)] = array("q", map(int, vals))
        s.overflowed = int(data.get("overflowed") or 0)
        return s

    def merged(self, other: "Series") -> "Series":
        """Both series bucket by bucket (an aggregator's restart: the checkpoint's and the new
        one's), at the wider width (the narrower one's pairs merged)."""
        a, b = Series.from_data(self.to_data()), Series.from_data(other.to_data())
        for x, y in ((a, b), (b, a)):
            while x.width < y.width:
                x._double()
        out = Series(fold.SERIES_PHASES)
        out.width, out.used = a.width, max(a.used, b.used)
        for f in range(R):
            out.cells[f::R] = _pairs(a.cells[f::R], b.cells[f::R], add if f < _MAX0 else max)
        out.out_sum = _pairs(a.out_sum, b.out_sum, add)
        out.overflowed = a.overflowed + b.overflowed
        return out


#: what a serialised series' ``cells`` hold: fields per bucket in wire/fold.ROW's order
LAYOUT = f"rows-v3:{','.join(fold.ROW)}"
#: (metric, phase) -> the field of a bucket that holds it
FIELDS: dict[tuple[str, Optional[str]], int] = {
    ("step_sum", None): fold.R_STEP_SUM, ("step_cnt", None): fold.R_STEP_CNT,
    ("step_max", None): fold.R_STEP_MAX, ("mem_max", None): fold.R_MEM_MAX, ("t_end", None): fold.R_T_END,
    **{("phase_sum", p): at for p, at in _SUM_AT.items()},
    **{("phase_cnt", p): at for p, at in _CNT_AT.items()},
}
#: how a series serialised before protocol version 3 stored its metrics (one array each; the
#: rest int64)
_OLD_CODES = {"step_sum": "d", "phase_sum": "d", "phase_cnt": "i"}


def series_phases(data: dict[str, Any]) -> list[str]:
    """The phases (``phase_sum``/``phase_cnt`` keys) a serialised series holds."""
    if "cells" in data:
        return [*fold.SERIES_PHASES, OUTSIDE] if data.get("layout") == LAYOUT else []
    return list(data.get("phase_cnt") or {})


def series_values(data: dict[str, Any], key: str, phase: Optional[str] = None) -> list:
    """One metric of a serialised series as a list of numbers (``phase`` for ``phase_sum`` /
    ``phase_cnt``); ``[]`` when the series does not hold it (an older checkpoint, an unknown
    layout)."""
    cells = data.get("cells")
    arr = array("q")
    if cells is not None:
        if data.get("layout") != LAYOUT:
            return []
        if key == "phase_sum" and phase == OUTSIDE:
            arr.frombytes(data["out_sum"])
            return arr.tolist()
        f = FIELDS.get((key, phase))
        if f is None:
            return []
        return memoryview(cells).cast("q")[f::R].tolist()  # no copy of the other fields
    raw = data.get(key)
    if phase is not None:
        raw = (raw or {}).get(phase)
    if raw is None:
        return []
    arr = array(_OLD_CODES.get(key, "q"))
    arr.frombytes(raw)
    return arr.tolist()
