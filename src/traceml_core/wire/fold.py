"""The ``fold`` frame: one rank's step records of one relay window, folded into partial statistics.

Why: node 0's cost must grow with nodes, not with steps x ranks. A node's relay already merges a
rank's ``steps`` frames per window (launcher/relayframes.py); with folding it also computes what
node 0's :class:`~traceml_core.aggregator.rankstate.RankState` would compute from those records
(counts, sums, maxima, minima, the warm-up split, the sketch's bucket keys, the per-step-bucket
series, the time outside ``trace_step``), so node 0 only adds partials: a fixed number of integer
operations per rank and window, whatever the window holds. Exactness is kept where it was exact:
``seq``/``n``/``dropped``/``open`` are those of the merged ``steps`` frame, so node 0's sequence,
gap and loss accounting is unchanged; counts, sums and maxima are over every record; the sketch
keys are the same systematic sample node 0 took (at most :data:`SKETCH_CAP` per window, weighted).

Shape (all integers; the layout lives here, once, for the relay that writes it, the validator in
wire/frames.py and the aggregator that reads it)::

    {"t": "fold", "rank", "seq", "n", "dropped", "open"?,   # as in ``steps``
     "v": int64s [HEAD..., PHASE x len(DURATION_COLUMNS), MEM, SUM x len(SUM_COLUMNS), SERIES_HEAD,
                  ROW x k (row by row)],
     "o": int64s [outside sum of the window, outside sum of each of the k series rows],  # signed
     "keys": uint16s} # sketch keys (aggregator/sketch.column_keys), phase after phase

``int64s``/``uint16s``: packed little-endian arrays (msgpack bin): node 0 reads them with one C
call each (:func:`unpack`) instead of decoding and type-checking a hundred msgpack integers per
rank and window. Values of ``v`` are in -1..MAX_VALUE (-1: none / not measured); ``o`` (time
outside the steps, negative after a clock step) is any int64.

The series rows are sub-buckets of ``g`` consecutive records (a power of two) aligned on
multiples of ``g``, ``b0 = seq // g`` the first: the relay chooses ``g`` with the rule node 0's
:class:`~traceml_core.aggregator.series.Series` uses for its width (the last record's bucket below
``BUCKETS``, at most ``SPAN`` buckets per window); node 0's width is a power of two at least ``g``,
so each row falls in exactly one of node 0's buckets and the series is exact, not shared out.
When the whole window lies in one sub-bucket (the usual case once a run is a few minutes old)
``k`` is 0 and the row is left out: it would repeat the window's totals (``o`` is then just the
window's outside time).
"""

from __future__ import annotations

import sys
from array import array
from typing import Sequence

from .protocol import DURATION_COLUMNS, SUM_COLUMNS

#: values of ``v`` (and magnitudes in ``o``) are at most this (wire/frames.MAX_VALUE)
MAX_VALUE = 1 << 62

#: fold frames carry at most this many sketch keys per phase and window (the rest of a large
#: window is sampled systematically, each key standing for ``stride`` records: node 0's rule)
SKETCH_CAP = 16

# --- the layout of "v" ---------------------------------------------------------------------------
#: last_step, first t_end, last t_end, the first record's step_ns (-1: not measured), the sketch
#: weight (stride), intervals of outside-step time inside the window (-1: not computed)
HEAD = ("last_step", "t_first", "t_last", "step_first", "weight", "out_n")
H_LAST_STEP, H_T_FIRST, H_T_LAST, H_STEP_FIRST, H_WEIGHT, H_OUT_N = range(len(HEAD))
#: per duration column: measured records, their sum, max, min (over the sketched ones, as node 0
#: did; -1 when none), the warm-up count and sum, and how many sketch keys it has in ``keys``
PHASE = ("count", "sum", "max", "min", "warm_count", "warm_sum", "nkeys")
P_COUNT, P_SUM, P_MAX, P_MIN, P_WARM_COUNT, P_WARM_SUM, P_NKEYS = range(len(PHASE))
PHASE0 = len(HEAD)
PW = len(PHASE)
#: peak memory: measured records, sum, max
MEM = ("count", "sum", "max")
MEM0 = PHASE0 + PW * len(DURATION_COLUMNS)
#: per sum column: measured records, sum, max, warm-up count and sum
SUMS = ("count", "sum", "max", "warm_count", "warm_sum")
SUM0 = MEM0 + len(MEM)
#: the series: sub-bucket width g, first sub-bucket b0, number of rows k
SERIES_HEAD = ("g", "b0", "k")
S_G, S_B0, S_K = range(SUM0 + len(SUMS) * len(SUM_COLUMNS),
                       SUM0 + len(SUMS) * len(SUM_COLUMNS) + len(SERIES_HEAD))
ROWS0 = S_K + 1
#: the other duration columns whose sums the series keeps per bucket (step_ns has its own fields)
SERIES_PHASES = tuple(p for p in DURATION_COLUMNS if p != "step_ns")
#: the fields of a series row, in the order node 0's series stores a bucket (aggregator/series.py):
#: first those that count records (step_ns, each of SERIES_PHASES, outside-step intervals; each at
#: most the window's records), then the other fields that are summed (step sum, the sum of each of
#: SERIES_PHASES), then those that are maxima (step max, memory max, last t_end); outside-step sums
#: are in ``o`` (signed). The rows are stored row by row: field ``f`` of row ``i`` is
#: ``v[ROWS0 + i * len(ROW) + f]``, so node 0 copies the rows of fresh buckets as bytes.
ROW_COUNTS = ("step_cnt", *(f"{p}_cnt" for p in SERIES_PHASES), "out_cnt")
ROW = (*ROW_COUNTS, "step_sum", *(f"{p}_sum" for p in SERIES_PHASES), "step_max", "mem_max", "t_end")
R_STEP_CNT = 0
R_PHASE_CNT = 1          # + index in SERIES_PHASES
R_OUT_CNT = len(ROW_COUNTS) - 1
R_STEP_SUM = len(ROW_COUNTS)
R_PHASE_SUM = R_STEP_SUM + 1  # + index in SERIES_PHASES
#: fields from here on are maxima (-1: none), the ones before are summed
R_MAX0 = R_PHASE_SUM + len(SERIES_PHASES)
R_STEP_MAX, R_MEM_MAX, R_T_END = range(R_MAX0, R_MAX0 + 3)
assert ROW[R_MAX0:] == ("step_max", "mem_max", "t_end") and len(ROW) == R_MAX0 + 3
#: records one window may hold (the relay merges at most 32,768)
MAX_RECORDS = 1 << 20
#: the per-rank series' buckets, and the most buckets one batch may straddle (else the width
#: doubles); aggregator/series.py keeps its series by these rules, the relay folds by them
BUCKETS = 256
SPAN = 8
#: so a window has at most this many rows
MAX_ROWS = SPAN + 1


def series_width(seq: int, n: int, width: int = 1) -> int:
    """The smallest power of two, at least ``width``, whose buckets hold records ``seq..seq+n-1``
    in at most :data:`SPAN` buckets, the last one below :data:`BUCKETS`."""
    last = seq + n - 1
    while last // width >= BUCKETS or n > SPAN * width:
        width *= 2
    return width


def fold_len(k: int) -> int:
    """Length of ``v`` with ``k`` series rows."""
    return ROWS0 + k * len(ROW)


_SWAP = sys.byteorder != "little"


def pack(values: Sequence[int], code: str = "q") -> bytes:
    """``values`` as a packed little-endian array (``q``: int64, ``H``: uint16)."""
    a = array(code, values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


#: top bytes (the last of each little-endian int64) of values certainly in 0..MAX_VALUE - 1, and
#: of -1; deleted by :func:`in_range`, which then decides the rest exactly
_FAST_TOPS = bytes(range(MAX_VALUE >> 56)) + b"\xff"


def in_range(data: bytes, values: list[int]) -> bool:
    """Whether every value is in -1..:data:`MAX_VALUE`; ``values`` is ``unpack(data).tolist()``.

    Why not ``min``/``max``: they compare each (large) Python int twice, which was a third of the
    validation of a fold frame with series rows. Here the common case is C-level passes over the
    wire bytes: every top byte below ``MAX_VALUE``'s (so 0 <= value < MAX_VALUE) or 0xff (a
    negative value of at least -2**56), and as many 0xff top bytes as values equal to -1 (so
    every such negative value is -1). Anything else (e.g. a value of exactly MAX_VALUE) is
    decided by ``min``/``max``, so the answer is always theirs."""
    tops = data[7::8]
    if not tops.translate(None, _FAST_TOPS) and tops.count(0xFF) == values.count(-1):
        return True
    return not values or (max(values) <= MAX_VALUE and min(values) >= -1)


def unpack(data: bytes, code: str = "q") -> array:
    """The array :func:`pack` made (raises ValueError when ``data`` is not whole items)."""
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a
