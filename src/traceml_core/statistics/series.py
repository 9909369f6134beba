"""Per-rank series over the whole run, in a bounded number of buckets of consecutive steps.

Bucket ``i`` (at width ``w``) covers record indices (``seq``) ``[i*w, (i+1)*w)``. Per bucket: the
step-time sum, count and max (mean and worst for live views and ``compare``), the maximum peak
memory (its trend is the memory-creep evidence), the last step's wall-clock end (to put steps on
a time axis), and sum + count of every other phase and of the time outside ``trace_step`` (each
phase over the run, per rank, for the HTML report, the dashboard and the exports).

One type for two uses, with one merge:

* **a window's rows** (what a relay folds from a window of records, :meth:`Series.of_window`): the
  window's records in sub-buckets of width ``g`` (a power of two) starting at bucket ``base``; at
  most :data:`SPAN` + 1 rows, each exact (sums, counts, maxima over its own records);
* **a rank's run** (node 0, ``base`` 0): when a record lands past the last bucket
  (:attr:`Series.limit`, :data:`BUCKETS` unless the run is very large), neighbouring buckets are
  merged pairwise and the width doubles, so memory stays bounded however long the run is.

:meth:`Series.merge` adds a later series into this one at the wider width (the narrower one's
buckets merged in pairs): a window into a rank's run (node 0), two consecutive windows (a group
relay), a checkpoint's run and the restarted aggregator's (resume). Widths are powers of two, so
a row always falls in exactly one bucket: the series is exact, never shared out.

Storage: one int64 array, bucket after bucket, each bucket the fields of :data:`ROW` in order
(first the counts, then the other sums, then the maxima), plus the outside-step sums apart
(signed: a clock step can make one negative). Bucket-major so that rows landing in buckets not
touched yet are copied as bytes (one C call), and rows landing in a touched bucket are added with
two C-level passes (sums, maxima), never a Python statement per field. Sums are int64
nanoseconds (292 years); values are bounded at the trust boundary, so only absurd data can
overflow a bucket: that sum is held at int64's limit and counted (``overflowed``), never raised.
"""

from __future__ import annotations

from array import array
from operator import add
from typing import Any, Optional, Sequence

from .columns import DURATION_COLUMNS

#: buckets per rank's series, and the most buckets one window's rows may span (else its width
#: doubles): a window costs at most SPAN + 1 rows, and a rank with very fast steps never costs a
#: Python statement per record
BUCKETS = 256
SPAN = 8
#: so a window has at most this many rows
MAX_ROWS = SPAN + 1
#: the extra "phase" for time between traced steps (``outside`` in the summary)
OUTSIDE = "outside"

#: the other duration columns whose sums a bucket keeps (step_ns has its own fields)
SERIES_PHASES = tuple(p for p in DURATION_COLUMNS if p != "step_ns")
#: the fields of a bucket (a row), in storage and wire order: first those that count records
#: (step_ns, each of SERIES_PHASES, outside-step intervals), then the other fields that are summed
#: (step sum, the sum of each of SERIES_PHASES), then those that are maxima (step max, memory
#: max, last t_end); outside-step sums are kept apart (signed)
ROW_COUNTS = ("step_cnt", *(f"{p}_cnt" for p in SERIES_PHASES), "out_cnt")
ROW = (*ROW_COUNTS, "step_sum", *(f"{p}_sum" for p in SERIES_PHASES), "step_max", "mem_max", "t_end")
R = len(ROW)
R_STEP_CNT = 0
R_PHASE_CNT = 1          # + index in SERIES_PHASES
R_OUT_CNT = len(ROW_COUNTS) - 1
R_STEP_SUM = len(ROW_COUNTS)
R_PHASE_SUM = R_STEP_SUM + 1  # + index in SERIES_PHASES
#: fields from here on are maxima (-1: none), the ones before are summed
R_MAX0 = R_PHASE_SUM + len(SERIES_PHASES)
R_STEP_MAX, R_MEM_MAX, R_T_END = range(R_MAX0, R_MAX0 + 3)
assert ROW[R_MAX0:] == ("step_max", "mem_max", "t_end") and R == R_MAX0 + 3

_CNT_AT = {p: R_PHASE_CNT + i for i, p in enumerate(SERIES_PHASES)}
_SUM_AT = {p: R_PHASE_SUM + i for i, p in enumerate(SERIES_PHASES)}
_CNT_AT[OUTSIDE] = R_OUT_CNT
_QMAX = (1 << 63) - 1
#: an empty bucket: sums and counts 0, maxima -1 (none)
EMPTY_ROW = array("q", [0] * R_MAX0 + [-1] * (R - R_MAX0))


def series_width(seq: int, n: int, width: int = 1, buckets: int = BUCKETS) -> int:
    """The smallest power of two, at least ``width``, whose buckets hold records ``seq..seq+n-1``
    in at most :data:`SPAN` buckets, the last one below ``buckets``."""
    last = seq + n - 1
    while last // width >= buckets or n > SPAN * width:
        width *= 2
    return width


def run_buckets(ranks: int) -> int:
    """Buckets per rank's series for a run of ``ranks``: :data:`BUCKETS` up to 16,384 ranks, then
    fewer in proportion (at least 32), so node 0's series stay within ~0.7 GB however many ranks
    (the summary draws at most 16 ranks one by one beyond 64; the others feed the envelope)."""
    b = BUCKETS
    while b > 32 and ranks * b > 16384 * BUCKETS:
        b //= 2
    return b


def _pairs(a: array, b: array, fn: Any) -> array:
    """``fn`` over two int64 arrays in C (raises OverflowError past int64: absurd data only)."""
    return array("q", map(fn, a, b))


def _held(a: array, b: array, fn: Any) -> array:
    """``fn`` over two int64 arrays, held at int64's limit."""
    return array("q", (max(min(fn(x, y), _QMAX), -_QMAX) for x, y in zip(a, b)))


class Series:
    """See the module docstring. ``width``: records per bucket; ``base``: the index (at
    ``width``) of the first bucket held; ``used``: buckets held; ``limit``: the most buckets a
    rank's run keeps (its width doubles beyond)."""

    __slots__ = ("width", "base", "used", "cells", "out_sum", "overflowed", "limit")

    def __init__(self, width: int = 1, base: int = 0, limit: int = BUCKETS) -> None:
        self.width = width
        self.base = base
        self.used = 0
        #: bucket ``b``'s field ``f`` (ROW) is ``cells[(b - base) * R + f]``
        self.cells = array("q")
        #: time outside ``trace_step`` per bucket, ns (signed)
        self.out_sum = array("q")
        #: updates dropped because a bucket's sum would pass int64 (absurd values only)
        self.overflowed = 0
        self.limit = limit

    # --- building ------------------------------------------------------------------------------
    @classmethod
    def of_rows(cls, width: int, base: int, rows: array, out: Sequence[int]) -> "Series":
        """A window's series from its rows (int64, row after row) and their outside-step sums."""
        s = cls(width, base)
        s.cells = rows
        s.out_sum = array("q", out)
        s.used = len(out)
        return s

    def _grow(self, used: int) -> None:
        """Hold buckets up to ``base + used`` (new ones empty)."""
        more = used - self.used
        if more > 0:
            self.cells.extend(EMPTY_ROW * more)
            self.out_sum.extend(array("q", bytes(8 * more)))
            self.used = used

    def _double(self) -> None:
        """Merge neighbouring buckets in pairs: the width doubles."""
        if self.used:
            if self.base % 2:  # pair on absolute bucket indices: an empty bucket before the first
                self.cells = EMPTY_ROW + self.cells
                self.out_sum = array("q", [0]) + self.out_sum
                self.base -= 1
                self.used += 1
            if self.used % 2:
                self.cells.extend(EMPTY_ROW)
                self.out_sum.append(0)
                self.used += 1
            c = self.cells
            half = self.used // 2
            new = array("q", EMPTY_ROW * half)
            for f in range(R):
                new[f::R] = self._pairs(c[f::2 * R], c[f + R::2 * R], add if f < R_MAX0 else max)
            self.cells = new
            self.out_sum = self._pairs(self.out_sum[0::2], self.out_sum[1::2], add)
            self.used = half
        self.base //= 2
        self.width *= 2

    def widen(self, width: int) -> None:
        """Bring the series to ``width`` (a power of two, at least its own)."""
        if not self.used:
            self.base = self.base * self.width // width
            self.width = max(self.width, width)
            return
        while self.width < width:
            self._double()

    # --- the merge -----------------------------------------------------------------------------
    def _pairs(self, a: array, b: array, fn: Any) -> array:
        """``fn`` over two int64 arrays in C; a sum past int64 (only absurd data: every value is
        bounded at the trust boundary) is held at int64's limit and counted (``overflowed``)."""
        try:
            return array("q", map(fn, a, b))
        except OverflowError:
            self.overflowed += 1
            return _held(a, b, fn)

    def _add_out(self, b: int, x: int) -> None:
        try:
            self.out_sum[b] += x
        except OverflowError:
            self.overflowed += 1
            self.out_sum[b] = max(min(self.out_sum[b] + x, _QMAX), -_QMAX)

    def merge(self, other: "Series", width: Optional[int] = None, extra: Optional[int] = None,
              extra_at: int = 0) -> None:
        """Add ``other`` (records after or beside this series') at ``width`` (default: the wider
        of the two, doubled while a bucket would pass :attr:`limit`). ``extra``: an outside-step
        interval counted in the bucket of record ``extra_at`` (the interval joining two windows).
        ``other`` is left alone."""
        self._merge(other, width, extra, extra_at)

    def _merge(self, other: "Series", width: Optional[int], extra: Optional[int], extra_at: int) -> None:
        self.overflowed += other.overflowed
        if width is None:
            width = max(self.width, other.width)
            last = max((self.base + self.used) * self.width if self.used else 0,
                       (other.base + other.used) * other.width) - 1
            if extra is not None:
                last = max(last, extra_at)
            while last // width >= self.limit:
                width *= 2
        self.widen(width)
        if other.used > 2 * MAX_ROWS and other.width != width:  # a whole run (a restart's merge)
            other = other.copy()
            other.widen(width)
        ratio = width // other.width
        if other.used:
            first = (other.base // ratio) if self.used else other.base // ratio
            if not self.used:
                self.base = first
            elif first < self.base:  # (never for records that come later) make room before
                pad = self.base - first
                self.cells = EMPTY_ROW * pad + self.cells
                self.out_sum = array("q", bytes(8 * pad)) + self.out_sum
                self.base, self.used = first, self.used + pad
            c, oc, outs = self.cells, other.cells, other.out_sum
            i = 0
            if ratio == 1:  # rows that land in buckets not held yet are copied whole
                start = other.base - self.base
                end = start + other.used
                fresh = max(start, self.used)
                if fresh < end:
                    self._grow(end)
                    c = self.cells
                    c[fresh * R:end * R] = oc[(fresh - start) * R:]
                    self.out_sum[fresh:end] = outs[fresh - start:]
                    end = fresh
                rows = range(start, end)
            else:
                rows = [(other.base + j) // ratio - self.base for j in range(other.used)]
            for b in rows:  # each row into its bucket: two C passes (sums, maxima)
                if b >= self.used:
                    self._grow(b + 1)
                    c = self.cells
                a, o = b * R, i * R
                c[a:a + R_MAX0] = self._pairs(c[a:a + R_MAX0], oc[o:o + R_MAX0], add)
                c[a + R_MAX0:a + R] = _pairs(c[a + R_MAX0:a + R], oc[o + R_MAX0:o + R], max)
                self._add_out(b, outs[i])
                i += 1
        if extra is not None:
            b = extra_at // self.width - self.base
            if b >= self.used:
                if not self.used:
                    self.base, b = extra_at // self.width, 0
                self._grow(b + 1)
            self._add_out(b, extra)
            self.cells[b * R + R_OUT_CNT] += 1

    def copy(self) -> "Series":
        s = Series(self.width, self.base, self.limit)
        s.used, s.overflowed = self.used, self.overflowed
        s.cells, s.out_sum = array("q", self.cells), array("q", self.out_sum)
        return s

    # --- plain data ----------------------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """Plain data (a rank's run, ``base`` 0): the used buckets' cells and outside sums as raw
        int64 bytes (two C-level copies per rank, what a checkpoint of 16,384 ranks pays; read
        them with :func:`series_values`)."""
        cells, outs, used = self.cells, self.out_sum, self.used
        if self.base:  # a window's rows: from bucket 0, as every reader expects
            cells = EMPTY_ROW * self.base + cells
            outs = array("q", bytes(8 * self.base)) + outs
            used += self.base
        out: dict[str, Any] = {"width": self.width, "used": used, "layout": LAYOUT,
                               "cells": cells.tobytes(), "out_sum": outs.tobytes()}
        if self.overflowed:
            out["overflowed"] = self.overflowed
        return out

    @classmethod
    def from_data(cls, data: dict[str, Any], limit: int = BUCKETS) -> "Series":
        """The series :meth:`to_data` (or an older version) serialised."""
        s = cls(int(data.get("width") or 1), 0, limit)
        used = int(data.get("used") or 0)
        if data.get("cells") is not None and data.get("layout") == LAYOUT:
            s.cells.frombytes(data["cells"])
            s.out_sum.frombytes(data["out_sum"])
            s.used = len(s.out_sum)
        else:  # an older checkpoint: one array per metric
            s._grow(used)
            for (key, phase), f in FIELDS.items():
                vals = series_values(data, key, phase)[:used]
                s.cells[f:len(vals) * R:R] = array("q", map(int, vals))
            vals = series_values(data, "phase_sum", OUTSIDE)[:used]
            s.out_sum[:len(vals)] = array("q", map(int, vals))
        s.overflowed = int(data.get("overflowed") or 0)
        return s


#: what a serialised series' ``cells`` hold: fields per bucket in ROW's order
LAYOUT = f"rows-v3:{','.join(ROW)}"
#: (metric, phase) -> the field of a bucket that holds it
FIELDS: dict[tuple[str, Optional[str]], int] = {
    ("step_sum", None): R_STEP_SUM, ("step_cnt", None): R_STEP_CNT,
    ("step_max", None): R_STEP_MAX, ("mem_max", None): R_MEM_MAX, ("t_end", None): R_T_END,
    **{("phase_sum", p): at for p, at in _SUM_AT.items()},
    **{("phase_cnt", p): at for p, at in _CNT_AT.items()},
}
#: how a series serialised before protocol version 3 stored its metrics (one array each; the
#: rest int64)
_OLD_CODES = {"step_sum": "d", "phase_sum": "d", "phase_cnt": "i"}


def regroup(values: Sequence[int], factor: int, combine: str) -> list:
    """One metric of a serialised series at ``factor`` times its width: neighbouring buckets
    merged ``factor`` at a time, sums (``combine="sum"``) added and maxima (``"max"``) kept, as
    :meth:`Series.merge` widens a running series (ranks of different widths read at one)."""
    if factor <= 1:
        return list(values)
    fn = sum if combine == "sum" else max
    return [fn(values[i:i + factor]) for i in range(0, len(values), factor)]


def step_across(series: Sequence[dict[str, Any]]) -> tuple[int, list[int], list[int], list[int]]:
    """Many ranks' serialised series as one: at the coarsest rank's width, per bucket the step
    time's sum and count over all ranks and its maximum (-1: no step). Returns (width, sums,
    counts, maxima)."""
    width = max((int(s["width"]) for s in series), default=1)
    tot_sum: list[int] = []
    tot_cnt: list[int] = []
    tot_max: list[int] = []
    for s in series:
        f = width // int(s["width"])
        ssum, scnt, smax = (series_values(s, k) for k in ("step_sum", "step_cnt", "step_max"))
        if f > 1:
            ssum, scnt, smax = regroup(ssum, f, "sum"), regroup(scnt, f, "sum"), regroup(smax, f, "max")
        if len(ssum) > len(tot_sum):
            grow = len(ssum) - len(tot_sum)
            tot_sum += [0] * grow
            tot_cnt += [0] * grow
            tot_max += [-1] * grow
        n = len(ssum)
        tot_sum[:n] = map(add, tot_sum[:n], ssum)
        tot_cnt[:n] = map(add, tot_cnt[:n], scnt)
        tot_max[:n] = map(max, tot_max[:n], smax)
    return width, tot_sum, tot_cnt, tot_max


def series_phases(data: dict[str, Any]) -> list[str]:
    """The phases (``phase_sum``/``phase_cnt`` keys) a serialised series holds."""
    if "cells" in data:
        return [*SERIES_PHASES, OUTSIDE] if data.get("layout") == LAYOUT else []
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
