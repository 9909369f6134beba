"""A small fixed-accuracy quantile sketch for non-negative integers (durations in ns, bytes).

Why our own: numpy is not a dependency, and the aggregator must bucket whole columns without a
Python-level operation per value. The bucket of a value is read straight off its IEEE float32 bit
pattern: ``array('f', column)`` converts a whole column in C, a memoryview cast exposes the top 16
bits of each float (sign, 8 exponent bits, 7 mantissa bits), and ``collections._count_elements``
(the C helper behind ``Counter``) counts them into a dict. Folding then drops one more mantissa bit,
so a bucket spans 1/64 of an octave and its midpoint is within 0.78 % of any value in it
(DDSketch-like relative accuracy; about 64 buckets per factor of two).

Storage is a dense ``array('Q')`` of counts over a window of bucket indices ("key6" = the float32
bits >> 17), grown as values arrive and capped at :data:`MAX_BUCKETS` by collapsing the lowest
buckets (so upper quantiles, the interesting ones, keep their accuracy). Zeros are counted apart.
Batches sampled with a stride are counted with that stride as a weight, so quantiles stay
unbiased when only part of a large batch is sketched.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from itertools import accumulate
from operator import add
from typing import Any, Iterable, Optional, Sequence

try:  # the C helper behind collections.Counter: counts an iterable into a dict without Python code
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Pythons
    def _count_elements(mapping: dict, iterable: Iterable[int]) -> None:  # type: ignore[misc]
        get = mapping.get
        for x in iterable:
            mapping[x] = get(x, 0) + 1

#: name of the bucket scheme, stored with serialised sketches so `compare` can check it
ENCODING = "f32top15"
#: at most this many buckets per sketch (2,048 = 32 octaves, e.g. 1 us to 1 h at full accuracy)
MAX_BUCKETS = 2048
#: fold the uncompacted counts into the dense store after this many values (the fold costs one
#: Python step per distinct key, so it must be rare relative to values) ...
FOLD_VALUES = 2048
#: ... or when they hold more distinct keys than this (bounds their memory)
HOT_MAX = 512
#: index of the top 16 bits of each float32 when viewed as uint16 pairs
_TOP = 1 if sys.byteorder == "little" else 0
_NEG = 0x8000  # sign bit of a top-16 key: a negative value ("not measured")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def column_keys(values: Sequence[int]) -> memoryview:
    """Top-16-bit float32 keys of ``values``, computed in C (raises TypeError for non-numbers)."""
    return memoryview(array("f", values)).cast("B").cast("H")[_TOP::2]


def bucket_value(key6: int, shift: int = 0) -> float:
    """Representative (midpoint) value of a bucket index (of a sketch ``shift`` bits coarser)."""
    if shift:
        return _F32.unpack(_U32.pack((key6 << (17 + shift)) | (1 << (16 + shift))))[0]
    return _F32.unpack(_U32.pack((key6 << 17) | (1 << 16)))[0]


def value_bucket(value: float) -> int:
    """Bucket index of a positive value (used by tests and the report, not the hot path)."""
    return _U32.unpack(_F32.pack(value))[0] >> 17


class QuantileSketch:
    """Counts of values per relative-accuracy bucket; mergeable; bounded memory.

    The dense store is one integer with a 64-bit lane per bucket (bucket ``lo + i`` is lane
    ``i``): adding another store's counts (a window's counted sketch, a checkpoint's) is one
    big-integer shift and addition in C, whatever the number of buckets, and its bytes are the
    little-endian uint64 counts checkpoints and the wire carry. A lane never overflows into the
    next: a bucket counts at most a rank's records (below 2**63)."""

    __slots__ = ("lo", "lanes", "n", "zero", "negative", "hot", "_hot", "hot_n", "shift")

    def __init__(self, shift: int = 0) -> None:
        #: mantissa bits dropped from the 1/64-octave buckets: 4 gives 1/4-octave buckets (within
        #: ~9 %), 16x fewer over the same range of values, for a distribution whose shape matters,
        #: not its exact quantiles, and whose range is wide (the gaps between steps: 0.1 ms typical,
        #: pauses of seconds), where the dense store would cost a lane per 1/64 octave
        self.shift = shift
        self.lo = 0
        #: the dense store: bucket ``lo + i``'s count in bits ``64*i .. 64*i + 63``; ``n`` buckets
        self.lanes = 0
        self.n = 0
        self.zero = 0
        #: values below zero seen in sketched samples (-1 = "not measured"); not in quantiles
        self.negative = 0
        #: uncompacted counts (weight 1, and other weights apart), counted in C; ``hot_n`` values
        self.hot: dict[int, int] = {}
        self._hot: dict[int, dict[int, int]] = {}
        self.hot_n = 0

    @property
    def counts(self) -> array:
        """The dense store's counts (array 'Q', bucket ``lo`` first): a copy."""
        out = array("Q")
        if self.n:
            out.frombytes(self.lanes.to_bytes(8 * self.n, "little"))
            if _SWAP:
                out.byteswap()
        return out

    # --- ingest ----------------------------------------------------------------------------
    def add_keys(self, keys: Iterable[int], weight: int = 1) -> None:
        """Count top-16 keys (from :func:`column_keys`), each standing for ``weight`` values."""
        if weight == 1:
            hot = self.hot
        else:
            hot = self._hot.get(weight)
            if hot is None:
                hot = self._hot[weight] = {}
        _count_elements(hot, keys)
        self.hot_n += len(keys)  # type: ignore[arg-type]
        if self.hot_n >= FOLD_VALUES or len(hot) > HOT_MAX:
            self.fold()

    def add(self, values: Sequence[int], weight: int = 1) -> None:
        self.add_keys(column_keys(values), weight)

    def fold(self) -> None:
        """Move the uncompacted counts into the dense store (work per distinct key, not value)."""
        if not self.hot_n:
            return
        block: dict[int, int] = {}
        for weight, hot in [(1, self.hot), *self._hot.items()]:
            for key, count in hot.items():
                if key >= _NEG:
                    self.negative += count * weight
                elif key == 0:
                    self.zero += count * weight
                else:
                    idx = key >> (1 + self.shift)
                    block[idx] = block.get(idx, 0) + count * weight
        self.hot = {}
        self._hot.clear()
        self.hot_n = 0
        if block:
            lo = min(block)
            dense = array("Q", bytes(8 * (max(block) - lo + 1)))
            for idx, count in block.items():
                dense[idx - lo] = count
            self._add_lanes(lo, int.from_bytes(_le(dense), "little"), len(dense))

    def add_dense(self, lo: int, counts: bytes, zero: int = 0, negative: int = 0) -> None:
        """Add the counts (little-endian uint64 bytes) of the buckets from ``lo``: a window's
        counted sketch, as a group relay sends it. One big-integer addition in C."""
        self.zero += zero
        self.negative += negative
        if counts:
            self._add_lanes(lo, int.from_bytes(counts, "little"), len(counts) // 8)

    def _add_lanes(self, lo: int, lanes: int, k: int) -> None:
        if not self.n:
            self.lo, self.lanes, self.n = lo, lanes, k
        elif lo >= self.lo:
            self.lanes += lanes << (64 * (lo - self.lo))
            self.n = max(self.n, lo - self.lo + k)
        else:
            shift = self.lo - lo
            self.lanes = (self.lanes << (64 * shift)) + lanes
            self.lo, self.n = lo, max(self.n + shift, k)
        if self.n > MAX_BUCKETS:  # collapse: the lowest values land in the lowest kept bucket
            c = self.counts
            cut = len(c) - MAX_BUCKETS
            low = sum(c[:cut + 1])
            del c[:cut]
            c[0] = low
            self.lo += cut
            self._set(c)

    def _set(self, counts: array) -> None:
        self.lanes = int.from_bytes(_le(counts), "little")
        self.n = len(counts)

    # --- queries -----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        self.fold()
        return self.zero + sum(self.counts)

    def quantiles(self, qs: Sequence[float]) -> list[Optional[float]]:
        self.fold()
        return quantiles_of(self.lo, self.counts, self.zero, qs, self.shift)

    def split(self, cut: float) -> tuple[int, float, int, float]:
        """(count, sum) of the values at most ``cut`` and (count, sum) of those above it, each
        value taken as its bucket's midpoint (within 0.78 %); zeros count below. What tells a few
        long pauses from time spread over every step (report/pauses.py)."""
        self.fold()
        n_lo, s_lo, n_hi, s_hi = self.zero, 0.0, 0, 0.0
        for i, c in enumerate(self.counts):
            if c:
                v = bucket_value(self.lo + i, self.shift)
                if v > cut:
                    n_hi, s_hi = n_hi + c, s_hi + c * v
                else:
                    n_lo, s_lo = n_lo + c, s_lo + c * v
        return n_lo, s_lo, n_hi, s_hi

    def merge(self, other: "QuantileSketch") -> None:
        """Add ``other``'s counts (a checkpoint's, another rank's): one big-integer addition."""
        if other.shift != self.shift:
            raise ValueError(f"sketches of different resolutions (shift {self.shift} and {other.shift})")
        other.fold()
        self.fold()
        self.zero += other.zero
        self.negative += other.negative
        if other.n:
            self._add_lanes(other.lo, other.lanes, other.n)

    # --- plain data (checkpoints, summaries) ---------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """Plain data: the counts without empty buckets at either end (one form however the
        counts came: keys, or a window's counted buckets)."""
        self.fold()
        c = self.counts
        i, j = 0, len(c)
        while i < j and not c[i]:
            i += 1
        while j > i and not c[j - 1]:
            j -= 1
        if i or j < len(c):
            c = c[i:j]
        out = {"lo": self.lo + i if len(c) else 0, "zero": self.zero, "negative": self.negative,
               "counts": _le(c)}
        if self.shift:
            out["shift"] = self.shift
        return out

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "QuantileSketch":
        sk = cls(int(data.get("shift", 0)))
        sk.lo = int(data["lo"])
        sk.zero = int(data["zero"])
        sk.negative = int(data.get("negative", 0))
        counts = array("Q")
        counts.frombytes(data["counts"])
        if _SWAP:
            counts.byteswap()
        sk._set(counts)
        return sk


_SWAP = sys.byteorder != "little"


def _le(a: array) -> bytes:
    """``a``'s bytes, little-endian (what the lanes, checkpoints and the wire hold)."""
    if _SWAP:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def quantiles_of(lo: int, counts: Sequence[int], zero: int, qs: Sequence[float],
                 shift: int = 0) -> list[Optional[float]]:
    """Quantile estimates from a dense store; ``None`` when it is empty. Cost: one C pass + bisect."""
    cum = list(accumulate(counts))
    total = zero + (cum[-1] if cum else 0)
    if total == 0:
        return [None for _ in qs]
    out: list[Optional[float]] = []
    for q in qs:
        k = int(q * (total - 1))  # 0-based rank of the wanted value
        if k < zero:
            out.append(0.0)
        else:
            out.append(bucket_value(lo + bisect_right(cum, k - zero), shift))
    return out


def merge_dense(lo_a: int, a: Sequence[int], lo_b: int, b: Sequence[int]) -> tuple[int, list[int]]:
    """Sum two dense stores (C-level ``map(add)`` over the overlap)."""
    if not a:
        return lo_b, list(b)
    if not b:
        return lo_a, list(a)
    lo = min(lo_a, lo_b)
    hi = max(lo_a + len(a), lo_b + len(b))
    out = [0] * (hi - lo)
    oa = lo_a - lo
    out[oa:oa + len(a)] = a
    ob = lo_b - lo
    out[ob:ob + len(b)] = map(add, out[ob:ob + len(b)], b)
    return lo, out


def trimmed(lo: int, counts: Sequence[int]) -> tuple[int, list[int]]:
    """Drop leading and trailing empty buckets (for compact serialisation)."""
    counts = list(counts)
    start = 0
    while start < len(counts) and counts[start] == 0:
        start += 1
    end = len(counts)
    while end > start and counts[end - 1] == 0:
        end -= 1
    return lo + start, counts[start:end]


# --- merging many (a run's ranks) ------------------------------------------------------------------
def merged_quantiles(sketches: Iterable[QuantileSketch], qs: Sequence[float]) -> list[Optional[float]]:
    """Quantiles of the union of ``sketches`` (every rank's step times: the run's median step)."""
    acc = QuantileSketch()
    for sk in sketches:
        acc.merge(sk)
    return acc.quantiles(qs)


def merge_serialised(sketches: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One sketch for many serialised ones (:meth:`QuantileSketch.to_data`: a phase of every rank,
    from a checkpoint or the live state), compact (a trimmed list of counts) for the summary's
    JSON, which ``traceml compare`` reads back."""
    acc = QuantileSketch()
    for sk in sketches:
        acc.merge(QuantileSketch.from_data(sk))
    lo, counts = trimmed(acc.lo, acc.counts)
    return {"encoding": ENCODING, "lo": lo, "zero": acc.zero, "counts": counts}
