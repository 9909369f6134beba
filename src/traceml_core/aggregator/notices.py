"""Lines for the job's log that node 0's aggregator decides while the run goes on (a hang named, a
rank working through a long pause, a straggler confirmed, a stall that ended).

The aggregator's own stderr is a second voice in the log; these lines are said by node 0's
launcher instead, in its voice, as it polls the aggregator every second: each status answer
carries the lines after the last one the launcher printed (``notices_after``). Bounded: a
launcher that does not poll misses the oldest, never blocks anything.
"""

from __future__ import annotations

from collections import deque
from typing import Any

#: lines kept for the launcher to print (it polls every second: a few are plenty)
MAX_NOTICES = 64


class Notices:
    def __init__(self) -> None:
        self._lines: deque[tuple[int, str]] = deque(maxlen=MAX_NOTICES)
        self._seq = 0

    def say(self, line: str) -> None:
        self._seq += 1
        self._lines.append((self._seq, line))

    def after(self, seq: int) -> list[list[Any]]:
        """``[[n, line], ...]`` for the lines numbered above ``seq``."""
        return [[n, line] for n, line in self._lines if n > seq]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._lines)
