"""Node 0's hang detection: when to look at the ranks, and when to call it a hang.

A state machine fed once a second by the aggregator's tick (the total of step records received,
whether some rank should still be stepping, the run's median step) and by the readings it asks
for (:meth:`HangWatch.observe` says when; the aggregator sends the ``stacks`` request and hands
the report to :meth:`HangWatch.reading`):

* **silence**: no rank completed a step (the total of records did not move) while some rank
  should still be stepping (it has stepped, has not said goodbye, and its link is open). Before
  the first step nothing is judged (imports, compilation, rendezvous, a slow first step), and a
  run whose ranks all said goodbye is over.
* after ``HANG_PROBE_AFTER_S`` of silence (or 1.5 median steps), every rank is read every
  ``HANG_PROBE_EVERY_S``: where it is and its progress counters (report/hang.py);
* **the state rule** (report/hangstate.py) compares the newest reading with one at least
  ``HANG_CONFIRM_S`` older: a hang is declared when the ranks that others wait for made no
  progress (or all ranks wait in collectives and none progresses). A rank that works in a long
  save or evaluation is logged as working ("rank 0 has been in save_checkpoint for 4 min
  (working: ...)") at 30 s of silence and each doubling, and is never a hang: it becomes one
  only when its progress stops;
* **the backstop** (``--hang-report-after``, ``auto``: a minute or 20 median steps): past it, a
  reading that shows no rank working is declared a hang by time (the state could not decide:
  every rank idle in its own code, or no rank answered).

One declaration per silence; when step records arrive again the silence is over (the aggregator
marks the report resolved). Each declaration says which rule fired and how long after the last
step it came. What is worth a line in the job's log goes to :attr:`HangWatch.notices`
(aggregator/notices.py), which node 0's launcher prints as it polls the aggregator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..report import hang
from ..report.hangstate import Judgement, judge
from ..report.ranklist import ranks_phrase
from .notices import Notices
from ..report.thresholds import (HANG_CONFIRM_S, HANG_PROBE_AFTER_S, HANG_PROBE_EVERY_S,
                                 HANG_PROBE_STEPS, HANG_REPORT_FLOOR_S, HANG_REPORT_STEPS)

#: at most this many reports per run (a run that stalls and recovers over and over)
MAX_REPORTS = 5
#: a rank working through a long silence is logged at this much silence, then at each doubling
WORKING_FIRST_S = 30.0


@dataclass
class Silence:
    began: float                        # monotonic time of the last progress before it
    began_wall: float
    readings: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    declared: bool = False
    last_judgement: Optional[Judgement] = None
    next_working_log: float = WORKING_FIRST_S


class HangWatch:
    def __init__(self, setting: str = "auto", notices: Optional[Notices] = None) -> None:
        #: "auto", "off", or seconds (``--hang-report-after``: the backstop)
        self.setting = setting
        self.last_records = -1
        self.last_progress = time.monotonic()
        self.silence: Optional[Silence] = None
        self.reports = 0
        #: where its lines for the job's log go (aggregator/notices.py)
        self.notices = notices if notices is not None else Notices()

    # -- thresholds ---------------------------------------------------------------------------
    def threshold(self, median_step_ms: Optional[float]) -> tuple[float, str]:
        """The backstop: (seconds, where the value came from, in words)."""
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

    def probe_after(self, median_step_ms: Optional[float]) -> float:
        after = max(HANG_PROBE_AFTER_S, HANG_PROBE_STEPS * (median_step_ms or 0.0) / 1000.0)
        return min(after, self.threshold(median_step_ms)[0])

    # -- the aggregator's tick ------------------------------------------------------------------
    def observe(self, now: float, records: int, should_step: bool,
                median_step_ms: Optional[float], wall: Optional[float] = None) -> bool:
        """Feed one status; True when every rank should be read now."""
        if self.setting == "off":
            return False
        if records != self.last_records:
            self.last_records, self.last_progress = records, now
            self.silence = None
            return False
        if records <= 0 or not should_step or self.reports >= MAX_REPORTS:
            return False
        silent = now - self.last_progress
        if silent < self.probe_after(median_step_ms):
            return False
        s = self.silence
        if s is None:
            wall = time.time() if wall is None else wall
            s = self.silence = Silence(self.last_progress, wall - silent)
        if s.declared:
            return False
        return not s.readings or now - s.readings[-1][0] >= HANG_PROBE_EVERY_S

    def reading(self, now: float, report: dict[str, Any], median_step_ms: Optional[float],
                wall: Optional[float] = None) -> Optional[dict[str, Any]]:
        """One reading of every rank (report/hang.build); returns the hang report when a hang is
        declared now (the aggregator keeps it for the summary), else None."""
        s = self.silence
        if s is None or s.declared:
            return None
        wall = time.time() if wall is None else wall
        s.readings.append((now, report))
        # the newest reading at least HANG_CONFIRM_S older than this one, and the ones after it
        older = [i for i, (t, _) in enumerate(s.readings) if now - t >= HANG_CONFIRM_S]
        if older:
            del s.readings[:older[-1]]
        silent = now - s.began
        limit, source = self.threshold(median_step_ms)
        j: Optional[Judgement] = None
        if now - s.readings[0][0] >= HANG_CONFIRM_S:
            j = judge(s.readings[0][1]["ranks"], report["ranks"], now - s.readings[0][0])
            s.last_judgement = j
        if j is not None and j.state == "hang":
            return self._declare(s, report, wall, silent, limit, source, "state", j)
        working = j.state == "working" if j is not None else (
            s.last_judgement is not None and s.last_judgement.state == "working")
        if j is not None and j.state == "working" and silent >= s.next_working_log:
            s.next_working_log = max(silent, s.next_working_log) * 2
            self._working_notice(j, report, silent)
        if silent >= limit and not working:
            return self._declare(s, report, wall, silent, limit, source, "time", j)
        return None

    # -- words --------------------------------------------------------------------------------
    def _working_notice(self, j: Judgement, report: dict[str, Any], silent: float) -> None:
        rows = {int(r["rank"]): r for r in report["ranks"]}
        for rank, place in j.working[:4]:
            r = rows.get(rank, {})
            node = f"node {r.get('node')}" + (f", {r['host']}" if r.get("host") else "")
            self.notices.say(f"rank {rank} ({node}) has been in {place} for {_duration(silent)} "
                        f"(working: {j.progress[rank].words()}); no rank completed a step meanwhile")
        if len(j.working) > 4:
            self.notices.say(f"... and {len(j.working) - 4} more rank(s) working")

    def _declare(self, s: Silence, report: dict[str, Any], wall: float, silent: float, limit: float,
                 source: str, kind: str, j: Optional[Judgement]) -> dict[str, Any]:
        s.declared = True
        self.reports += 1
        out = dict(report)
        if kind == "state" and j is not None:
            because = j.because
            rule = {"kind": "state", "name": j.rule, "because": because}
            if j.rule == "all_stuck":
                out["finding"] = _all_stuck(report)
        else:
            because = (f"no rank completed a step for {silent:.0f} s (the backstop: {source}) and "
                       "no rank was seen working")
            rule = {"kind": "time", "name": "backstop", "because": because}
            if j is not None and j.culprits and not out.get("culprits"):
                out["culprits"] = list(j.culprits)
        out.update(silent_s=round(silent, 1), threshold_s=round(limit, 1), threshold_source=source,
                   rule=rule, began_at=round(s.began_wall, 3), detect_s=round(silent, 1))
        for line in hang.render(out):
            self.notices.say(line)
        return out


def _all_stuck(report: dict[str, Any]) -> str:
    """Every rank in the same collective and none progressing: named with its sequence number
    when the ranks' SDKs agree on it."""
    rows = report["ranks"]
    op = hang.words(rows[0].get("collective")) if rows else "a collective"
    seqs = {(r.get("in_flight") or {}).get("seq") for r in rows}
    seq = f" (collective #{seqs.pop()} of the run)" if len(seqs) == 1 and None not in seqs else ""
    return (f"all ranks are stuck in {op}{seq}: {ranks_phrase([int(r['rank']) for r in rows])} wait "
            "in it and none makes progress, so the collective itself is stuck (a network or NCCL "
            "problem, or a peer process outside this job's ranks)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
