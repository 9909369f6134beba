"""The rank side of the hang autopsy: where this rank is, told by its own interpreter.

A stack request (``stacks``, wire/frames.py) is answered on the telemetry client's thread, never
from a signal handler: :func:`thread_stacks` reads every thread's frames with
:func:`sys._current_frames` while that thread holds the GIL, which is when the frames are
consistent. An earlier design registered :mod:`faulthandler` for a signal and dumped
``all_threads=True`` from inside the handler; faulthandler walks the other threads' frames
without a lock, and a signal that landed while another thread was changing its frames killed a
healthy rank with SIGSEGV (1 in 9 dumps on a real cluster, 2 of 22 processes over 4,131 signals
locally). No signal, no handler: a stack request cannot change the fate of the rank.

What this costs in coverage, and who fills it: a rank whose interpreter cannot run the client
thread (a C extension holding the GIL, a stopped process) does not answer. Its node's relay reads
what the kernel knows of it without touching it (launcher/procstate.py: stopped or not, where the
main thread sleeps, its CPU time and I/O), so the report still says "stopped" or "not answering,
holding the GIL in C code", and the hang rules judge its progress. Collectives release the GIL
while they wait (gloo, NCCL, MPI bindings all do), as do DataLoader queues, sleeps, file and
socket I/O: the cases a hang report is for are answered.

The text has faulthandler's layout (``Thread 0x... [name] (most recent call first):`` and
``  File "...", line N in func``), which report/hang.py parses, innermost frame first, the main
thread first. No source line is read (no file I/O on the answering thread).

:func:`snapshot` adds what the SDK itself knows: the collective in flight, when the SDK saw it
launched, and where the step counter stands.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:   # (responders import this module lazily: it stays off the SDK's hot path)
    from .step import StepState

#: the most frames of one thread that are written (a deep recursion is cut, outermost kept last)
MAX_FRAMES = 100


def thread_stacks(limit: int) -> str:
    """Every thread's Python stack, faulthandler's layout, main thread first, at most ``limit``
    characters (a process with hundreds of threads is cut at a thread boundary where it can)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main, ident))
    out: list[str] = []
    size = 0
    for ident in order:
        block = [f"Thread 0x{ident:016x} [{names.get(ident, '?')}] (most recent call first):"]
        f = frames[ident]
        n = 0
        while f is not None and n < MAX_FRAMES:
            code = f.f_code
            block.append(f'  File "{code.co_filename}", line {f.f_lineno} in {code.co_name}')
            f, n = f.f_back, n + 1
        if f is not None:
            block.append("  ...")
        text = "\n".join(block) + "\n\n"
        if size + len(text) > limit:
            if not out:
                out.append(text[:limit])
            break
        out.append(text)
        size += len(text)
    del frames
    return "".join(out)


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
