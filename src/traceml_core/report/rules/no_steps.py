"""NO-STEPS: no rank recorded a single step.

How it decides. The run's step records (report/steps.py): none from any rank that joined. The
reason says why (no ``trace_step`` and nothing inferred, the run stopped before its first step,
...); the advice is the two lines to add, or, for a run stopped that early (scancel, a time limit
shorter than the start-up), to give it the time to reach its first steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .base import Evidence

KIND = "no_steps"
THRESHOLDS: tuple[str, ...] = ()


@dataclass
class NoStepsEvidence(Evidence):
    reason: str = ""
    run_status: Optional[str] = None
    explained_by: Optional[str] = None

    def to_json(self) -> dict:
        return {"reason": self.reason, "run_status": self.run_status}


def say(ev: NoStepsEvidence) -> tuple[str, str]:
    from ..steps import TWO_LINES

    if ev.run_status in ("interrupted", "failed"):
        return (ev.reason,
                "the ranks' logs say how far each got; a job stopped this early (scancel, a time "
                "limit shorter than the start-up) ends before training: give it the time to reach "
                "its first steps")
    return (ev.reason,
            f"add two lines to the script: `{TWO_LINES[0]}` at the top and `{TWO_LINES[1].split('  ')[0]}` "
            "around the body of each training step (docs: quickstart)")


EVIDENCE = NoStepsEvidence
