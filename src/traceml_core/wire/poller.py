"""The readiness poller under the aggregator's loop: ``epoll`` on Linux, ``selectors`` elsewhere.

``selectors`` builds a ``(SelectorKey, mask)`` pair in Python for every ready socket; with
thousands of ranks each sending ten small frames a second that is a measurable share of the loop,
so on Linux the loop talks to ``select.epoll`` directly and keeps its own fd -> object map.
"""

from __future__ import annotations

import select
import selectors
from typing import Any

READ = 1
WRITE = 2


class Poller:
    def __init__(self) -> None:
        self._ep = select.epoll() if hasattr(select, "epoll") else None
        self._sel = None if self._ep is not None else selectors.DefaultSelector()
        self.objects: dict[int, Any] = {}

    def _mask(self, events: int) -> int:
        if self._ep is None:
            return ((selectors.EVENT_READ if events & READ else 0)
                    | (selectors.EVENT_WRITE if events & WRITE else 0))
        return ((select.EPOLLIN if events & READ else 0)
                | (select.EPOLLOUT if events & WRITE else 0))

    def register(self, fd: int, events: int, obj: Any) -> None:
        self.objects[fd] = obj
        if self._ep is not None:
            self._ep.register(fd, self._mask(events))
        else:
            self._sel.register(fd, self._mask(events), obj)  # type: ignore[union-attr]

    def modify(self, fd: int, events: int) -> None:
        if fd not in self.objects:
            return
        if self._ep is not None:
            self._ep.modify(fd, self._mask(events))
        else:
            self._sel.modify(fd, self._mask(events), self.objects[fd])  # type: ignore[union-attr]

    def unregister(self, fd: int) -> None:
        self.objects.pop(fd, None)
        try:
            if self._ep is not None:
                self._ep.unregister(fd)
            else:
                self._sel.unregister(fd)  # type: ignore[union-attr]
        except (KeyError, ValueError, OSError):
            pass

    def poll(self, timeout: float) -> list[tuple[Any, bool, bool]]:
        """Ready objects as ``(obj, readable, writable)``; errors and hang-ups count as readable
        (the read then sees the end of the connection)."""
        out = []
        get = self.objects.get
        if self._ep is not None:
            err = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP
            for fd, ev in self._ep.poll(timeout):
                obj = get(fd, _MISSING)
                if obj is not _MISSING:
                    out.append((obj, bool(ev & err), bool(ev & select.EPOLLOUT)))
            return out
        for key, mask in self._sel.select(timeout):  # type: ignore[union-attr]
            out.append((key.data, bool(mask & selectors.EVENT_READ),
                        bool(mask & selectors.EVENT_WRITE)))
        return out

    def close(self) -> None:
        if self._ep is not None:
            self._ep.close()
        else:
            self._sel.close()  # type: ignore[union-attr]


_MISSING = object()
__all__ = ["Poller", "READ", "WRITE"]
