"""A rank's checkpoint spans, counted only where its own step timing has room for them.

A rank reports each checkpoint save it timed as a ``span`` fact (rankfacts.py): how long, when it
ended, whether inside a traced step. The rank is the user's script, and nothing stops a script from
sending spans of saves that never happened ("6 checkpoint(s) seen" for a run with none), which
would move time into the ledger's checkpoint bucket, its wait for the saver into every other
rank's, and the position the next attempt resumes from. So the ledger counts a span only where the
rank's own step records, measured independently of it, confirm there was time for it:

* a save **between steps** must fit in the time the rank spent between its steps in the series
  bucket where it ended (``phase_sum`` of ``outside``: the gaps before that bucket's steps);
* a save **inside a step** must fit in that bucket's step time;
* a save **after the last step** must end before the rank was last heard of (its goodbye, its
  connection's close); one **before the first step**, after the rank joined.

Each within :data:`SLACK_NS` plus :data:`SLACK_SHARE` of the span (the two clocks read a few
microseconds apart). Spans older than the last :data:`~traceml_core.rankfacts.RECENT_SPANS` are
kept only in totals; they count when every recent span was confirmed and their total fits in the
rank's time between steps. A rank whose series is not there (an older checkpoint) has its spans
checked against its totals only. What is left out is said in the ledger's notes.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ...rankfacts import SpanTotals
from ...rundata import RankData
from ...statistics.series import OUTSIDE, series_values

#: a span may exceed the room measured for it by this much (clock reads, rounding)
SLACK_NS = 2_000_000
SLACK_SHARE = 0.05


@dataclass(frozen=True)
class Confirmed:
    """A rank's checkpoint spans as the ledger counts them, and how many it reported."""

    spans: SpanTotals
    reported: int

    @property
    def dropped(self) -> int:
        return self.reported - self.spans.count


def _fits(dur_ns: int, room_ns: float) -> bool:
    return dur_ns <= room_ns + SLACK_NS + SLACK_SHARE * dur_ns


def confirmed(r: RankData) -> Confirmed:
    """``r``'s checkpoint spans that its step timing confirms (see the module's docstring)."""
    ck = r.facts.span("checkpoint")
    if ck.count == 0:
        return Confirmed(ck, 0)
    t_end = series_values(r.series, "t_end")
    n = next((i for i, t in enumerate(t_end) if t <= 0), len(t_end))  # the buckets filled
    t_end, steps, gaps = t_end[:n], series_values(r.series, "step_sum")[:n], series_values(r.series, "phase_sum", OUTSIDE)[:n]
    began = (t_end[0] - steps[0] - gaps[0]) / 1e9 if t_end and steps and gaps else None
    last_end = (r.last_t_end or 0) / 1e9
    heard = max([t for t in ((r.bye.at if r.bye else None), r.closed_at, r.last_seen) if t] or [last_end])
    between_total = r.outside.sum
    kept = SpanTotals()
    ok = True
    for s in ck.recent:
        if s.end > last_end and not s.in_step:
            fits = s.end <= heard + SLACK_NS / 1e9 and _fits(s.dur_ns, (s.end - last_end) * 1e9)
        elif began is not None and s.end <= began and not s.in_step:  # before the first step
            fits = _fits(s.dur_ns, (s.end - (r.joined_at or s.end)) * 1e9)
        elif t_end and len(steps) == len(t_end) and len(gaps) == len(t_end):
            k = min(bisect_left(t_end, int(s.end * 1e9)), len(t_end) - 1)
            fits = _fits(s.dur_ns, steps[k] if s.in_step else gaps[k])
        else:  # no series to place it in: its kind of time must hold it at all
            fits = _fits(s.dur_ns, r.phase("step_ns").sum if s.in_step else between_total)
        if fits:
            kept.add(s)
        ok = ok and fits
    older = ck.count - len(ck.recent)
    older_ns = ck.sum_ns - sum(s.dur_ns for s in ck.recent)
    if older > 0 and ok and _fits(older_ns, between_total + r.phase("step_ns").sum - kept.sum_ns):
        older_in = ck.in_step_ns - sum(s.dur_ns for s in ck.recent if s.in_step)
        kept = SpanTotals(kept.count + older, kept.sum_ns + older_ns, max(kept.max_ns, ck.max_ns),
                          kept.in_step_ns + older_in, kept.recent)
    return Confirmed(kept, ck.count)
