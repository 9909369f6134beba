"""CPU-CONTENTION (information): the ranks' training threads waited for a core, or one rank's core ran
slower.

How it decides. Each rank's training thread's time runnable but not running (the scheduler's run
queue, ``/proc/self/task/<tid>/schedstat``, per steady step; sleeping, I/O and collectives are
not counted), less what its own cgroup's CPU quota caused. Noted when the median rank waited a
tenth of the wall clock per step or more, or when the slowest rank's excess was not its own
work but its CPU's: its wait for a core *beyond its share* (beyond what its own CPU time costs at
the other ranks' wait per CPU second: every rank on a busy CPU waits in proportion to the CPU time
it asks for, so a rank that computes 1.3x as much waits 1.3x as long, and that is its work, not
contention), or, for the same batch, more CPU time spread alike over every part of its step
(forward, backward, the optimizer and the rest each grew at least half as much as the whole: its
core ran slower, another process on the same physical core or a lower clock; work of its own
adds CPU time where that work is), and without that no straggler's excess was left. Whose
processes held the cores, where the ranks' own CPU use says it: the job's own (its ranks, their
threads and DataLoader workers used 90 % of the cores they may run on) or others' (they left a
quarter of them); otherwise it is not said. Information, never a warning: the step times include
that wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .. import thresholds as T
from ..stats import median
from .base import Evidence, Finding, Run
from .slowest import CONTENTION, SLOW_CORE, assess, queue_wait

KIND = "cpu_contention"
THRESHOLDS = ("CPU_CONTENTION_NOTE", "CPU_UNIFORM", "CAUSE_SHARE", "STRAGGLER_EXCESS_WARN",
              "CONTENTION_OWN_SHARE", "CONTENTION_OTHERS_SHARE")


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
    #: the excused rank's wait per CPU second over the other ranks' median
    excused_rate_ratio: Optional[float] = None
    #: why it was excused: ``wait`` (for a core, beyond its share) or ``slow_core`` (its core ran
    #: slower: more CPU time for the same batch, alike in every part of its step)
    excused_by: Optional[str] = None
    #: its CPU time per part of a sampled step over the others' (slow_core)
    excused_cpu_ratios: dict[str, float] = field(default_factory=dict)
    #: whose processes held the cores: ``own`` (the job's ranks), ``others``, or None (not known)
    whose: Optional[str] = None
    whose_node: Any = None
    whose_ranks: int = 0
    job_cores: Optional[float] = None
    cores: Optional[int] = None
    explained_by: Optional[str] = None


def _whose(run: Run, node: Any) -> tuple[Optional[str], int, Optional[float], Optional[int]]:
    """(``own``/``others``/None, the node's ranks, the cores its ranks and their DataLoader
    workers used, the cores they may run on)."""
    ranks = [r for r in run.live if r.node == node]
    facts = [run.cpu(r.rank) for r in ranks]
    if not facts or any(f is None or f.proc_cores is None for f in facts):
        return None, len(ranks), None, None
    cores = len(frozenset().union(*(f.cpus for f in facts if f is not None)))
    used = sum((f.proc_cores or 0.0) + (f.workers_cores or 0.0) for f in facts if f is not None)
    whose = None
    if cores and used >= T.CONTENTION_OWN_SHARE * cores:
        whose = "own"
    elif cores and used <= (1.0 - T.CONTENTION_OTHERS_SHARE) * cores:
        whose = "others"
    return whose, len(ranks), round(used, 2), cores


def detect(run: Run) -> Optional[Finding]:
    live = run.live
    facts = [run.cpu(r.rank) for r in live]
    if not facts or any(f is None or f.wait_ms is None for f in facts):
        return None
    waits = [(queue_wait(f), r.rank) for f, r in zip(facts, live) if f is not None]
    wait = median([w for w, _ in waits]) or 0.0
    it = run.median_iteration()
    frac = wait / it if it else 0.0
    s, sev = assess(run)
    ex = s if s is not None and sev is None and s.cause in (CONTENTION, SLOW_CORE) else None
    if frac < T.CPU_CONTENTION_NOTE and ex is None:
        return None
    most = max(waits)
    node = (ex.rank if ex else next(r for r in live if r.rank == most[1])).node
    whose, n, used, cores = _whose(run, node)
    rate = (ex.work.rate / ex.work.rate_theirs if ex and ex.work.rate is not None and ex.work.rate_theirs
            else None)
    return Finding(KIND, "info", ex.rank.culprit() if ex else None, ContentionEvidence(
        wait_ms=round(wait, 2), fraction=round(frac, 4), iteration_ms=round(it, 2),
        max_wait_ms=round(most[0], 2), max_rank=most[1],
        excused_rank=ex.rank.rank if ex else None, excused_excess_ms=round(ex.excess, 2) if ex else None,
        excused_wait_ms=round(ex.starved, 2) if ex and ex.starved is not None else None,
        excused_rate_ratio=round(rate, 2) if rate is not None else None,
        excused_by=None if ex is None else "slow_core" if ex.cause == SLOW_CORE else "wait",
        excused_cpu_ratios=dict(ex.work.part_ratios) if ex is not None and ex.cause == SLOW_CORE else {},
        whose=whose, whose_node=node, whose_ranks=n, job_cores=used, cores=cores))


def _held(ev: ContentionEvidence) -> str:
    if ev.explained_by == "cpu_oversubscribed":
        return "the ranks' own threads held the cores: more threads than cores (see the CPU verdict)"
    if ev.whose == "own":
        return (f"the job's own processes held the cores: its {ev.whose_ranks} rank(s) on node {ev.whose_node} "
                f"(their threads, gloo's included) and their DataLoader workers used {ev.job_cores:.1f} of the "
                f"{ev.cores} core(s) they may run on")
    if ev.whose == "others":
        return (f"processes outside the job's ranks held the cores: its {ev.whose_ranks} rank(s) on node "
                f"{ev.whose_node} and their DataLoader workers used only {ev.job_cores:.1f} of the {ev.cores} "
                "core(s) they may run on (other jobs or the system; TraceML's launcher and aggregator are "
                "not measured apart)")
    return "a core was busy (whose processes held it was not measured)"


def say(ev: ContentionEvidence) -> tuple[str, str]:
    why = (f"the ranks' training threads waited for a CPU core {ev.wait_ms:.1f} ms per step (median rank, "
           f"{ev.fraction:.0%} of the wall clock per step; most: rank {ev.max_rank}, "
           f"{ev.max_wait_ms:.1f} ms): runnable, but {_held(ev)}")
    if ev.excused_rank is not None and ev.excused_by == "slow_core":
        parts = ", ".join(f"{p} {k:.2g}x" for p, k in ev.excused_cpu_ratios.items())
        because = ("its memory keeps growing (see the memory verdict), which may be what slows it"
                   if ev.explained_by == "memory_creep" else
                   "its core ran slower (another process on the same physical core, a lower clock)")
        why += (f"; rank {ev.excused_rank} is {ev.excused_excess_ms:.1f} ms per step slower than the "
                f"others, and for the same batch its training thread used more CPU time in every part of "
                f"its step alike ({parts}): {because}, not more work of its own, so it is not called a "
                "straggler")
    elif ev.excused_rank is not None:
        rate = (f", {ev.excused_rate_ratio:.2g}x the others' wait per CPU second" if ev.excused_rate_ratio
                else "")
        why += (f"; rank {ev.excused_rank} is {ev.excused_excess_ms:.1f} ms per step slower than the "
                f"others, {ev.excused_wait_ms:.1f} ms of it waiting for a core beyond what its own CPU time "
                f"explains{rate}: not its own work, so it is not called a straggler")
    if ev.explained_by == "cpu_oversubscribed":
        return why, "give the ranks no more threads than cores (see the CPU verdict)"
    if ev.whose == "own":
        return why, ("the job's own processes fill the cores: run fewer ranks, threads (OMP_NUM_THREADS) or "
                     "DataLoader workers per node, or ask for more cores per rank (Slurm: --cpus-per-task)")
    return why, ("the step times include that wait: measure on a node the job has to itself, or ask "
                 "the scheduler for whole cores (Slurm: --exclusive, or --cpus-per-task with "
                 "--cpu-bind=cores)")


EVIDENCE = ContentionEvidence
