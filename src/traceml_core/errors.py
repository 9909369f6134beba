"""User-facing errors.

Every error a user can cause (a bad flag, a malformed Slurm variable, a job laid out wrong) is
raised as a :class:`TraceMLError` whose message is one paragraph naming the variable or flag, the
value seen and the fix. The CLI prints the message and exits with the error's status; it never
shows a traceback for these.
"""

from __future__ import annotations

from typing import Any


class TraceMLError(Exception):
    """An error the user can fix; ``str(err)`` is the whole message."""

    exit_code = 1


class ConfigError(TraceMLError):
    """The launch configuration cannot be resolved (bad value, bad job layout)."""

    exit_code = 2

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


#: values longer than this are shortened in messages (an error is one readable paragraph)
SHOW_CHARS = 80


def show(value: Any) -> str:
    """``repr(value)``, shortened when long: ``'99999...' (5,000 characters)``."""
    if isinstance(value, str) and len(value) > SHOW_CHARS:
        return f"{value[:SHOW_CHARS // 2]!r}... ({len(value):,} characters)"
    return repr(value)
