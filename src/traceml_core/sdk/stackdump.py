"""The rank side of the hang autopsy: every thread's Python stack, on request, even when stuck.

``install()`` (called by ``init()`` under ``traceml run``) registers :mod:`faulthandler` for one
real-time signal, writing to ``<stack_dir>/rank<R>.stacks``. faulthandler's handler runs in C in
the signal handler itself: it needs neither the GIL nor the main thread, so it answers while the
main thread is blocked inside a collective, a CUDA call, a lock or a C extension, which is
exactly when it is needed. The launcher of the rank's node (:mod:`traceml_core.launcher.stacks`)
truncates the file, sends the signal and reads what was written. The file is opened for appending,
so the rank always writes at the current end.

A real-time signal (``SIGRTMIN + 6``) is used so the dump never collides with what clusters and
users send (SIGUSR1/2 for Slurm's ``--signal``, SIGTERM, SIGQUIT) and is never delivered by
anything else. Nothing here ever raises into training.

:func:`snapshot` is the softer companion for a rank whose interpreter still runs (the client
thread answers a request with it): the collective in flight, when the SDK saw it launched, and
where the step counter stands.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:   # (the launcher imports this module: it stays free of the SDK's hot path)
    from .step import StepState

#: offset of the dump signal from SIGRTMIN (glibc keeps the first two real-time signals)
SIGNAL_OFFSET = 6
#: the dump file of a rank, in the directory the launcher gives it
FILE_PATTERN = "rank{rank}.stacks"

_file: Any = None


def dump_signal() -> Optional[int]:
    """The signal number that makes a rank dump its stacks (None where there are no real-time
    signals)."""
    base = getattr(signal, "SIGRTMIN", None)
    return None if base is None else int(base) + SIGNAL_OFFSET


def stack_file(stack_dir: str | Path, rank: int) -> Path:
    return Path(stack_dir) / FILE_PATTERN.format(rank=rank)


def install(stack_dir: str, rank: int) -> Optional[Path]:
    """Register the dump; returns the file, or None when it could not be set up."""
    global _file
    sig = dump_signal()
    if not stack_dir or sig is None:
        return None
    try:
        import faulthandler

        path = stack_file(stack_dir, rank)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _file = os.fdopen(fd, "a")
        faulthandler.register(sig, file=_file, all_threads=True, chain=False)
        return path
    except Exception:
        return None


def snapshot(state: Optional["StepState"]) -> dict[str, Any]:
    """What the running interpreter can say about where this rank is (client thread): the
    collective it has in flight (``InFlight.oldest``), when the SDK saw it launched, and where the
    step counter stands (``state`` None or off: only the collectives)."""
    out: dict[str, Any] = {"ts": time.time(), "in_flight": None, "launched": None, "step": None,
                           "in_step": None}
    if state is None:
        return out
    try:
        if state.on:
            out["step"] = int(state.rec.count)
            out["in_step"] = bool(state.active)
        c = state.inflight.oldest()
        if c is not None:
            out["in_flight"] = {"op": str(c.op), "bytes": int(c.nbytes), "seq": int(c.seq),
                                "started_ns": int(c.started_ns), "group_size": int(c.group_size)}
        if state.inflight.launched:
            out["launched"] = int(state.inflight.launched)
    except Exception:
        pass
    return out
