"""What a relay holds for its upstream: encoded frames in order, every byte and record accounted.

Both relays (a node's, launcher/relay.py, and a group's, launcher/grouprelay.py) put frames here
from their own thread; their upstream :class:`~traceml_core.wire.client.TelemetryClient` takes
them from its thread through the :class:`~traceml_core.wire.client.RecordSource` methods. The
counters that cross the two threads are each written by one of them only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(slots=True)
class Outgoing:
    """One encoded frame for node 0 (or the group relay above)."""

    data: bytes
    #: the rank whose records or losses it carries (-1: none)
    rank: int = -1
    #: step records it carries (a window's statistics)
    records: int = 0
    #: a loss frame: the drop count of ``rank`` it tells upstream (None: not a loss frame)
    told: Optional[int] = None


class OutQueue:
    """The upstream queue of one relay, and its client's record source. ``on_told(rank, count)``:
    a loss frame reached the upstream socket (the relay then knows node 0 knows)."""

    def __init__(self, on_told: Callable[[int, int], None] = lambda _r, _n: None) -> None:
        self._items: deque[Outgoing] = deque()
        self._on_told = on_told
        self.bytes_queued = 0       # relay thread
        self.records_dropped = 0    # relay thread: records it dropped (its budget was full)
        self.bytes_gone = 0         # client thread: sent or discarded
        self.records_forwarded = 0  # client thread: records handed to the upstream socket
        self.frames_forwarded = 0
        self.records_unsent = 0     # client thread: discarded at a refusal or the close deadline

    def put(self, item: Outgoing) -> int:
        """Queue ``item`` (relay thread); returns its size."""
        self._items.append(item)
        self.bytes_queued += len(item.data)
        return len(item.data)

    @property
    def queued(self) -> int:
        """Bytes queued and not yet sent or discarded."""
        return self.bytes_queued - self.bytes_gone

    def __len__(self) -> int:
        return len(self._items)

    # --- RecordSource (the client thread) -------------------------------------------------------
    def ready(self) -> int:
        return len(self._items)

    def pop(self) -> Optional[Outgoing]:
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def unpop(self, item: Outgoing) -> None:
        self._items.appendleft(item)

    def frame(self, item: Outgoing) -> bytes:
        return item.data

    def records(self, item: Outgoing) -> int:
        return item.records

    def recycle(self, item: Outgoing) -> None:
        self.bytes_gone += len(item.data)
        if item.told is not None:
            self._on_told(item.rank, item.told)
        elif item.records:
            self.records_forwarded += item.records
            self.frames_forwarded += 1

    def discard(self, item: Outgoing) -> None:
        self.bytes_gone += len(item.data)
        self.records_unsent += item.records

    @property
    def lost(self) -> int:
        return self.records_dropped + self.records_unsent
