"""What the per-node relay does to a rank's ``steps`` frames (already validated): merge, then fold.

Merging: consecutive ``steps`` frames of one rank whose ``seq`` ranges touch become one frame
(``seq`` of the first, ``n`` the sum, columns concatenated, ``dropped`` the larger cumulative
count), so the aggregator pays its per-frame cost once per relay flush instead of once per client
batch. Frames that do not touch (the client dropped records in between) are never merged, so the
aggregator still sees the gap exactly where it was.

Folding (:func:`fold_frame`, in summary mode): each merged frame becomes a ``fold`` frame
(wire/fold.py) holding the records' partial statistics instead of the records, so node 0 adds
partials per rank and window instead of computing statistics from every record.
"""

from __future__ import annotations

from typing import Any

from ..aggregator.sketch import column_keys
from ..report.thresholds import WARMUP_STEPS
from ..wire import fold
from ..wire.protocol import DURATION_COLUMNS, STEP_COLUMNS, SUM_COLUMNS

#: a merged frame holds at most this many records (9 columns of at most 9 bytes: < 4 MiB)
MAX_MERGED_RECORDS = 32768


def merge_into(cur: dict[str, Any], nxt: dict[str, Any]) -> bool:
    """Append ``nxt``'s records to ``cur`` when they continue it; True when merged.

    ``cur`` must be a frame this module owns (its column lists are extended in place)."""
    n = cur["n"]
    if nxt["seq"] != cur["seq"] + n or n + nxt["n"] > MAX_MERGED_RECORDS:
        return False
    cols, more = cur["cols"], nxt["cols"]
    for name in STEP_COLUMNS:
        cols[name] += more[name]
    cur["n"] = n + nxt["n"]
    d = nxt.get("dropped", 0)
    if d > cur.get("dropped", 0):
        cur["dropped"] = d
    return True


def steps_frame(msg: dict[str, Any]) -> dict[str, Any]:
    """A ``steps`` frame holding only the protocol's fields (what a merge starts from)."""
    cols = msg["cols"]
    return {"t": "steps", "rank": msg["rank"], "seq": msg["seq"], "n": msg["n"],
            "cols": {name: cols[name] for name in STEP_COLUMNS}, "dropped": msg.get("dropped", 0)}


def fold_frame(msg: dict[str, Any], cap: int = fold.SKETCH_CAP) -> dict[str, Any]:
    """The ``fold`` frame (wire/fold.py) of one merged, validated ``steps`` frame: what node 0's
    rank state computes from these records, computed here, so node 0 adds partials.

    The rules are node 0's (aggregator/rankstate.py, ``RankState._process``): counts, sums and
    maxima over every measured record (-1 = not measured), minima and sketch keys over a
    systematic sample of at most ``cap`` records (each standing for ``stride``), the warm-up split
    by ``seq``, outside-step time only when every record has its step time. Cost: C-level passes
    over each column and over each series row's slice, never a Python statement per record.
    Raises ValueError when a sum does not fit the frame (values near the protocol's limit): the
    relay then sends the records themselves."""
    seq, n, cols = msg["seq"], msg["n"], msg["cols"]
    t_end, steps = cols["t_end_ns"], cols["step_ns"]
    g = fold.series_width(seq, n)
    b0 = seq // g
    k = (seq + n - 1) // g - b0 + 1
    bounds = [(max(b * g - seq, 0), min((b + 1) * g - seq, n)) for b in range(b0, b0 + k)]
    if n <= cap:
        stride, off = 1, 0
    else:
        stride = -(-n // cap)
        off = (seq * 2654435761) % stride
    warm = WARMUP_STEPS - seq  # records of this window in the warm-up (if > 0)
    step_all = min(steps) >= 0
    out_n = n - 1 if step_all else -1
    v = [cols["step"][-1], t_end[0], t_end[-1], steps[0], stride, out_n]
    # the series rows, built field by field (wire/fold.py: ROW): rows[f][i] is field f of row i
    rows = [[0] * k for _ in fold.ROW]
    rows[fold.R_STEP_MAX] = [-1] * k
    rows[fold.R_MEM_MAX] = [-1] * k
    rows[fold.R_T_END] = [t_end[hi - 1] for _lo, hi in bounds]
    o = [0] * (k + 1)
    keys: list[int] = []
    for name in DURATION_COLUMNS:
        col = cols[name]
        mx = max(col)
        if mx < 0:
            v += (0, 0, -1, -1, 0, 0, 0)
            continue
        every = min(col) >= 0
        measured = col if every else [x for x in col if x >= 0]
        sample = measured if stride == 1 else (
            col[off::stride] if every else (measured[off % len(measured)::stride] or measured))
        wv = [x for x in col[:warm] if x >= 0] if warm > 0 else ()
        v += (len(measured), sum(measured), mx, min(sample), len(wv), sum(wv), len(sample))
        keys += sample
        if name == "step_ns":
            sums, cnts, maxs = rows[fold.R_STEP_SUM], rows[fold.R_STEP_CNT], rows[fold.R_STEP_MAX]
        else:
            at = fold.SERIES_PHASES.index(name)
            sums, cnts, maxs = rows[fold.R_PHASE_SUM + at], rows[fold.R_PHASE_CNT + at], None
        for i, (lo, hi) in enumerate(bounds):
            part = col[lo:hi] if every else [x for x in col[lo:hi] if x >= 0]
            if part:
                sums[i] = sum(part)
                cnts[i] = len(part)
                if maxs is not None:
                    maxs[i] = max(part)
    mem = cols["mem_peak"]
    mem_max = max(mem)
    if mem_max >= 0:
        measured = mem if min(mem) >= 0 else [x for x in mem if x >= 0]
        v += (len(measured), sum(measured), mem_max)
        rows[fold.R_MEM_MAX] = [max(mem[lo:hi]) for lo, hi in bounds]
    else:
        v += (0, 0, -1)
    for name in SUM_COLUMNS:
        col = cols[name]
        mx = max(col)
        if mx < 0:
            v += (0, 0, -1, 0, 0)
            continue
        measured = col if min(col) >= 0 else [x for x in col if x >= 0]
        wv = [x for x in col[:warm] if x >= 0] if warm > 0 else ()
        v += (len(measured), sum(measured), mx, len(wv), sum(wv))
    if step_all:  # outside trace_step: wall time between step ends less the steps' own time
        o[0] = (t_end[-1] - t_end[0]) - (sum(steps) - steps[0])
        out_cnt = rows[fold.R_OUT_CNT]
        for i, (lo, hi) in enumerate(bounds):
            if lo == 0:
                o[i + 1] = (t_end[hi - 1] - t_end[0]) - sum(steps[1:hi])
                out_cnt[i] = hi - 1
            else:
                o[i + 1] = (t_end[hi - 1] - t_end[lo - 1]) - sum(steps[lo:hi])
                out_cnt[i] = hi - lo
    if max(v) > fold.MAX_VALUE or max(map(abs, o)) > fold.MAX_VALUE:
        # sums of values near the limit (valid one by one): node 0 would refuse the frame
        raise ValueError("a sum of this window is too large for a fold frame")
    if k == 1:  # the one row would repeat the window's totals
        k = 0
        del o[1:]
    v += (g, b0, k)
    for row in zip(*rows) if k else ():  # row by row (wire/fold.py)
        v += row
    frame = {"t": "fold", "rank": msg["rank"], "seq": seq, "n": n, "dropped": msg.get("dropped", 0),
             "v": fold.pack(v), "o": fold.pack(o), "keys": fold.pack(column_keys(keys), "H") if keys else b""}
    if msg.get("open") is not None:
        frame["open"] = msg["open"]
    return frame
