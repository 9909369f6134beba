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

from ..stats.series import (  # noqa: F401  (the series rows' layout is the series')
    BUCKETS, MAX_ROWS, R_MAX0, R_MEM_MAX, R_OUT_CNT, R_PHASE_CNT, R_PHASE_SUM, R_STEP_CNT, R_STEP_MAX,
    R_STEP_SUM, R_T_END, ROW, ROW_COUNTS, SERIES_PHASES, SPAN, series_width,
)
from ..stats.window import MAX_RECORDS, MAX_VALUE, SKETCH_CAP, in_range, pack, unpack  # noqa: F401
from .protocol import DURATION_COLUMNS, SUM_COLUMNS

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


def fold_len(k: int) -> int:
    """Length of ``v`` with ``k`` series rows."""
    return ROWS0 + k * len(ROW)
