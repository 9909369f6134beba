"""NO-CLEAR-BOTTLENECK (information): no other verdict applies.

How it decides. Given when no rule found anything: the breakdown of the wall clock per step by
phase (median over ranks of each phase's mean over the rank's wall clock per step). With fewer
than 20 steady steps per rank (after the warm-up steps) it is the only verdict, and says how
many steps it needs: a mean of a handful of steps is dominated by one-off hiccups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..model import RankSummary
from ..stats import median
from .base import Evidence, iteration, mean_ms

KIND = "no_clear_bottleneck"
THRESHOLDS = ("MIN_STEPS", "WARMUP_STEPS")

#: the phases of the "no single phase dominates" breakdown, in order, with their words
BREAKDOWN = (("input", "input"), ("forward", "forward"), ("backward", "backward"),
             ("optimizer", "optimizer"), ("comm", "comm"), ("nophase", "no phase"),
             ("outside", "between steps"))


@dataclass
class BreakdownEvidence(Evidence):
    shares: dict[str, Optional[float]] = field(default_factory=dict)
    too_few_steps: bool = False
    most: int = 0
    min_steps: int = 0
    warmup: int = 0
    unit: str = ""
    explained_by: Optional[str] = None

    def to_json(self) -> dict:
        if self.too_few_steps:
            return {"too_few_steps": True, "most": self.most, "min_steps": self.min_steps,
                    "warmup": self.warmup, "unit": self.unit}
        return {"shares": self.shares}


def shares(live: Sequence[RankSummary]) -> dict[str, Optional[float]]:
    """Each phase's share of the wall clock per step, % (median over ranks of mean / iteration);
    None for input when it is not measured."""
    out: dict[str, Optional[float]] = {}
    for ph, _ in BREAKDOWN:
        vals = [v / w for v, w in ((mean_ms(r, ph), iteration(r)) for r in live) if v is not None and w]
        if vals:
            out[ph] = round(100.0 * (median(vals) or 0.0), 1)
        elif ph == "input":
            out[ph] = None
    return out


def say(ev: BreakdownEvidence) -> tuple[str, str]:
    if ev.too_few_steps:
        return (f"too few steps to judge: at most {ev.most} steady steps per rank (need "
                f"{ev.min_steps} after {ev.warmup} warm-up steps)",
                f"run at least {ev.min_steps + ev.warmup} {ev.unit}")
    parts = []
    for ph, words in BREAKDOWN:
        if ph not in ev.shares:
            continue
        v = ev.shares[ph]
        parts.append("input not measured" if v is None else f"{words} {v:.0f}%")
    return ("no single phase dominates the wall clock per step (" + ", ".join(parts) + ")",
            "profile a few steps with torch.profiler to see inside the phases")


EVIDENCE = BreakdownEvidence
