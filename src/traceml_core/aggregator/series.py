"""Step-time and peak-memory series over a rank's whole run, in a fixed number of buckets.

Bucket ``i`` covers record indices (``seq``) ``[i*width, (i+1)*width)``. When a record lands past the
last bucket, neighbouring buckets are merged pairwise and ``width`` doubles, so memory stays at
:data:`BUCKETS` entries per metric however long the run is, and the series always spans it all.
Per bucket: step-time sum, count and max (mean and worst for live views and ``compare``) and the
maximum peak memory (its trend is the memory-creep evidence).

A batch usually falls into one bucket, so the caller passes the batch totals it already computed;
only a batch straddling buckets is sliced (C-level ``sum``/``max`` per slice), and the width also
doubles until a batch spans at most about four buckets, so a rank with very fast steps never costs
a Python loop per record.
"""

from __future__ import annotations

from array import array
from operator import add
from typing import Any, Optional, Sequence

BUCKETS = 256


_ONES = array("q", [1]) * BUCKETS
_NONE = array("q", [-1]) * BUCKETS


def _zeros(code: str = "q") -> array:
    return array(code, bytes(8 * BUCKETS))


def _merge_pairs(a: array, combine: str) -> array:
    """Buckets (2i, 2i+1) -> i, in C (``map`` over strided slices); the upper half is zeroed."""
    out = _zeros(a.typecode)
    fn = add if combine == "sum" else max
    out[:BUCKETS // 2] = array(a.typecode, map(fn, a[0::2], a[1::2]))
    return out


class Series:
    __slots__ = ("width", "step_sum", "step_cnt", "step_max", "mem_max", "used")

    def __init__(self) -> None:
        self.width = 1
        self.step_sum = _zeros("d")  # float: sums can never overflow
        self.step_cnt = _zeros()
        self.step_max = _zeros()
        self.mem_max = array("q", _NONE)
        #: number of buckets touched so far (index of the last one + 1)
        self.used = 0

    def _double(self) -> None:
        self.step_sum = _merge_pairs(self.step_sum, "sum")
        self.step_cnt = _merge_pairs(self.step_cnt, "sum")
        self.step_max = _merge_pairs(self.step_max, "max")
        mem = _merge_pairs(self.mem_max, "max")
        mem[BUCKETS // 2:] = _NONE[:BUCKETS // 2]
        self.mem_max = mem
        self.width *= 2
        self.used = (self.used + 1) // 2

    def _grow(self, last_index: int, n: int) -> None:
        # past the last bucket, or a batch that would span more than 4 buckets (fast steps: a
        # per-record series at the start of the run is not worth a Python loop per bucket)
        while last_index // self.width >= BUCKETS or n > 4 * self.width:
            self._double()

    def add(self, seq: int, steps: Sequence[int], mems: Optional[Sequence[int]],
            step_sum: int, step_cnt: int, step_max: int, mem_max: int) -> None:
        """Record ``len(steps)`` records starting at ``seq``; negative values mean not measured.

        ``step_sum``/``step_cnt``/``step_max``/``mem_max`` are the batch totals over measured values
        (the caller passes ``-1`` for a max, and ``None`` for ``mems``, when that column holds no
        measurement).
        """
        n = len(steps)
        last = seq + n - 1
        if not self.used:  # first data: start at a width that fits it, no merging needed
            while last // self.width >= BUCKETS or n > 4 * self.width:
                self.width *= 2
        if last // self.width >= BUCKETS or n > 4 * self.width:
            self._grow(last, n)
        w = self.width
        first_b, last_b = seq // w, last // w
        if w == 1 and step_cnt == n and self.used <= first_b:
            # the start of a run (one record per bucket, fresh buckets): whole-slice copies
            self.step_sum[first_b:last_b + 1] = array("d", steps)
            self.step_max[first_b:last_b + 1] = array("q", steps)
            self.step_cnt[first_b:last_b + 1] = _ONES[:n]
            if mems is not None:
                self.mem_max[first_b:last_b + 1] = array("q", mems)
        elif first_b == last_b:
            self._put(first_b, step_cnt, step_sum, step_max, mem_max)
        else:
            for b in range(first_b, last_b + 1):
                lo = max(b * w - seq, 0)
                hi = min((b + 1) * w - seq, n)
                st = steps[lo:hi]
                smax = max(st)
                if smax >= 0 and min(st) < 0:
                    st = [v for v in st if v >= 0]
                self._put(b, len(st) if smax >= 0 else 0, sum(st) if smax >= 0 else 0,
                          smax if smax >= 0 else -1, max(mems[lo:hi]) if mems is not None else -1)
        if last_b + 1 > self.used:
            self.used = last_b + 1

    def _put(self, b: int, cnt: int, ssum: int, smax: int, mmax: int) -> None:
        if cnt:
            self.step_sum[b] += ssum
            self.step_cnt[b] += cnt
            if smax > self.step_max[b]:
                self.step_max[b] = smax
        if mmax > self.mem_max[b]:
            self.mem_max[b] = mmax

    def to_data(self) -> dict[str, Any]:
        """Plain data: the used buckets as raw arrays (bytes; see :func:`series_values`)."""
        u = self.used
        return {
            "width": self.width, "used": u,
            "step_sum": self.step_sum[:u].tobytes(),  # float64
            "step_cnt": self.step_cnt[:u].tobytes(),  # int64
            "step_max": self.step_max[:u].tobytes(),  # int64
            "mem_max": self.mem_max[:u].tobytes(),  # int64, -1 = no data
        }


def series_values(data: dict[str, Any], key: str) -> list:
    """One metric of a serialised series as a list of numbers."""
    arr = array("d" if key == "step_sum" else "q")
    arr.frombytes(data[key])
    return arr.tolist()
