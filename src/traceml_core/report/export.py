"""The run's series as rows: one per rank and step bucket, one per node and time bucket.

The rows of ``steps.jsonl`` and of every export (exporters/: the live batches, TensorBoard's event
files), made from the summary's bounded ``timeline`` (see :mod:`.timeline`): a point per step
bucket (at most 256 per rank), every rank up to 64 ranks, beyond that 16 selected ranks plus the
minimum, median and maximum over all ranks. Steps are the run's global steps
(``timeline.step_offset``: a resumed attempt's steps continue where the ledger says it began).
``None`` = not measured.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Union

from .document import NodeSeries, Summary, Timeline, read


def started(doc: Summary) -> Optional[float]:
    """The run's start as a Unix time, from the summary's ISO timestamp."""
    from datetime import datetime

    iso = doc.run.started_at
    if not iso:
        return None
    try:
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        return None


def _doc(summary: Union[Summary, dict[str, Any]]) -> Summary:
    return summary if isinstance(summary, Summary) else read(summary)


def at(values: Optional[list[Any]], i: int) -> Any:
    return values[i] if values and i < len(values) else None


def rank_rows(summary: Union[Summary, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One dict per rank and step bucket (the JSONL lines of kind ``rank``)."""
    doc = _doc(summary)
    tl = doc.timeline or Timeline()
    recorded = {r.rank: r.steps for r in doc.ranks}
    for r in tl.ranks:
        # the newest bucket ends at the rank's last recorded step, not at its nominal end: a
        # resumed attempt's first bucket would otherwise repeat the previous attempt's last point
        end = tl.step_offset + recorded[r.rank] - 1 if recorded.get(r.rank) else None
        for i in range(tl.buckets):
            first, last = tl.step_range(i)
            last = last if end is None else max(first, min(last, end))
            row: dict[str, Any] = {"kind": "rank", "rank": r.rank, "node": r.node, "host": r.host,
                                   "bucket": i, "step_first": first, "step_last": last,
                                   "t_s": r.t_s[i], "step_ms": r.step_ms[i],
                                   "step_max_ms": r.step_max_ms[i], "own_ms": r.own_ms[i]}
            for ph, vals in r.phases_ms.items():
                row[f"{ph}_ms"] = vals[i]
            row["mem_peak_bytes"] = at(r.mem_max_bytes, i)
            yield row
    env = tl.envelope
    if env:
        most = max(recorded.values(), default=0)
        for i in range(tl.buckets):
            first, last = tl.step_range(i)
            last = last if not most else max(first, min(last, tl.step_offset + most - 1))
            row = {"kind": "all_ranks", "ranks": env.ranks, "bucket": i,
                   "step_first": first, "step_last": last}
            for metric, series in (("step_ms", env.step_ms), ("own_ms", env.own_ms)):
                for stat in ("min", "median", "max"):
                    row[f"{metric[:-3]}_{stat}_ms"] = series[stat][i]
            yield row


def node_series_rows(n: NodeSeries) -> Iterator[dict[str, Any]]:
    for i, t in enumerate(n.t_s):
        row: dict[str, Any] = {"kind": "node", "node": n.node, "host": n.host, "bucket": i, "t_s": t,
                               "cpu_pct": at(n.cpu_pct, i), "ram_used_bytes": at(n.ram_used_bytes, i)}
        for g in n.gpus:
            row[f"gpu{g.index}_util_pct"] = at(g.util_pct, i)
            row[f"gpu{g.index}_mem_used_bytes"] = at(g.mem_used_bytes, i)
        yield row


def node_rows(summary: Union[Summary, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One dict per node and time bucket (the JSONL lines of kind ``node``)."""
    for n in (_doc(summary).timeline or Timeline()).nodes:
        yield from node_series_rows(n)


__all__ = ["rank_rows", "node_rows", "started", "at"]
