"""Slurm time limits: every format ``sbatch --time`` accepts, parsed the way Slurm parses them.

``man sbatch``: "Acceptable time formats include "minutes", "minutes:seconds", "hours:minutes:seconds",
"days-hours", "days-hours:minutes" and "days-hours:minutes:seconds"", "A time limit of zero requests
that no time limit be imposed", and "second values are rounded up to the next minute". Slurm's parser
(``time_str2mins``) also takes ``UNLIMITED``, ``INFINITE`` and ``-1`` for no limit; ``sinfo``
prints partition limits as ``infinite`` or in the ``[D-]HH:MM:SS`` / ``MM:SS`` forms, which the same
function reads. Like Slurm, we do not bound the fields (``90`` minutes and ``1:90:00`` are both fine).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

FORMATS = ("MINUTES", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS", "UNLIMITED", "INFINITE", "0")
FORMATS_TEXT = ("minutes (90), minutes:seconds (90:30), hours:minutes:seconds (12:00:00), days-hours (2-12), "
                "days-hours:minutes (2-12:30), days-hours:minutes:seconds (2-12:30:00), or UNLIMITED / "
                "INFINITE / 0 for no limit")
_NUM = r"(\d+)"
_PATTERNS = (
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}:{_NUM}$"), ("d", "h", "m", "s")),
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}$"), ("d", "h", "m")),
    (re.compile(rf"^{_NUM}-{_NUM}$"), ("d", "h")),
    (re.compile(rf"^{_NUM}:{_NUM}:{_NUM}$"), ("h", "m", "s")),
    (re.compile(rf"^{_NUM}:{_NUM}$"), ("m", "s")),
    (re.compile(rf"^{_NUM}$"), ("m",)),
)
_UNLIMITED = ("UNLIMITED", "INFINITE", "-1")


@dataclass(frozen=True)
class TimeLimit:
    """A parsed limit: ``text`` as given, ``seconds`` (None: no limit) and Slurm's whole ``minutes``."""

    text: str
    seconds: Optional[int]

    @property
    def unlimited(self) -> bool:
        return self.seconds is None

    @property
    def minutes(self) -> Optional[int]:
        return None if self.seconds is None else math.ceil(self.seconds / 60)

    def describe(self) -> str:
        if self.seconds is None:
            return "no limit"
        return format_minutes(self.minutes or 0)


def parse_time(text: str) -> TimeLimit:
    """Parse a Slurm time limit; ``ValueError`` names every accepted format."""
    raw = str(text).strip()
    if raw.upper() in _UNLIMITED:
        return TimeLimit(raw, None)
    for pattern, fields in _PATTERNS:
        m = pattern.match(raw)
        if not m:
            continue
        parts = dict(zip(fields, (int(g) for g in m.groups())))
        seconds = ((parts.get("d", 0) * 24 + parts.get("h", 0)) * 60 + parts.get("m", 0)) * 60 + parts.get("s", 0)
        return TimeLimit(raw, None if seconds == 0 else seconds)
    raise ValueError(f"is not a Slurm time limit; use {FORMATS_TEXT}")


def format_minutes(minutes: int) -> str:
    """Minutes as Slurm prints them: ``D-HH:MM:SS`` from a day up, ``HH:MM:SS`` below."""
    days, rest = divmod(int(minutes), 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"
