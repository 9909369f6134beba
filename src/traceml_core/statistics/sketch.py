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
#: empty buckets kept on each side when a store grows for a window's counts
_ROOM = 8
#: index of the top 16 bits of each float32 when viewed as uint16 pairs
_TOP = 1 if sys.byteorder == "little" else 0
_NEG = 0x8000  # sign bit of a top-16 key: a negative value ("not measured")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def column_keys(values: Sequence[int]) -> memoryview:
    """Top-16-bit float32 keys of ``values``, computed in C (raises TypeError for non-numbers)."""
    return memoryview(array("f", values)).cast("B").cast("H")[_TOP::2]


def bucket_value(key6: int) -> float:
    """Representative (midpoint) value of a bucket index."""
    return _F32.unpack(_U32.pack((key6 << 17) | (1 << 16)))[0]


def value_bucket(value: float) -> int:
    """Bucket index of a positive value (used by tests and the report, not the hot path)."""
    return _U32.unpack(_F32.pack(value))[0] >> 17


class QuantileSketch:
    """Counts of values per relative-accuracy bucket; mergeable; bounded memory."""

    __slots__ = ("lo", "counts", "zero", "negative", "hot", "_hot", "hot_n")

    def __init__(self) -> None:
        self.lo = 0
        self.counts = array("Q")
        self.zero = 0
        #: values below zero seen in sketched samples (-1 = "not measured"); not in quantiles
        self.negative = 0
        #: uncompacted counts (weight 1, and other weights apart), counted in C; ``hot_n`` values
        self.hot: dict[int, int] = {}
        self._hot: dict[int, dict[int, int]] = {}
        self.hot_n = 0

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
        counts = self.counts
        for weight, hot in [(1, self.hot), *self._hot.items()]:
            for key, count in hot.items():
                pos = (key >> 1) - self.lo
                if key < _NEG and 0 <= pos < len(counts) and key:
                    counts[pos] += count * weight  # the usual case, inline
                elif key >= _NEG:
                    self.negative += count * weight
                elif key == 0:
                    self.zero += count * weight
                else:
                    self._bump(key >> 1, count * weight)
                    counts = self.counts
        self.hot = {}
        self._hot.clear()
        self.hot_n = 0

    def _bump(self, idx: int, count: int) -> None:
        counts = self.counts
        if not counts:
            self.lo = idx
            counts.append(count)
            return
        pos = idx - self.lo
        if pos < 0:
            width = len(counts) - pos
            if width > MAX_BUCKETS:  # collapse: values this low land in the lowest kept bucket
                counts[0] += count
                return
            self.counts = array("Q", bytes(8 * -pos)) + counts
            self.lo = idx
            self.counts[0] += count
        elif pos >= len(counts):
            counts.extend([0] * (pos + 1 - len(counts)))
            counts[pos] += count
            if len(counts) > MAX_BUCKETS:
                cut = len(counts) - MAX_BUCKETS
                low = sum(counts[: cut + 1])
                del counts[:cut]
                counts[0] = low
                self.lo += cut
        else:
            counts[pos] += count

    # --- queries -----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        self.fold()
        return self.zero + sum(self.counts)

    def quantiles(self, qs: Sequence[float]) -> list[Optional[float]]:
        self.fold()
        return quantiles_of(self.lo, self.counts, self.zero, qs)

    def merge(self, other: "QuantileSketch") -> None:
        """Add ``other``'s counts (a window's, a checkpoint's): one C-level pass when its buckets
        lie within this sketch's, as they do once a rank's values have been seen for a while."""
        other.fold()
        self.fold()
        self.zero += other.zero
        self.negative += other.negative
        oc, c = other.counts, self.counts
        if not oc:
            return
        pos = other.lo - self.lo
        if c and pos >= 0 and pos + len(oc) <= len(c):
            c[pos:pos + len(oc)] = array("Q", map(add, c[pos:pos + len(oc)], oc))
            return
        lo, counts = merge_dense(self.lo, c, other.lo, oc)
        if len(counts) > MAX_BUCKETS:  # collapse: the lowest values land in the lowest kept bucket
            cut = len(counts) - MAX_BUCKETS
            counts = [sum(counts[:cut + 1])] + counts[cut + 1:]
            lo += cut
        self.lo, self.counts = lo, array("Q", counts)

    def add_dense(self, lo: int, counts: Sequence[int], zero: int = 0, negative: int = 0) -> None:
        """Add counts of the buckets from ``lo`` (a window's counted sketch, as a group relay
        sends it): one C-level pass when they lie within this sketch's buckets; else the store
        grows to hold them, with room on both sides for the next windows' (the rank's values
        wander a little), at most :data:`MAX_BUCKETS`."""
        self.zero += zero
        self.negative += negative
        k = len(counts)
        if not k:
            return
        c = self.counts
        pos = lo - self.lo
        if c and pos >= 0 and pos + k <= len(c):
            c[pos:pos + k] = array("Q", map(add, c[pos:pos + k], counts))
            return
        self.fold()
        c = self.counts
        new_lo = max(1, min(lo, self.lo if c else lo) - _ROOM)
        new_hi = max(lo + k, self.lo + len(c) if c else lo + k) + _ROOM
        grown = array("Q", bytes(8 * (new_hi - new_lo)))
        if c:
            grown[self.lo - new_lo:self.lo - new_lo + len(c)] = c
        pos = lo - new_lo
        grown[pos:pos + k] = array("Q", map(add, grown[pos:pos + k], counts))
        if len(grown) > MAX_BUCKETS:  # collapse: the lowest values land in the lowest kept bucket
            cut = len(grown) - MAX_BUCKETS
            low = sum(grown[:cut + 1])
            del grown[:cut]
            grown[0] = low
            new_lo += cut
        self.lo, self.counts = new_lo, grown

    @classmethod
    def of_dense(cls, lo: int, counts: array, zero: int = 0, negative: int = 0) -> "QuantileSketch":
        """A sketch holding ``counts`` (array 'Q') for the buckets from ``lo`` (a window's
        counted sketch, as it travels from a group relay)."""
        sk = cls()
        sk.lo, sk.counts, sk.zero, sk.negative = lo, counts, zero, negative
        return sk

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
        return {"lo": self.lo + i if len(c) else 0, "zero": self.zero, "negative": self.negative,
                "counts": c.tobytes()}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "QuantileSketch":
        sk = cls()
        sk.lo = int(data["lo"])
        sk.zero = int(data["zero"])
        sk.negative = int(data.get("negative", 0))
        counts = array("Q")
        counts.frombytes(data["counts"])
        sk.counts = counts
        return sk


def quantiles_of(lo: int, counts: Sequence[int], zero: int, qs: Sequence[float]) -> list[Optional[float]]:
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
            out.append(bucket_value(lo + bisect_right(cum, k - zero)))
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
    lo, counts, zero = 0, [], 0
    for sk in sketches:
        sk.fold()
        zero += sk.zero
        lo, counts = merge_dense(lo, counts, sk.lo, sk.counts)
    return quantiles_of(lo, counts, zero, qs)


def merge_serialised(sketches: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One sketch for many serialised ones (:meth:`QuantileSketch.to_data`: a phase of every rank,
    from a checkpoint or the live state), compact (a trimmed list of counts) for the summary's
    JSON, which ``traceml compare`` reads back."""
    lo, counts, zero = 0, [], 0
    for sk in sketches:
        zero += sk["zero"]
        dense = array("Q")
        dense.frombytes(sk["counts"])
        lo, counts = merge_dense(lo, counts, sk["lo"], dense)
    lo, counts = trimmed(lo, counts)
    return {"encoding": ENCODING, "lo": lo, "zero": zero, "counts": counts}
