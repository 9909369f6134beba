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

* **What a step consumed** (the work-imbalance verdict): the batch the model was given and the
  training thread's CPU time per phase, on sampled steps (sdk/worksample.py: the client thread
  arms the sampler ten times a second), sent as ``work``: the sums of the samples (``n``, ``cpu_ns``,
  ``wall_ns`` of the whole iteration, ``phase_cpu_ns`` and ``phase_wall_ns`` of forward,
  backward and the optimizer, ``forwards``, ``measured`` samples whose batch was measured, and
  their ``samples``, ``elements`` and ``tokens``).

* **What feeds the input** (the input-bound verdict's CPU cause, report/cpubinding.py): the
  rank's DataLoader worker processes (the training thread's live child processes that are forks
  or spawns of it; the most seen), their time on a CPU and runnable waiting for one (their
  schedstat, read with every probe), this process's own CPU time, the
  cgroup's CPU throttling (``cpu.stat``: a CPU quota holds a process back whatever its cores),
  ``OMP_NUM_THREADS``, and what the scheduler gave the task (``request``: the launcher asked the
  cluster plugin; the SDK reads no scheduler variable).

Read on the client thread, never on the training thread (one ``pread`` each). The first event
goes out once training settled (after the warm-up steps: scripts set their threads at the start)
with the counters at that point; the last one at shutdown (before the ``bye``) with the counters
then and the settled ones again, so the last event alone gives the wait per steady step. Between
them, an event only when the threads change. Text: ``{"threads", "cpus", "cpuset": [[lo, hi],
...], "steps", "run_ns", "wait_ns", "steps0", "run0_ns", "wait0_ns", "wall_ns", "wall0_ns",
"wrun_ns", "wrun0_ns", "wwait_ns", "wwait0_ns", "pcpu_ns", "pcpu0_ns", "thr_ns", "thr0_ns", "workers", "omp", "torch", "request", "work"}``
(a counter null where the kernel does not keep it; ``*0_ns`` at the settled step).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Optional

from ..cgroupcpu import read_small
from ..wire.protocol import CPU_THREADS_EVENT as EVENT_KIND

#: the event text the wire takes (wire/frames.py)
MAX_TEXT = 2000
#: steps after which a script has set its threads (the verdicts' warm-up)
SETTLED_STEPS = 5


def _torch_version() -> Optional[str]:
    """The torch this rank trains with (``traceml compare`` says when two runs differ in it)."""
    import sys

    v = getattr(sys.modules.get("torch"), "__version__", None)
    return str(v)[:40] if v else None


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


def _ticks_ns() -> float:
    try:
        return 1e9 / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 1e7


TICK_NS = _ticks_ns()


_read = read_small


def _stat_fields(pid: str) -> Optional[list[str]]:
    """``/proc/<pid>/stat`` after the command name (field 3 on), or None."""
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    return text.rsplit(")", 1)[1].split()


class Feeders:
    """The training thread's DataLoader workers and the CPU that feeds the input (see above).

    Each worker's scheduler counters (``/proc/<pid>/schedstat``: time on a CPU, time runnable
    but waiting for one) are read with every probe (twice a second) and kept per pid, so a
    worker that exits between two probes loses at most half a second: a CPU-bound worker is
    always running or waiting for a core, a worker waiting for its storage (or sleeping) is
    neither."""

    MAX_PIDS = 256

    def __init__(self, tid: Optional[int]) -> None:
        self.tid = tid
        self.most_workers: Optional[int] = None
        self.me = _read("/proc/self/cmdline")
        self.throttle_path = _throttle_path()
        #: pid -> (run, wait) when first seen after the settled step, and when last seen
        self.seen: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
        self.settled = False

    def _workers(self) -> Optional[list[str]]:
        text = _read(f"/proc/self/task/{self.tid}/children") if self.tid is not None else None
        if text is None:
            return None
        out = []
        for pid in text.split()[:self.MAX_PIDS]:
            cmd = _read(f"/proc/{pid}/cmdline") or ""
            if cmd == self.me or "multiprocessing.spawn" in cmd or "multiprocessing.forkserver" in cmd:
                out.append(pid)
        return out

    def count(self) -> None:
        """With every probe: the workers there now, and their counters."""
        workers = self._workers()
        if workers is None:
            return
        self.most_workers = max(self.most_workers or 0, len(workers))
        for pid in workers:
            text = _read(f"/proc/{pid}/schedstat", 128)
            try:
                run, wait = (int(x) for x in (text or "").split()[:2])
            except ValueError:
                continue
            if pid in self.seen:
                self.seen[pid] = (self.seen[pid][0], (run, wait))
            elif len(self.seen) < self.MAX_PIDS:
                # alive at the settled step: from there; born after it: its whole life
                first = (run, wait) if not self.settled else (0, 0)
                self.seen[pid] = (first, (run, wait))

    def sample(self) -> dict[str, Any]:
        self.count()
        self.settled = True
        wrun = sum(last[0] - first[0] for first, last in self.seen.values())
        wwait = sum(last[1] - first[1] for first, last in self.seen.values())
        mine = _stat_fields("self")
        pcpu = int((int(mine[11]) + int(mine[12])) * TICK_NS) if mine is not None and len(mine) > 12 else None
        measured = self.most_workers is not None
        return {"wall_ns": time.monotonic_ns(), "wrun_ns": wrun if measured else None,
                "wwait_ns": wwait if measured else None, "pcpu_ns": pcpu,
                "thr_ns": _throttled_ns(self.throttle_path)}


def _throttle_path() -> Optional[tuple[str, str]]:
    """(cpu.stat of this process's cgroup, the key of its throttled time), v2 or v1; None: none."""
    from ..cgroupcpu import cpu_cgroup

    where = cpu_cgroup()
    return (where.stat_path, where.throttled_key) if where is not None else None


def _throttled_ns(where: Optional[tuple[str, str]]) -> Optional[int]:
    if where is None:
        return None
    text = _read(where[0]) or ""
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == where[1] and v.strip().isdigit():
            return int(v) * (1000 if k == "throttled_usec" else 1)
    return None


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
    ``notify`` queues an event for the aggregator (the session's ``Session.notify``: passed in, so
    this module never imports the session)."""

    def __init__(self, recorder: Any, tid: Optional[int] = None,
                 request: Optional[dict[str, Any]] = None, *,
                 notify: Callable[[dict[str, Any]], bool], sampler: Any = None) -> None:
        self.recorder = recorder
        #: what a step consumed, on sampled steps (sdk/worksample.py), sent with the counters
        self.sampler = sampler
        self.notify = notify
        tid = tid if tid is not None else threading.main_thread().native_id
        self.sched = SchedStat(tid)
        self.feeders = Feeders(tid)
        self.request = request
        self.sent: Optional[tuple[int, tuple[int, ...]]] = None
        self.settled: Optional[tuple[int, Optional[tuple[int, int]]]] = None
        self.settled_feed: dict[str, Any] = {}

    def _fact(self) -> tuple[int, tuple[int, ...]]:
        import torch

        return int(torch.get_num_threads()), tuple(usable_cpus())

    def _send(self, fact: tuple[int, tuple[int, ...]], steps: int, sched: Optional[tuple[int, int]],
              feed: dict[str, Any]) -> bool:
        s0 = self.settled or (steps, sched)
        f0 = self.settled_feed or feed
        text = json.dumps({
            "threads": fact[0], "cpus": len(fact[1]), "cpuset": ranges(list(fact[1]))[:32],
            "steps": steps, "run_ns": sched[0] if sched else None, "wait_ns": sched[1] if sched else None,
            "steps0": s0[0], "run0_ns": s0[1][0] if s0[1] else None, "wait0_ns": s0[1][1] if s0[1] else None,
            **feed, **{k.replace("_ns", "0_ns"): v for k, v in f0.items()},
            "workers": self.feeders.most_workers, "omp": os.environ.get("OMP_NUM_THREADS"),
            "torch": _torch_version(), "request": self.request,
            "work": self.sampler.figures() if self.sampler is not None else None,
        }, separators=(",", ":"))
        if len(text) > MAX_TEXT:  # the wire refuses a longer event text: the request goes first
            text = json.dumps({**json.loads(text), "request": None, "cpuset": []}, separators=(",", ":"))
        if len(text) > MAX_TEXT:
            text = json.dumps({**json.loads(text), "work": None}, separators=(",", ":"))
        return self.notify({"t": "event", "kind": EVENT_KIND, "ts": time.time(), "text": text})

    def __call__(self) -> None:
        steps = self.recorder.count
        if steps < SETTLED_STEPS:
            return
        sched = self.sched.read()
        if self.settled is None:
            self.settled = (steps, sched)
            self.settled_feed = self.feeders.sample()
        else:
            self.feeders.count()
        fact = self._fact()
        if fact != self.sent and self._send(fact, steps, sched, self.settled_feed):
            self.sent = fact

    def final(self) -> None:
        """The counters at the end (shutdown, before the ``bye``)."""
        try:
            if self.settled is not None:
                self._send(self._fact(), self.recorder.count, self.sched.read(), self.feeders.sample())
        except Exception:
            pass
        self.sched.close()
