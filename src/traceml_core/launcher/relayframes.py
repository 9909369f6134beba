"""What the per-node relay does to single frames: check a rank's frame, merge contiguous steps.

The relay is the trust boundary for its node's ranks: the aggregator accepts the ``rank`` field of
a relayed frame as given, so a frame must name the rank whose authenticated connection carried it,
and must have the shape the aggregator checks (a frame that fails the aggregator's shape checks
would otherwise cost every rank of the node: see server.py). Values inside the columns are checked
by the aggregator when it computes statistics (a bad batch is rejected there and counted).

Merging: consecutive ``steps`` frames of one rank whose ``seq`` ranges touch become one frame
(``seq`` of the first, ``n`` the sum, columns concatenated, ``dropped`` the larger cumulative
count), so the aggregator pays its per-frame cost once per relay flush instead of once per client
batch. Frames that do not touch (the client dropped records in between) are never merged, so the
aggregator still sees the gap exactly where it was.
"""

from __future__ import annotations

from typing import Any, Optional

import msgpack

from ..wire.protocol import HEADER, STEP_COLUMNS

BYE_STATUSES = ("clean", "error", "interrupted")
#: a merged frame holds at most this many records (9 columns of at most 9 bytes: < 4 MiB)
MAX_MERGED_RECORDS = 32768
_packb = msgpack.packb


def check_rank_frame(msg: dict[str, Any], rank: int, node: int) -> Optional[str]:
    """Why ``msg`` (from rank ``rank``'s connection) must not be forwarded; None when it is fine."""
    t = msg.get("t")
    if t == "steps":
        if msg.get("rank") != rank:
            return f"steps for rank {msg.get('rank')!r} on rank {rank}'s connection"
        seq, n, dropped = msg.get("seq"), msg.get("n"), msg.get("dropped", 0)
        if type(seq) is not int or type(n) is not int or type(dropped) is not int \
                or seq < 0 or n < 0 or dropped < 0:
            return "steps: seq, n and dropped must be non-negative integers"
        cols = msg.get("cols")
        if type(cols) is not dict:
            return "steps: cols must be a map"
        for name in STEP_COLUMNS:
            col = cols.get(name)
            if type(col) is not list or len(col) != n:
                return f"steps: column {name!r} is not a list of {n} values"
        return None
    if t == "event":
        if msg.get("rank") != rank:
            return f"event for rank {msg.get('rank')!r} on rank {rank}'s connection"
        if not isinstance(msg.get("kind"), str) or not isinstance(msg.get("text"), str):
            return "event: kind and text must be strings"
        return None
    if t == "bye":
        if msg.get("rank", rank) != rank:
            return f"bye for rank {msg.get('rank')!r} on rank {rank}'s connection"
        if msg.get("status") not in BYE_STATUSES:
            return f"bye: unknown status {str(msg.get('status'))[:20]!r}"
        steps, dropped = msg.get("steps"), msg.get("dropped")
        if steps is not None and type(steps) is not int:
            return "bye: steps must be an integer"
        if dropped is not None and type(dropped) is not int:
            return "bye: dropped must be an integer"
        return None
    if t == "system":
        if msg.get("node", node) != node:
            return f"system frame for node {msg.get('node')!r} on node {node}'s relay"
        return None
    return f"unknown frame type {str(t)[:20]!r}"


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


def encode_frame(msg: dict[str, Any]) -> bytes:
    body = _packb(msg, use_bin_type=True)
    return HEADER.pack(len(body)) + body
