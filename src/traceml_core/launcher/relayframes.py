"""What the per-node relay does to a rank's ``steps`` frames (already validated): merge them.

Merging: consecutive ``steps`` frames of one rank whose ``seq`` ranges touch become one frame
(``seq`` of the first, ``n`` the sum, columns concatenated, ``dropped`` the larger cumulative
count), so the aggregator pays its per-frame cost once per relay flush instead of once per client
batch. Frames that do not touch (the client dropped records in between) are never merged, so the
aggregator still sees the gap exactly where it was.

Each merged frame then goes up as its statistics (a ``fold`` frame, wire/fold.py, of one
:class:`~traceml_core.statistics.window.WindowStats`), so node 0 merges values per rank and window
instead of computing statistics from every record.
"""

from __future__ import annotations

from typing import Any

from ..wire.protocol import STEP_COLUMNS

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
    if nxt.get("open") is not None:  # what the rank holds unsent: its latest word
        cur["open"] = nxt["open"]
    return True


def steps_frame(msg: dict[str, Any]) -> dict[str, Any]:
    """A ``steps`` frame holding only the protocol's fields (what a merge starts from)."""
    cols = msg["cols"]
    out = {"t": "steps", "rank": msg["rank"], "seq": msg["seq"], "n": msg["n"],
           "cols": {name: cols[name] for name in STEP_COLUMNS}, "dropped": msg.get("dropped", 0)}
    if msg.get("open") is not None:
        out["open"] = msg["open"]
    return out
