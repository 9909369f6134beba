"""Rank lists read the same everywhere (report/ranklist.py): runs of neighbours, a count when long.

A 64-rank job whose rank 0 fails takes the other 63 down with it; the headline must say so in a
few characters, not list 63 numbers (nor cut the list after five with "...")."""

from __future__ import annotations

from traceml_core.report.failure import diagnose
from traceml_core.report.model import RankSummary
from traceml_core.report.ranklist import rank_ranges, ranks_phrase
from traceml_core.rundata import RankEvent


def test_neighbours_are_runs_and_long_lists_say_how_many():
    assert ranks_phrase([3]) == "rank 3"
    assert ranks_phrase([2, 0, 1, 7]) == "ranks 0-2,7"
    assert ranks_phrase(range(512)) == "512 ranks (0-511)"
    assert rank_ranges([0, 2, 4, 6, 8], most=2) == "0,2,... (3 more runs)"


def test_the_failure_headline_of_a_wide_job_names_its_consequences_in_one_short_phrase():
    tb = 'Traceback (most recent call last):\n  File "/u/train.py", line 9, in <module>\nValueError: bad'
    ranks = [RankSummary(rank=0, node=0, host="n0", local_rank=0, status="error", error="ValueError: bad",
                         steps=5, steps_produced=5, fail_step=5, failed_at=1.0,
                         last_events=[RankEvent("exception", tb, 1.0)])]
    ranks += [RankSummary(rank=r, node=r // 8, host=f"n{r // 8}", local_rank=r % 8, status="error",
                          error="RuntimeError: Connection closed by peer", steps=5, steps_produced=5,
                          fail_step=5, failed_at=2.0) for r in range(1, 64)]
    v = diagnose(ranks, {}, "failed")
    assert v is not None and v["culprit"]["rank"] == 0
    assert "63 ranks (1-63) failed as a consequence (gloo lost the connection to a peer)" in v["why"]
