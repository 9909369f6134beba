"""PERIODIC-WORK: time between steps that comes in pauses (an evaluation, a checkpoint, logging
every k steps), not spread over every step.

How it decides. Each rank's steady gaps between steps are a distribution (report/pauses.py: a
quantile sketch of every gap, whatever the batching of records); a gap over 3x the typical gap
and over it by 1 ms is a pause. A rank's gaps are *periodic* when the pauses' time above the
typical gap holds at least 60 % of its time between steps, there are at least 2 of them in at
least 20 gaps, and they are at most half of the gaps. Judged on the median rank (all ranks pause
for an evaluation; a pause of one rank alone makes the others wait in communication, not between
steps). Severity from the pauses' share of the wall clock per step: a warning from 10 % and 1 ms
per step on average, critical from 30 % and 5 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from ..pauses import BetweenSteps
from .base import Evidence, Finding, Run, severity

KIND = "periodic_work"
THRESHOLDS = ("PERIODIC_BURST_RATIO", "PERIODIC_BURST_FLOOR_MS", "PERIODIC_BURST_SHARE",
              "PERIODIC_MIN_BURSTS", "PERIODIC_MIN_GAPS", "PERIODIC_FRACTION_WARN", "PERIODIC_FRACTION_CRIT",
              "PERIODIC_FLOOR_MS", "PERIODIC_CRIT_FLOOR_MS")


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
    explained_by: Optional[str] = None


def pattern(b: Optional[BetweenSteps]) -> bool:
    """Whether a rank's gaps between steps come in pauses (see the module docstring)."""
    return (b is not None and b.gaps >= T.PERIODIC_MIN_GAPS and b.pauses >= T.PERIODIC_MIN_BURSTS
            and b.pause_share >= T.PERIODIC_BURST_SHARE and b.pauses <= b.gaps / 2)


def judged(run: Run) -> Optional[BetweenSteps]:
    """The median rank's gaps (by pause time per step), or None where none was measured."""
    seen = sorted(((r.between.pause_excess_ms / r.between.gaps, r.between) for r in run.live
                   if r.between is not None and r.between.gaps), key=lambda pb: pb[0])
    if not seen:
        return None
    return seen[(len(seen) - 1) // 2][1]


def detect(run: Run) -> Optional[Finding]:
    b = judged(run)
    if b is None or not pattern(b):
        return None
    per_step = b.pause_excess_ms / b.gaps
    ranks = sum(1 for r in run.live if r.between is not None and r.between.gaps)
    it = run.median_iteration()
    frac = per_step / it if it else 0.0
    sev = severity(frac, per_step, T.PERIODIC_FRACTION_WARN, T.PERIODIC_FRACTION_CRIT,
                   T.PERIODIC_FLOOR_MS, T.PERIODIC_CRIT_FLOOR_MS)
    if sev is None:
        return None
    return Finding(KIND, sev, None, PeriodicEvidence(
        bursts=b.pauses, steps=b.gaps, period_steps=round(b.gaps / b.pauses, 1),
        burst_ms=round(b.pause_excess_ms / b.pauses, 1), per_step_ms=round(per_step, 4),
        iteration_ms=round(it, 4), fraction=round(frac, 4), uniform_ms=b.uniform_ms,
        typical_ms=b.typical_ms, pause_share=b.pause_share, ranks=ranks, device=run.ctx.device))


def say(ev: PeriodicEvidence) -> tuple[str, str]:
    return ((f"every ~{ev.period_steps:.0f} steps the ranks spend about {ev.burst_ms:.0f} ms between "
             f"steps ({ev.bursts} pauses in {ev.steps} steps; {ev.per_step_ms:.1f} ms per step on "
             f"average, {ev.fraction:.0%} of the wall clock): periodic work outside the training "
             "step, such as evaluation, checkpointing or logging every k steps"),
            "make the periodic work cheaper or rarer: evaluate or checkpoint every more steps, on a "
            "smaller evaluation set, or save checkpoints asynchronously (torch.distributed.checkpoint's "
            "async_save, or a background thread writing a copy of the state)")


EVIDENCE = PeriodicEvidence
