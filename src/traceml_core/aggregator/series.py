"""Step-time and peak-memory series over a rank's whole run, in a fixed number of buckets.

Bucket ``i`` covers record indices (``seq``) ``[i*width, (i+1)*width)``. When a record lands past the
last bucket, neighbouring buckets are merged pairwise and ``width`` doubles, so memory stays at
:data:`BUCKETS` entries per metric however long the run is, and the series always spans it all.
Per bucket: step-time sum, count and max (mean and worst for live views and ``compare``) and the
maximum peak memory (its trend is the memory-creep evidence).

A batch usually falls into one bucket, so the caller passes the batch totals it already computed;
only a batch straddling buckets is sliced (C-level ``sum``/``max`` per slice).
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

BUCKETS = 256


def _zeros() -> array:
    return array("q", bytes(8 * BUCKETS))


def _merge_pairs(a: array, combine: str) -> array:
    out = _zeros()
    for i in range(BUCKETS // 2):
        x, y = a[2 * i], a[2 * i + 1]
        out[i] = x + y if combine == "sum" else max(x, y)
    return out


class Series:
    __slots__ = ("width", "step_sum", "step_cnt", "step_max", "mem_max", "used")

    def __init__(self) -> None:
        self.width = 1
        self.step_sum = _zeros()
        self.step_cnt = _zeros()
        self.step_max = _zeros()
        self.mem_max = array("q", [-1]) * BUCKETS
        #: number of buckets touched so far (index of the last one + 1)
        self.used = 0

    def _grow(self, last_index: int) -> None:
        while last_index // self.width >= BUCKETS:
            self.step_sum = _merge_pairs(self.step_sum, "sum")
            self.step_cnt = _merge_pairs(self.step_cnt, "sum")
            self.step_max = _merge_pairs(self.step_max, "max")
            mem = _merge_pairs(self.mem_max, "max")
            for i in range(BUCKETS // 2, BUCKETS):
                mem[i] = -1
            self.mem_max = mem
            self.width *= 2
            self.used = (self.used + 1) // 2

    def add(self, seq: int, steps: Sequence[int], mems: Sequence[int],
            step_sum: int, step_cnt: int, step_max: int, mem_max: int) -> None:
        """Record ``len(steps)`` records starting at ``seq``; negative values mean not measured.

        ``step_sum``/``step_cnt``/``step_max``/``mem_max`` are the batch totals over measured values
        (the caller passes ``-1`` for a max when that column holds no measurement).
        """
        n = len(steps)
        last = seq + n - 1
        if last // self.width >= BUCKETS:
            self._grow(last)
        w = self.width
        first_b, last_b = seq // w, last // w
        if first_b == last_b:
            self._put(first_b, step_cnt, step_sum, step_max, mem_max)
        else:
            for b in range(first_b, last_b + 1):
                lo = max(b * w - seq, 0)
                hi = min((b + 1) * w - seq, n)
                st = steps[lo:hi]
                smax = max(st)
                if smax >= 0 and min(st) < 0:
                    st = [v for v in st if v >= 0]
                self._put(b, len(st) if smax >= 0 else 0, sum(st) if smax >= 0 else 0, smax,
                          max(mems[lo:hi]))
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
        u = self.used
        return {
            "width": self.width,
            "step_sum": list(self.step_sum[:u]),
            "step_cnt": list(self.step_cnt[:u]),
            "step_max": list(self.step_max[:u]),
            "mem_max": list(self.mem_max[:u]),
        }
