"""When is a run hung? The launcher's rule for the hang report (``--hang-report-after``).

A pure state machine over what node 0's aggregator reports once a second: the total of step
records received, whether some rank should still be stepping (it has stepped, has not said
goodbye and is reachable: the aggregator's ``silent`` list), and the run's median step.

* The run is **stalled** when some rank should still be stepping and the total of records has not
  moved for the threshold: no rank completed a step. Before the first step nothing is judged
  (start-up: imports, compilation, rendezvous), and a run whose ranks all said goodbye is over.
* The threshold is ``--hang-report-after`` seconds, or with ``auto`` (the default)
  ``max(HANG_REPORT_FLOOR_S, HANG_REPORT_STEPS x the median step)`` (report/thresholds.py has why).
  The silence is counted from the arrival of the last records, which is after the last step ended
  (records travel in batches), so the real silence is at least what is reported.
* One report per stall; when records move again the stall is over (:attr:`resolved`), and a later
  stall gets its own report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..report.thresholds import HANG_REPORT_FLOOR_S, HANG_REPORT_STEPS

#: at most this many reports per run (a run that stalls and recovers over and over)
MAX_REPORTS = 5


@dataclass
class Stall:
    began: float              # monotonic time of the last progress before it
    reported_at: float
    threshold_s: float
    threshold_source: str
    resolved_after_s: Optional[float] = None


@dataclass
class HangWatch:
    setting: str = "auto"  # "auto", "off" or seconds
    last_records: int = -1
    last_progress: float = 0.0
    current: Optional[Stall] = None
    stalls: list[Stall] = field(default_factory=list)

    def threshold(self, median_step_ms: Optional[float]) -> tuple[float, str]:
        """(seconds, where the value came from, in words)."""
        if self.setting not in ("auto", "off"):
            return float(self.setting), f"--hang-report-after={self.setting}"
        floor = HANG_REPORT_FLOOR_S
        if median_step_ms:
            steps = HANG_REPORT_STEPS * median_step_ms / 1000.0
            if steps > floor:
                return steps, (f"auto: {HANG_REPORT_STEPS:g} x the median step of "
                               f"{median_step_ms / 1000.0:.1f} s")
        return floor, (f"auto: max({floor:g} s, {HANG_REPORT_STEPS:g} x the median step"
                       + (f" of {median_step_ms:.0f} ms" if median_step_ms else "") + ")")

    def observe(self, now: float, records: int, should_step: bool,
                median_step_ms: Optional[float]) -> Optional[Stall]:
        """Feed one status; returns a new :class:`Stall` when a report is due now."""
        if self.setting == "off":
            return None
        if records != self.last_records:
            if self.current is not None and self.last_records >= 0:
                self.current.resolved_after_s = round(now - self.current.began, 1)
            self.current = None
            self.last_records, self.last_progress = records, now
            return None
        if records <= 0 or not should_step or self.current is not None:
            return None
        limit, source = self.threshold(median_step_ms)
        if now - self.last_progress < limit or len(self.stalls) >= MAX_REPORTS:
            return None
        self.current = Stall(self.last_progress, now, limit, source)
        self.stalls.append(self.current)
        return self.current
