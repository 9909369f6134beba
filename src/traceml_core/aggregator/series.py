"""Per-rank series over the whole run, in a fixed number of buckets of consecutive steps.

Bucket ``i`` covers record indices (``seq``) ``[i*width, (i+1)*width)``. When a record lands past the
last bucket, neighbouring buckets are merged pairwise and ``width`` doubles, so memory stays at
:data:`BUCKETS` entries per metric however long the run is, and the series always spans it all.
Per bucket: step-time sum, count and max (mean and worst for live views and ``compare``), the
maximum peak memory (its trend is the memory-creep evidence), the last step's wall-clock end
(to put steps on a time axis), and sum + count of every other phase and of the time outside
``trace_step`` (each phase over the run, per rank, for the HTML report, the dashboard and the
exports). Per rank that is about ``256 x (26 + 12 x phases)`` bytes: 21 KB with six phases.

A batch usually falls into one bucket, so the caller passes the batch totals it already computed;
only a batch straddling buckets is sliced (C-level ``sum``/``max`` per slice), and the width also
doubles until a batch spans at most :data:`SPAN` buckets, so a rank with very fast steps never costs
a Python loop per record.
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
__all__ = ["BUCKETS", "SPAN", "OUTSIDE", "Series", "series_values"]
#: the extra "phase" for time between traced steps (``outside`` in the summary)
OUTSIDE = "outside"

_NONE = array("q", [-1]) * BUCKETS


def _zeros(code: str = "q") -> array:
    return array(code, bytes(array(code).itemsize * BUCKETS))


def _merge_pairs(a: array, combine: str) -> array:
    """Buckets (2i, 2i+1) -> i, in C (``map`` over strided slices); the upper half is emptied."""
    out = array(a.typecode, _NONE) if combine == "max" and a.typecode == "q" else _zeros(a.typecode)
    fn = add if combine == "sum" else max
    out[:BUCKETS // 2] = array(a.typecode, map(fn, a[0::2], a[1::2]))
    return out


#: one measured column of a batch, as the rank state computes it: (stats, measured values,
#: sketched count, sum, max, min, column name, all values with -1 = not measured); only the
#: measured values, sum, max, name and all values are read here
Measured = tuple[Any, Sequence[int], int, int, int, int, str, Sequence[int]]


class Series:
    """``phases``: the duration columns besides ``step_ns`` whose sums are kept per bucket."""

    __slots__ = ("width", "step_sum", "step_cnt", "step_max", "mem_max", "t_end", "phase_sum",
                 "phase_cnt", "used")

    def __init__(self, phases: Sequence[str] = ()) -> None:
        self.width = 1
        self.step_sum = _zeros("d")  # float: sums can never overflow
        self.step_cnt = _zeros()
        self.step_max = array("q", _NONE)
        self.mem_max = array("q", _NONE)
        self.t_end = array("q", _NONE)  # ns, the latest step end in the bucket
        names = [p for p in phases if p != "step_ns"] + [OUTSIDE]
        self.phase_sum = {p: _zeros("d") for p in names}
        self.phase_cnt = {p: _zeros("i") for p in names}
        #: number of buckets touched so far (index of the last one + 1)
        self.used = 0

    def _double(self) -> None:
        self.step_sum = _merge_pairs(self.step_sum, "sum")
        self.step_cnt = _merge_pairs(self.step_cnt, "sum")
        self.step_max = _merge_pairs(self.step_max, "max")
        self.mem_max = _merge_pairs(self.mem_max, "max")
        self.t_end = _merge_pairs(self.t_end, "max")
        for p in self.phase_sum:
            self.phase_sum[p] = _merge_pairs(self.phase_sum[p], "sum")
            self.phase_cnt[p] = _merge_pairs(self.phase_cnt[p], "sum")
        self.width *= 2
        self.used = (self.used + 1) // 2

    def add(self, seq: int, n: int, measured: Sequence[Measured], mems: Optional[Sequence[int]],
            mem_max: int, t_end: Sequence[int], outside: Optional[tuple[int, int]]) -> None:
        """Record ``n`` records starting at ``seq``.

        ``measured``: the duration columns that hold a measurement, with their batch totals over
        measured values; ``mems``/``mem_max``: the peak-memory column (``None``/``-1`` when not
        measured); ``outside``: ``(sum, intervals)`` of the batch's time between steps when known.
        """
        last = seq + n - 1
        width = series_width(seq, n, self.width)
        if not self.used:  # first data: start at a width that fits it, no merging needed
            self.width = width
        while self.width < width:
            self._double()
        w = self.width
        first_b, last_b = seq // w, last // w
        if first_b == last_b:  # the usual case: batch totals into one bucket
            b = first_b
            psum, pcnt = self.phase_sum, self.phase_cnt
            for _st, col, _m, total, mx, _mn, name, _all in measured:
                if name == "step_ns":
                    self.step_sum[b] += total
                    self.step_cnt[b] += len(col)
                    if mx > self.step_max[b]:
                        self.step_max[b] = mx
                else:
                    psum[name][b] += total
                    pcnt[name][b] += len(col)
            if mem_max > self.mem_max[b]:
                self.mem_max[b] = mem_max
            if t_end[-1] > self.t_end[b]:
                self.t_end[b] = t_end[-1]
            if outside is not None and outside[1] > 0:
                self.phase_sum[OUTSIDE][b] += outside[0]
                self.phase_cnt[OUTSIDE][b] += outside[1]
        else:
            # a batch straddling buckets: the batch totals of the step, every phase and the
            # outside time are shared out in proportion to the records in each bucket (counts
            # exact, sums exact in total, one batch's means taken as even, so a bucket's phases
            # stay consistent with its step); maxima (step, memory, step end) are exact per bucket
            given: dict[str, int] = {}
            out_given = 0
            for b in range(first_b, last_b + 1):
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
                        self.step_sum[b] += share
                        self.step_cnt[b] += cnt
                        if mx > self.step_max[b]:
                            self.step_max[b] = mx
                    else:
                        self.phase_sum[name][b] += share
                        self.phase_cnt[name][b] += cnt
                if mems is not None:
                    m = max(mems[lo:hi])
                    if m > self.mem_max[b]:
                        self.mem_max[b] = m
                if t_end[hi - 1] > self.t_end[b]:
                    self.t_end[b] = t_end[hi - 1]
                if outside is not None and outside[1] > 0:
                    # intervals: one per record, less the first when it had no predecessor
                    cnt = hi - lo - (1 if outside[1] < n and lo == 0 else 0)
                    share = (outside[0] - out_given if final
                             else outside[0] * hi // n - outside[0] * lo // n)
                    out_given += share
                    self.phase_sum[OUTSIDE][b] += share
                    self.phase_cnt[OUTSIDE][b] += cnt
        if last_b + 1 > self.used:
            self.used = last_b + 1

    def add_rows(self, seq: int, n: int, v: Sequence[int], o: Sequence[int],
                 extra: Optional[int]) -> None:
        """Add the series rows of a validated ``fold`` frame (wire/fold.py) for records ``seq..
        seq+n-1``: sub-buckets of width ``g`` (a power of two), so once this series' width is at
        least ``g`` each row lands in exactly one bucket. ``extra``: the outside-step interval
        before the window's first record (from the previous window), or None."""
        g, b0, k = v[fold.S_G], v[fold.S_B0], v[fold.S_K]
        width = series_width(seq, n, self.width)
        while width < g:
            width *= 2
        if not self.used:
            self.width = width
        while self.width < width:
            self._double()
        ratio = self.width // g
        psum, pcnt = self.phase_sum, self.phase_cnt
        if not k:  # one row: the window's totals
            b = b0 // ratio
            i = fold.PHASE0
            self.step_sum[b] += v[i + fold.P_SUM]
            self.step_cnt[b] += v[i]
            if v[i + fold.P_MAX] > self.step_max[b]:
                self.step_max[b] = v[i + fold.P_MAX]
            if v[fold.MEM0 + 2] > self.mem_max[b]:
                self.mem_max[b] = v[fold.MEM0 + 2]
            if v[fold.H_T_LAST] > self.t_end[b]:
                self.t_end[b] = v[fold.H_T_LAST]
            for p in fold.SERIES_PHASES:
                i += fold.PW
                if v[i]:
                    psum[p][b] += v[i + fold.P_SUM]
                    pcnt[p][b] += v[i]
            if v[fold.H_OUT_N] >= 0:
                psum[OUTSIDE][b] += o[0] if extra is None else o[0] + extra
                pcnt[OUTSIDE][b] += v[fold.H_OUT_N] + (extra is not None)
            if b + 1 > self.used:
                self.used = b + 1
            return
        out_sum, out_cnt = psum[OUTSIDE], pcnt[OUTSIDE]
        # the phases measured in this window (the others' rows are zeros), with the offsets of
        # their count and sum fields; field f of row i is v[ROWS0 + f * k + i] (wire/fold.ROW)
        r0 = fold.ROWS0
        phases = [(pcnt[p], psum[p], r0 + (fold.R_PHASE_CNT + at) * k, r0 + (fold.R_PHASE_SUM + at) * k)
                  for at, p in enumerate(fold.SERIES_PHASES) if v[fold.PHASE0 + (at + 1) * fold.PW]]
        step_sum, step_cnt, step_max = self.step_sum, self.step_cnt, self.step_max
        mem_max, t_end = self.mem_max, self.t_end
        c_out, c_sum, c_max = r0 + fold.R_OUT_CNT * k, r0 + fold.R_STEP_SUM * k, r0 + fold.R_STEP_MAX * k
        c_mem, c_end = r0 + fold.R_MEM_MAX * k, r0 + fold.R_T_END * k
        for i in range(k):
            b = (b0 + i) // ratio
            step_cnt[b] += v[r0 + i]
            step_sum[b] += v[c_sum + i]
            if v[c_max + i] > step_max[b]:
                step_max[b] = v[c_max + i]
            if v[c_mem + i] > mem_max[b]:
                mem_max[b] = v[c_mem + i]
            if v[c_end + i] > t_end[b]:
                t_end[b] = v[c_end + i]
            for cnts, sums, c_cnt, c_psum in phases:
                cnts[b] += v[c_cnt + i]
                sums[b] += v[c_psum + i]
            out_cnt[b] += v[c_out + i]
            out_sum[b] += o[i + 1]
        if extra is not None:
            out_sum[b0 // ratio] += extra
            out_cnt[b0 // ratio] += 1
        last = (b0 + k - 1) // ratio + 1
        if last > self.used:
            self.used = last

    def to_data(self) -> dict[str, Any]:
        """Plain data: the used buckets as raw arrays (bytes; see :func:`series_values`)."""
        u = self.used
        return {
            "width": self.width, "used": u,
            "step_sum": self.step_sum[:u].tobytes(),  # float64
            "step_cnt": self.step_cnt[:u].tobytes(),  # int64
            "step_max": self.step_max[:u].tobytes(),  # int64, -1 = no data
            "mem_max": self.mem_max[:u].tobytes(),  # int64, -1 = no data
            "t_end": self.t_end[:u].tobytes(),  # int64 ns, -1 = no data
            "phase_sum": {p: a[:u].tobytes() for p, a in self.phase_sum.items()},  # float64
            "phase_cnt": {p: a[:u].tobytes() for p, a in self.phase_cnt.items()},  # int32
        }


_CODES = {"step_sum": "d", "phase_sum": "d", "phase_cnt": "i"}


def series_values(data: dict[str, Any], key: str, phase: Optional[str] = None) -> list:
    """One metric of a serialised series as a list of numbers (``phase`` for ``phase_sum`` /
    ``phase_cnt``); ``[]`` when the series predates that metric (an older checkpoint)."""
    raw = data.get(key)
    if phase is not None:
        raw = (raw or {}).get(phase)
    if raw is None:
        return []
    arr = array(_CODES.get(key, "q"))
    arr.frombytes(raw)
    return arr.tolist()
