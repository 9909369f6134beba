"""The steps a point stands for (``report/export.py``, the rows of ``steps.jsonl`` and of every
export): a bucket's last step is a step the rank made. The newest bucket of an attempt is
partial; at its nominal end (step 31 of an attempt that ended at 29) the next attempt's first
point, at step 31 of the run's global steps, repeated it: MLflow showed two points at one step."""

from __future__ import annotations

from traceml_core.exporters.batch import BatchBuilder
from traceml_core.report.document import RankSeries, Summary, Timeline
from traceml_core.report.export import rank_rows
from traceml_core.report.model import RankSummary


def attempt(offset: int, steps: int, width: int) -> Summary:
    n = -(-steps // width)
    series = RankSeries(0, 0, "h", step_ms=[10.0] * n, step_max_ms=[11.0] * n, own_ms=[9.0] * n,
                        t_s=[float(i) for i in range(n)])
    return Summary(ranks=[RankSummary(0, 0, "h", 0, "completed", steps=steps)],
                   timeline=Timeline(steps_per_bucket=width, buckets=n, ranks=[series], step_offset=offset))


def test_the_newest_bucket_ends_at_the_last_step_made():
    rows = list(rank_rows(attempt(0, 30, 4)))
    assert [(r["step_first"], r["step_last"]) for r in rows][-2:] == [(24, 27), (28, 29)]


def test_two_attempts_exported_at_the_end_never_share_a_step():
    xs = []
    for offset in (0, 30):   # a requeue: the second attempt goes on at the ledger's step 30
        batch = BatchBuilder().build(attempt(offset, 30, 4), at=0.0, final=object())  # type: ignore[arg-type]
        xs += [p.x for p in batch.points if p.series == "rank_0000"]
    assert len(xs) == len(set(xs)) and max(xs) == 59, sorted(xs)
