"""The ``fold`` frame: the statistics of one window of a rank's records, and the ``tail`` frame.

Why: node 0's cost must grow with nodes, not with steps x ranks. A node's relay merges a rank's
``steps`` frames per window (launcher/relayframes.py) and sends the window's statistics, one
:class:`~traceml_core.statistics.window.WindowStats`, instead of the records: node 0 only merges
values, a fixed number of C-level passes per rank and window whatever the window holds. It is
node 0's one way in for step statistics, in every mode.

Shape (all integers)::

    {"t": "fold", "rank", "seq", "n", "dropped", "open"?,   # the window's records, as in ``steps``
     "v": int64s,     # the value's fixed fields (statistics/window.FIELDS), the series head g, b0, k
                      # and its k rows (statistics/series.ROW each), row by row
     "o": int64s,     # the time outside the steps (signed), then each row's
     "keys": uint16s} # sketch keys, phase after phase (statistics/sketch.column_keys), or, for
                      # a group relay's merged windows (launcher/grouprelay.py), counted sketches:
                      # "sk": int64s (per phase: first bucket, buckets, zeros, negatives) and
                      # "sc": uint64s (the buckets' counts), in place of "keys"

The layout is the value's own field list, and so is the check: :func:`value_of` is
:meth:`WindowStats.from_wire <traceml_core.statistics.window.WindowStats.from_wire>`, which checks
every rule of the value. ``seq``/``n``/``dropped``/``open`` are those of the merged ``steps``
frame, so node 0's sequence, gap and loss accounting is that of the records.

``int64s``/``uint16s``: packed little-endian arrays (msgpack bin): node 0 reads them with one C
call each instead of decoding and type-checking a hundred msgpack integers per rank and window.

The live views (``--mode cli|dashboard``, one node) also show each rank's last records; there
the relay sends them beside the window's ``fold``, as a ``tail`` frame
``{"t": "tail", "rank", "seq", "n", "cols"}`` (the window's last ``n`` <= :data:`TAIL_MAX`
records, columns as in ``steps``): node 0 keeps them for the views and computes nothing from them.
"""

from __future__ import annotations

from typing import Any, Optional

from ..statistics.window import WindowStats

#: records a ``tail`` frame carries at most (what the live views read per rank: its last 64)
TAIL_MAX = 64


def fold_frame(rank: int, value: WindowStats, dropped: int = 0, open_: Optional[int] = None) -> dict[str, Any]:
    """The ``fold`` frame of one window of ``rank``'s records."""
    frame = {"t": "fold", "rank": rank, "seq": value.seq, "n": value.records, "dropped": dropped,
             **value.to_wire()}
    if open_ is not None:
        frame["open"] = open_
    return frame


def value_of(msg: dict[str, Any]) -> WindowStats:
    """The value a ``fold`` frame carries, checked (raises ValueError naming the broken rule)."""
    return WindowStats.from_wire(msg["seq"], msg["n"], msg)


def tail_frame(rank: int, seq: int, n: int, cols: dict[str, list[int]]) -> dict[str, Any]:
    """The ``tail`` frame of a window of ``n`` records from ``seq``: its last TAIL_MAX records."""
    k = min(n, TAIL_MAX)
    return {"t": "tail", "rank": rank, "seq": seq + n - k, "n": k,
            "cols": {name: col[n - k:] for name, col in cols.items()}}
