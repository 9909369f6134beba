"""STRAGGLER: one rank is slower through the run, and not because it does more work: it waits.

How it decides. The slowest rank by its own time (rules/slowest.py: step less its wait for the
others, plus the time between its steps) has an excess over the other ranks' median; what is
judged is the excess it shows through the run and beyond the run's own noise (the least of the
mean, the median over stretches of 8+ steps, and the mean less two standard errors), less one
long pause. Then what the excess is made of, measured: bigger batches (samples, elements, tokens,
or what the script declared) that account for half of it, or more CPU time for the same batch
beside a rank of its own node, are WORK-IMBALANCE; a wait for a core per CPU second beyond the
other ranks' (another process took its cores) is taken out, and when nothing else is left it is
CPU-CONTENTION. What is left here is a rank that *waits* longer, off the CPU: a slower device,
storage, a lock, a sleep. A warning from 10 % of the median step and 2 ms, critical from 25 %.
The excess is attributed to the phases that hold it ("mostly in X" from half of it, else
"spread over" every phase with a fifth).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .. import thresholds as T
from .base import IN, Evidence, Finding, Run, rounded
from .slowest import WAIT, Slowest, assess, where_in_step

KIND = "straggler"
THRESHOLDS = ("STRAGGLER_EXCESS_WARN", "STRAGGLER_EXCESS_CRIT", "STRAGGLER_FLOOR_MS",
              "STRAGGLER_PERSISTENT_QUANTILE", "STRAGGLER_CONFIDENCE_SE", "STRAGGLER_STRETCH_STEPS",
              "STRAGGLER_MIN_WINDOWS", "ATTRIBUTION_MOSTLY", "ATTRIBUTION_LIST", "PAUSE_MIN_STEPS")


@dataclass
class StragglerEvidence(Evidence):
    rank: int
    who: str
    metric: str
    excess_ms: float
    excess_fraction: float
    median_step_ms: float
    persistent_ms: Optional[float]
    lower_ms: Optional[float]
    windows: int
    windows_needed: int
    slower_windows: Optional[float]
    phase: str
    phase_ms: dict[str, float] = field(default_factory=dict)
    phase_share: float = 0.0
    cpu_wait_ms: Optional[float] = None
    quota_wait_ms: Optional[float] = None
    pause_ms: Optional[float] = None
    explained_by: Optional[str] = None
    device: str = "unknown"
    #: its training thread's CPU time per step and the others' median (ms; None: not measured)
    cpu_ms: Optional[float] = None
    others_cpu_ms: Optional[float] = None
    #: the other ranks' wait for a core per ms of CPU (median)
    others_wait_per_cpu: Optional[float] = None
    #: its time per step off the CPU and not waiting for a core nor the others, and the others'
    #: (ms; rules/slowest.blocked)
    blocked_ms: Optional[float] = None
    others_blocked_ms: Optional[float] = None


def evidence_of(s: Slowest, run: Run) -> StragglerEvidence:
    step = run.median_step
    return StragglerEvidence(
        rank=s.rank.rank, who=s.rank.name, metric=s.metric, excess_ms=round(s.excess, 2),
        excess_fraction=round(s.excess / step, 4), median_step_ms=round(step, 2),
        persistent_ms=rounded(s.persistent), lower_ms=rounded(s.lower), windows=s.windows,
        windows_needed=T.STRAGGLER_MIN_WINDOWS, slower_windows=rounded(s.slower, 4), phase=s.phase,
        phase_ms=s.deltas, phase_share=round(s.phase_share, 4), cpu_wait_ms=rounded(s.starved),
        quota_wait_ms=round(s.quota, 2) if s.quota else None,
        pause_ms=round(s.pause, 1) if s.pause else None, device=run.ctx.device,
        cpu_ms=rounded(s.work.cpu), others_cpu_ms=rounded(s.work.cpu_theirs),
        others_wait_per_cpu=rounded(s.work.rate_theirs, 3), blocked_ms=rounded(s.work.blocked),
        others_blocked_ms=rounded(s.work.blocked_theirs))


def detect(run: Run) -> Optional[Finding]:
    s, sev = assess(run)
    if s is None or sev is None or s.cause != WAIT:
        return None
    return Finding(KIND, sev, s.rank.culprit(), evidence_of(s, run))


def say(ev: StragglerEvidence) -> tuple[str, str]:
    r = ev.rank
    why = (f"{ev.who} takes {ev.excess_ms:.1f} ms more per step than the other ranks' median "
           f"({ev.excess_fraction:.0%} of the median step, {ev.median_step_ms:.1f} ms)")
    if ev.persistent_ms is not None:
        why += (f", {ev.persistent_ms:.1f} ms or more in at least half of the run's "
                f"{ev.windows} stretches of steps and at least {ev.lower_ms:.1f} ms on average "
                "beyond their noise")
    else:
        why += (f" (whether through the whole run was not checked: {ev.windows} stretches of steps, "
                f"{ev.windows_needed} needed)")
    if ev.cpu_wait_ms is not None and ev.cpu_wait_ms >= 0.05:
        why += f", {ev.cpu_wait_ms:.1f} ms of it waiting for a CPU core longer than the others"
    quota = ev.quota_wait_ms
    if quota is not None and quota >= 0.05:
        why += f"; its cgroup's CPU quota held it back {quota:.1f} ms per step (throttled)"
    phase = ev.phase
    why += where_in_step(ev.phase_ms, phase, ev.phase_share, ev.excess_ms)
    cpu, theirs = ev.cpu_ms, ev.others_cpu_ms
    off, off_theirs = ev.blocked_ms, ev.others_blocked_ms
    if off is not None and off_theirs is not None and off - off_theirs >= T.CAUSE_SHARE * ev.excess_ms:
        waits_off_cpu = True
        why += (f"; it spends {off:.1f} ms per step off the CPU and not waiting for a core (the others "
                f"{off_theirs:.1f}): it waits, rather than computing more")
    else:
        # (its extra CPU time, with the wait for a core that comes with it, explains under half of it)
        waits_off_cpu = (cpu is not None and theirs is not None
                         and (cpu - theirs) * (1.0 + (ev.others_wait_per_cpu or 0.0)) < T.CAUSE_SHARE * ev.excess_ms)
        if waits_off_cpu:
            why += (f"; its training thread used {cpu:.1f} ms of CPU per step, the others {theirs:.1f}: "
                    "it waits, off the CPU, rather than computing more")
    if ev.metric == "own":
        why += "; the other ranks wait for it"
    if ev.pause_ms:
        why += f" (not counting one pause of {ev.pause_ms / 1000:.1f} s)"
    if ev.explained_by == "memory_creep":
        why += "; its memory also keeps growing (see the memory verdict), which may be what slows it"
    elif ev.explained_by == "cpu_oversubscribed":
        why += "; its node's ranks ask for more threads than it has cores (see the CPU verdict), which may be what slows it"
    elif ev.explained_by == "input_bound":
        why += "; the run waits for data (see the input verdict), and this rank's DataLoader sets the pace"
    if phase == "input":
        nxt = (f"rank {r}'s data loading is slower: check its data shard and DataLoader workers, "
               "and the CPU and disk of its node")
    elif phase == "outside":
        nxt = (f"rank {r} does extra work between steps (logging, evaluation or checkpointing on "
               "that rank only, or a slower fetch of its batches?): move it off the training loop or "
               "spread it over all ranks")
    elif phase == "nophase":
        nxt = (f"rank {r} does extra work inside its step but outside forward, backward and the "
               "optimizer (metrics, logging, a .cpu()/.item() copy, allocating or scanning memory): "
               "profile that part of its step (torch.profiler) and move it out of the loop or to every "
               "k-th step")
    elif quota is not None and quota >= 0.5 * ev.excess_ms:
        nxt = (f"rank {r}'s CPU is capped by its cgroup's CPU quota (cpu.max, or cpu.cfs_quota_us): ask "
               "the scheduler for more CPUs for its task, or leave its node out of the next job")
    elif ev.device == "cuda":
        nxt = (f"rank {r} computes slower: check its GPU's clocks and temperature "
               "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE) and what else runs on its node")
    elif waits_off_cpu:
        nxt = (f"find what rank {r} waits for {IN.get(phase, phase)} (a slower device, storage or the "
               f"network, a lock, a sleep: py-spy dump --pid <its pid> shows where it is) and what else "
               "runs on its node")
    else:
        nxt = (f"rank {r} computes slower: check what else runs on its node (top, other jobs sharing "
               "its cores) and how many threads each rank uses (OMP_NUM_THREADS, "
               "torch.get_num_threads())")
    if ev.explained_by == "memory_creep":
        nxt = f"first find what keeps memory on rank {r} (see the memory verdict); then " + nxt
    elif ev.explained_by == "cpu_oversubscribed":
        nxt = "first give the ranks no more threads than cores (see the CPU verdict); then " + nxt
    elif ev.explained_by == "input_bound":
        nxt = "first load batches faster on every rank (see the input verdict); then " + nxt
    return why, nxt


EVIDENCE = StragglerEvidence

