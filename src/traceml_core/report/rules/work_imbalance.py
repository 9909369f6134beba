"""WORK-IMBALANCE: one rank is slower because it does more work than the others.

How it decides. The slowest rank and its judged excess as for a straggler (rules/slowest.py: its
own time over the other ranks' median, through the run and beyond its noise; a warning from 10 %
of the median step and 2 ms, critical from 25 %). Its work is measured without code (sdk/
worksample.py, on sampled steps: the batch its model was given, samples and elements or tokens,
and its training thread's CPU time per phase), or taken from what every rank declared
(``traceml.declare_work``, which overrides the measurement). It is a work imbalance when

* its batches are at least 5 % bigger than the others' median (samples; or, for the same
  samples, elements or tokens: longer sequences) and that accounts for at least half of its
  excess: the fix is the data (the sampler, bucketing by length, padding), not the node; or
* for the same batch its training thread used more CPU time per step, by at least half of its
  excess (with the wait for a core that comes with it; less any wait beyond its share) and 10 %,
  beside another rank of its own node, and the extra CPU time is where that work is (forward,
  backward, the optimizer or the rest of the step grew, not all of them alike, which is a core
  that runs slower: CPU-CONTENTION): work only that rank does (metrics, logging, an evaluation or
  an extra loss on one rank). CPU runs only.

A rank whose wait for a core grew with its extra work (the same wait per CPU second as the
others') is a work imbalance, not contention: the wait is part of the work. A measured (or
declared) difference in batches of 5 % or more that does not yet make its rank slower by enough
for a warning is information, with the same figures: its fix is the data's, and it costs more
where compute dominates (on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .. import thresholds as T
from .base import Evidence, Finding, Run, rounded
from .slowest import CPU_WORK, WORK, assess, most_work, of_rank, where_in_step

KIND = "work_imbalance"
THRESHOLDS = ("WORK_RATIO_MIN", "WORK_EXPLAINS", "WORK_CPU_RATIO_MIN", "CPU_UNIFORM", "CAUSE_SHARE",
              "STRAGGLER_EXCESS_WARN",
              "STRAGGLER_EXCESS_CRIT", "STRAGGLER_FLOOR_MS")


@dataclass
class WorkEvidence(Evidence):
    rank: int
    who: str
    #: ``samples``, ``elements``, ``tokens``, ``declared samples``, ``declared tokens``, or
    #: ``cpu`` (the same batch, more CPU time)
    basis: str
    #: its work over the others' median: of the basis (batches), or of CPU time per step
    ratio: float
    mine: Optional[float]
    theirs: Optional[float]
    samples: Optional[float]
    excess_ms: float
    excess_fraction: float
    median_step_ms: float
    phase: str
    phase_ms: dict[str, float] = field(default_factory=dict)
    phase_share: float = 0.0
    cpu_ms: Optional[float] = None
    others_cpu_ms: Optional[float] = None
    cpu_ratio: Optional[float] = None
    #: its extra CPU time per phase over the others' (ms per sampled step)
    phase_cpu_ms: dict[str, float] = field(default_factory=dict)
    persistent_ms: Optional[float] = None
    windows: int = 0
    metric: str = "own"
    device: str = "unknown"
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    s, sev = assess(run)
    if s is None or sev is None or s.cause not in (WORK, CPU_WORK):
        # a measured difference in batches that does not (yet) make its rank slower by enough:
        # information (its fix is the data's; where compute dominates, on a GPU, it costs more)
        most = most_work(run)
        if most is None or (s is not None and sev is not None and s.rank is most[0]):
            return None
        s, sev = of_rank(run, most[0]), "info"
        s.cause = WORK
    w, step = s.work, run.median_step
    batch = s.cause == WORK
    ratio = w.ratio if batch else w.cpu_ratio
    assert ratio is not None
    return Finding(KIND, sev, s.rank.culprit(), WorkEvidence(
        rank=s.rank.rank, who=s.rank.name, basis=(w.basis or "samples") if batch else "cpu",
        ratio=round(ratio, 3), mine=rounded(w.mine), theirs=rounded(w.theirs), samples=rounded(w.samples),
        excess_ms=round(s.excess, 2), excess_fraction=round(s.excess / step, 4), median_step_ms=round(step, 2),
        phase=s.phase, phase_ms=s.deltas, phase_share=round(s.phase_share, 4), cpu_ms=rounded(w.cpu),
        others_cpu_ms=rounded(w.cpu_theirs), cpu_ratio=rounded(w.cpu_ratio, 3), phase_cpu_ms=w.phase_cpu,
        persistent_ms=rounded(s.persistent), windows=s.windows, metric=s.metric, device=run.ctx.device))


def _n(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:,.0f}"


def say(ev: WorkEvidence) -> tuple[str, str]:
    r = ev.rank
    slower = (f"it takes {ev.excess_ms:.1f} ms more per step than the other ranks' median "
              f"({ev.excess_fraction:.0%} of the median step, {ev.median_step_ms:.1f} ms)")
    slower += where_in_step(ev.phase_ms, ev.phase, ev.phase_share, ev.excess_ms)
    cpu = ""
    if ev.cpu_ms is not None and ev.others_cpu_ms is not None:
        cpu = (f"; its training thread used {ev.cpu_ratio or 0:.2g}x their CPU time per step "
               f"({ev.cpu_ms:.1f} vs {ev.others_cpu_ms:.1f} ms)")
    if ev.basis == "cpu":
        extra = [f"{p} +{v:.1f} ms" for p, v in sorted(ev.phase_cpu_ms.items(), key=lambda kv: -kv[1]) if v >= 0.5]
        why = (f"{ev.who} computes more per step than the other ranks for the same batch"
               + (f" ({_n(ev.samples)} samples)" if ev.samples else "")
               + f": its training thread used {ev.ratio:.2g}x their CPU time per step ({ev.cpu_ms:.1f} vs "
               f"{ev.others_cpu_ms:.1f} ms" + (f"; {', '.join(extra)} of CPU" if extra else "") + f"); {slower}; "
               "work only it does, or the same work costing it more (its process's memory allocator, "
               "its core's neighbours); not its node: another rank of the node computes less")
        nxt = (f"find what rank {r} runs that the others do not (metrics, logging, an extra loss, an "
               f"evaluation or a save on rank {r} only?): move it off the training loop, do it every k steps, "
               f"or spread it over the ranks; torch.profiler on rank {r} and on another rank, side by side, "
               "shows where its CPU time goes")
        if ev.explained_by == "memory_creep":
            why += "; its memory also keeps growing (see the memory verdict): scanning what it keeps may be the work"
            nxt = f"first find what keeps memory on rank {r} (see the memory verdict); then " + nxt
        return why, nxt
    declared = ev.basis.startswith("declared")
    unit = ev.basis.replace("declared ", "")
    src = "declared with traceml.declare_work" if declared else "measured"
    if unit == "samples":
        what = f"rank {r}'s batches are {ev.ratio:.2g}x the other ranks' ({_n(ev.mine)} vs {_n(ev.theirs)} samples per step, {src})"
        nxt = ("give every rank the same work per step: the same batch size on every rank, and a sampler "
               "that gives each rank an equal share (DistributedSampler splits the dataset evenly; a "
               "custom or weighted sampler may not)")
    else:
        same = f" for {_n(ev.samples)} samples" if ev.samples else ""
        what = (f"rank {r}'s batches hold {ev.ratio:.2g}x the other ranks' {unit} ({_n(ev.mine)} vs "
                f"{_n(ev.theirs)} per step{same}, {src}): longer sequences")
        nxt = ("give every rank about as many tokens per step: bucket batches by length (or pack "
               "sequences to a fixed length) so that no rank gets the long ones, or pad every rank's "
               "batch to the same length")
    if ev.excess_fraction < T.STRAGGLER_EXCESS_WARN or ev.excess_ms < T.STRAGGLER_FLOOR_MS:
        slower = slower.replace("it takes", "so far it takes only") + (
            f": not enough to matter yet (a warning from {T.STRAGGLER_EXCESS_WARN:.0%} of the median step and "
            f"{T.STRAGGLER_FLOOR_MS:g} ms), but it grows where the compute does (a GPU's)")
        why = f"{what}; {slower}{cpu}"
    else:
        why = f"{what}; {slower}{cpu}; the other ranks wait for it"
    if ev.explained_by == "memory_creep":
        why += "; its memory also keeps growing (see the memory verdict)"
    return why, nxt + "; the node is not the cause: the rank's data is (the same rank would be slow on any node)"


EVIDENCE = WorkEvidence
