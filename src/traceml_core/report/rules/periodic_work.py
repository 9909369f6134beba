"""PERIODIC-WORK: time between steps that comes in pauses (an evaluation, a checkpoint, logging
every k steps), not spread over every step; the run's, or one rank's.

How it decides. Each rank's steady gaps between steps are a distribution (report/pauses.py: a
quantile sketch of every gap, whatever the batching of records), judged against that rank's own
steps: a gap is a pause when it is over 3x the typical gap, over it by 1 ms, and over it by more
than twice the spread of the rank's own steps (its scheduling jitter: on a loaded machine a thread
loses its core for milliseconds at random, between steps as in them); of those, the pauses that
hold the time (at least a quarter of the mean pause) are counted, so jitter that passed the cut
changes neither the count nor the period. A rank's gaps are *periodic* when its pauses' time above
the typical gap holds at least 60 % of its time between steps, there are at least 2 of them in at
least 20 gaps, and they are at most half of the gaps. When more than half of the ranks pause it
is the run's periodic work, judged on the median of them; otherwise it is the work of the rank
that pauses most (an evaluation or logging on rank 0 only: the others wait for it in the next
step's all-reduce, not between steps), named. The period ("every N steps") is the steps per
pause, the length a pause's time above the typical gap. Severity from the pauses' share of the
wall clock per step: a warning from 10 % and 1 ms per step on average, critical from 30 % and
5 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from ..model import RankSummary
from ..pauses import BetweenSteps
from .base import Evidence, Finding, Run, severity

KIND = "periodic_work"
THRESHOLDS = ("PERIODIC_BURST_RATIO", "PERIODIC_BURST_FLOOR_MS", "PERIODIC_JITTER_SPREADS",
              "PERIODIC_OF_MEAN_PAUSE", "PERIODIC_BURST_SHARE", "PERIODIC_MIN_BURSTS", "PERIODIC_MIN_GAPS",
              "PERIODIC_RANKS_SHARE", "PERIODIC_FRACTION_WARN", "PERIODIC_FRACTION_CRIT", "PERIODIC_FLOOR_MS",
              "PERIODIC_CRIT_FLOOR_MS")


@dataclass
class PeriodicEvidence(Evidence):
    bursts: int
    steps: int
    period_steps: float
    burst_ms: float
    per_step_ms: float
    iteration_ms: float
    fraction: float
    uniform_ms: float
    typical_ms: float
    pause_share: float
    ranks: int
    device: str = "unknown"
    #: the rank whose work it is, or None: the run's (more than half of the ranks pause)
    rank: Optional[int] = None
    who: Optional[str] = None
    #: ranks whose gaps come in pauses
    ranks_pausing: int = 0
    #: how long a gap had to be to be a pause (ms)
    cut_ms: Optional[float] = None
    explained_by: Optional[str] = None


def pattern(b: Optional[BetweenSteps]) -> bool:
    """Whether a rank's gaps between steps come in pauses (see the module docstring)."""
    return (b is not None and b.gaps >= T.PERIODIC_MIN_GAPS and b.pauses >= T.PERIODIC_MIN_BURSTS
            and b.pause_share >= T.PERIODIC_BURST_SHARE and b.pauses <= b.gaps / 2)


def _per_step(r: RankSummary) -> float:
    b = r.between
    return b.pause_excess_ms / b.gaps if b is not None and b.gaps else 0.0


def detect(run: Run) -> Optional[Finding]:
    pausing = sorted((r for r in run.live if pattern(r.between)), key=_per_step)
    if not pausing:
        return None
    runwide = len(pausing) > T.PERIODIC_RANKS_SHARE * len(run.live)
    judged = pausing[(len(pausing) - 1) // 2] if runwide else pausing[-1]
    b = judged.between
    assert b is not None
    per_step = _per_step(judged)
    it = run.median_iteration()
    frac = per_step / it if it else 0.0
    sev = severity(frac, per_step, T.PERIODIC_FRACTION_WARN, T.PERIODIC_FRACTION_CRIT,
                   T.PERIODIC_FLOOR_MS, T.PERIODIC_CRIT_FLOOR_MS)
    if sev is None:
        return None
    ranks = sum(1 for r in run.live if r.between is not None and r.between.gaps)
    return Finding(KIND, sev, None if runwide else judged.culprit(), PeriodicEvidence(
        bursts=b.pauses, steps=b.gaps, period_steps=round(b.gaps / b.pauses, 1),
        burst_ms=round(b.pause_ms, 1), per_step_ms=round(per_step, 4), iteration_ms=round(it, 4),
        fraction=round(frac, 4), uniform_ms=b.uniform_ms, typical_ms=b.typical_ms, pause_share=b.pause_share,
        ranks=ranks, device=run.ctx.device, rank=None if runwide else judged.rank,
        who=None if runwide else judged.name, ranks_pausing=len(pausing), cut_ms=b.cut_ms))


def say(ev: PeriodicEvidence) -> tuple[str, str]:
    figures = (f"({ev.bursts} pauses in {ev.steps} steps; {ev.per_step_ms:.1f} ms per step on average, "
               f"{ev.fraction:.0%} of the wall clock)")
    if ev.rank is not None:
        return ((f"every ~{ev.period_steps:.0f} steps {ev.who or f'rank {ev.rank}'} alone spends about "
                 f"{ev.burst_ms:.0f} ms between steps {figures}, and the other ranks wait for it in the next "
                 f"step: work on rank {ev.rank} only, such as an evaluation, logging or a checkpoint on that rank"),
                f"make rank {ev.rank}'s periodic work cheaper or rarer, or take it off the ranks' common path: "
                "evaluate on every rank's share of the data (each rank a part), less often, or in a "
                "background thread or process; save checkpoints asynchronously "
                "(torch.distributed.checkpoint's async_save)")
    return ((f"every ~{ev.period_steps:.0f} steps the ranks spend about {ev.burst_ms:.0f} ms between "
             f"steps {figures}: periodic work outside the training "
             "step, such as evaluation, checkpointing or logging every k steps"),
            "make the periodic work cheaper or rarer: evaluate or checkpoint every more steps, on a "
            "smaller evaluation set, or save checkpoints asynchronously (torch.distributed.checkpoint's "
            "async_save, or a background thread writing a copy of the state)")


EVIDENCE = PeriodicEvidence
