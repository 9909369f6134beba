"""What this rank's CPU looked like: its compute threads against the cores it may use, and how
long its training thread waited for a core. Told to the aggregator in ``cpu_threads`` events.

* **Threads**: ``torch.get_num_threads()`` (the process's intra-op pool, whichever thread asks)
  and the cores in the rank's affinity mask, so the summary can say when a node's ranks together
  ask for more threads than it has cores (the CPU-oversubscription verdict).
* **Waiting for a core**: the Linux scheduler's own account of the training thread
  (``/proc/self/task/<tid>/schedstat``: time on a CPU, and time *runnable but waiting* in the run
  queue). A rank that waited longer for a core than the others was slowed by other processes on
  its node (or by its own threads), not by its own work: the straggler verdict takes that wait
  out of a rank's own time. Sleeping, waiting for I/O or for a collective is not run-queue wait.

Read on the client thread, never on the training thread (one ``pread`` each). The first event
goes out once training settled (after the warm-up steps: scripts set their threads at the start)
with the counters at that point; the last one at shutdown (before the ``bye``) with the counters
then and the settled ones again, so the last event alone gives the wait per steady step. Between
them, an event only when the threads change. Text: ``{"threads", "cpus", "cpuset": [[lo, hi],
...], "steps", "run_ns", "wait_ns", "steps0", "run0_ns", "wait0_ns"}`` (the schedstat fields
null where the kernel does not keep them).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Optional

from ..wire.protocol import CPU_THREADS_EVENT as EVENT_KIND

#: steps after which a script has set its threads (the verdicts' warm-up)
SETTLED_STEPS = 5


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def ranges(cpus: list[int]) -> list[list[int]]:
    """``[0, 1, 2, 5]`` -> ``[[0, 2], [5, 5]]``."""
    out: list[list[int]] = []
    for c in cpus:
        if out and c == out[-1][1] + 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


class SchedStat:
    """The scheduler's counters of one thread: (ns on a CPU, ns waiting in the run queue)."""

    def __init__(self, tid: Optional[int]) -> None:
        self._fd: Optional[int] = None
        if tid is not None:
            try:
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._fd = None

    def read(self) -> Optional[tuple[int, int]]:
        if self._fd is None:
            return None
        try:
            run, wait = os.pread(self._fd, 128, 0).split()[:2]
            return int(run), int(wait)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


class ThreadsProbe:
    """Called periodically by the client thread, and once more at shutdown (:meth:`final`);
    ``notify`` queues an event for the aggregator (the session's ``api.notify``: passed in, so
    this module never imports the session)."""

    def __init__(self, recorder: Any, notify: Callable[[dict[str, Any]], bool],
                 tid: Optional[int] = None) -> None:
        self.recorder = recorder
        self.notify = notify
        self.sched = SchedStat(tid if tid is not None else threading.main_thread().native_id)
        self.sent: Optional[tuple[int, tuple[int, ...]]] = None
        self.settled: Optional[tuple[int, Optional[tuple[int, int]]]] = None

    def _fact(self) -> tuple[int, tuple[int, ...]]:
        import torch

        return int(torch.get_num_threads()), tuple(usable_cpus())

    def _send(self, fact: tuple[int, tuple[int, ...]], steps: int, sched: Optional[tuple[int, int]]) -> bool:
        s0 = self.settled or (steps, sched)
        text = json.dumps({
            "threads": fact[0], "cpus": len(fact[1]), "cpuset": ranges(list(fact[1]))[:64],
            "steps": steps, "run_ns": sched[0] if sched else None, "wait_ns": sched[1] if sched else None,
            "steps0": s0[0], "run0_ns": s0[1][0] if s0[1] else None, "wait0_ns": s0[1][1] if s0[1] else None,
        }, separators=(",", ":"))
        return self.notify({"t": "event", "kind": EVENT_KIND, "ts": time.time(), "text": text})

    def __call__(self) -> None:
        steps = self.recorder.count
        if steps < SETTLED_STEPS:
            return
        sched = self.sched.read()
        if self.settled is None:
            self.settled = (steps, sched)
        fact = self._fact()
        if fact != self.sent and self._send(fact, steps, sched):
            self.sent = fact

    def final(self) -> None:
        """The counters at the end (shutdown, before the ``bye``)."""
        try:
            if self.settled is not None:
                self._send(self._fact(), self.recorder.count, self.sched.read())
        except Exception:
            pass
        self.sched.close()
