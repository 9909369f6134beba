"""CPU-CONTENTION (information): the ranks' training threads waited for a core.

How it decides. Each rank's training thread's time runnable but not running (the scheduler's run
queue, ``/proc/self/task/<tid>/schedstat``, per steady step; sleeping, I/O and collectives are
not counted). Noted when the median rank waited a tenth of the wall clock per step or more, or
when the slowest rank's excess over the others was its extra wait for a core (so it was not
called a straggler). Information, never a warning: the step times include that wait, which comes
from outside the job's own work (other processes on the node), or from its own threads when the
CPU verdict says the ranks ask for too many. A wait the rank's own cgroup's CPU quota caused is
not other processes': it is left out here (the straggler says it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from ..stats import median
from .base import Evidence, Finding, Run
from .slowest import queue_wait
from .straggler import candidate

KIND = "cpu_contention"
THRESHOLDS = ("CPU_CONTENTION_NOTE", "CAUSE_SHARE")


@dataclass
class ContentionEvidence(Evidence):
    wait_ms: float
    fraction: float
    iteration_ms: float
    max_wait_ms: float
    max_rank: int
    excused_rank: Optional[int] = None
    excused_excess_ms: Optional[float] = None
    excused_wait_ms: Optional[float] = None
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    live = run.live
    facts = [run.cpu(r.rank) for r in live]
    if not facts or any(f is None or f.wait_ms is None for f in facts):
        return None
    waits = [(queue_wait(f), r.rank) for f, r in zip(facts, live) if f is not None]
    wait = median([w for w, _ in waits]) or 0.0
    it = run.median_iteration()
    frac = wait / it if it else 0.0
    _, _, ex = candidate(run)
    if frac < T.CPU_CONTENTION_NOTE and ex is None:
        return None
    most = max(waits)
    return Finding(KIND, "info", None, ContentionEvidence(
        wait_ms=round(wait, 2), fraction=round(frac, 4), iteration_ms=round(it, 2),
        max_wait_ms=round(most[0], 2), max_rank=most[1],
        excused_rank=ex.rank.rank if ex else None, excused_excess_ms=round(ex.excess, 2) if ex else None,
        excused_wait_ms=round(ex.starved, 2) if ex and ex.starved is not None else None))


def say(ev: ContentionEvidence) -> tuple[str, str]:
    own_threads = ev.explained_by == "cpu_oversubscribed"
    who = "more threads than cores (see the CPU verdict)" if own_threads else "other processes on the node"
    why = (f"the ranks' training threads waited for a CPU core {ev.wait_ms:.1f} ms per step (median rank, "
           f"{ev.fraction:.0%} of the wall clock per step; most: rank {ev.max_rank}, "
           f"{ev.max_wait_ms:.1f} ms): runnable, but {who} held the cores")
    if ev.excused_rank is not None:
        why += (f"; rank {ev.excused_rank} is {ev.excused_excess_ms:.1f} ms per step slower than the "
                f"others, {ev.excused_wait_ms:.1f} ms of it waiting for a core longer than the others, so "
                "it is not called a straggler")
    if own_threads:
        return why, "give the ranks no more threads than cores (see the CPU verdict)"
    return why, ("the step times include that wait: measure on a node the job has to itself, or ask "
                 "the scheduler for whole cores (Slurm: --exclusive, or --cpus-per-task with "
                 "--cpu-bind=cores)")


EVIDENCE = ContentionEvidence
