"""What one export carries: the run's new complete step buckets, the verdict as it forms, and at
the end the summary's files. Built from a (provisional) summary by :class:`BatchBuilder`.

The points are the rows of ``steps.jsonl`` (:func:`~traceml_core.report.export.rank_rows` and
:func:`~traceml_core.report.export.node_rows`, the summary's bounded ``timeline``): one per rank
and step bucket (every rank up to 64 ranks; beyond that the featured ranks plus the minimum,
median and maximum over all ranks, series ``all_ranks``) and one per node and time bucket. A
bucket is exported once, when complete: a series' newest bucket is still filling until the run
ends, and a bucket whose steps were already exported under a narrower bucket width (the series
doubles its width as the run grows) is skipped rather than counted twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..report.document import Summary, read
from ..report.export import node_rows, rank_rows

#: row fields that say where a point belongs, not what was measured
_WHERE = ("kind", "rank", "ranks", "node", "host", "bucket", "step_first", "step_last", "t_s")


@dataclass(frozen=True)
class RunIdentity:
    """The run an exporter writes about (from the aggregator's settings)."""

    run_name: str
    job_id: Optional[str]
    started_at: float
    nnodes: int
    nproc_per_node: int
    hostnames: tuple[str, ...]
    script: str
    run_dir: str
    #: which attempt of the run this is: 0, then 1, 2, ... for each requeue (or job continuing the
    #: run under the same run name), as attempts.py numbers the run directory's attempt-<n>/
    attempt: int = 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def key(self) -> str:
        """The run's identity across its attempts, for a destination's own run id: the same for
        every attempt that writes into the same run directory (a requeued job keeps its run name
        and logs directory; docs/goodput.md), so a W&B run and an MLflow run continue across
        requeues instead of starting one per attempt. 24 hex digits (W&B ids: [a-z0-9], <= 64)."""
        import hashlib

        where = os.path.abspath(self.run_dir)
        return hashlib.sha256(f"traceml\0{self.run_name}\0{where}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Point:
    """One complete bucket of one series. ``series``: ``rank_0003``, ``all_ranks`` or ``node_00``;
    ``x``: the bucket's last step (ranks) or its end in seconds since the start (nodes)."""

    series: str
    kind: str
    x: float
    values: dict[str, float]
    rank: Optional[int] = None
    node: Optional[int] = None
    host: str = ""
    #: when the bucket ended, seconds since the start (None: not known)
    t_s: Optional[float] = None

    @property
    def by_step(self) -> bool:
        return self.kind != "node"


@dataclass(frozen=True)
class VerdictNow:
    kind: str
    severity: str
    why: str
    next_step: str
    #: the rank it names, with its node and host (a hang's or a straggler's), where it names one
    rank: Optional[int] = None
    node: Optional[int] = None
    host: Optional[str] = None


@dataclass(frozen=True)
class FinalFiles:
    """The summary's files, for the end: attached as artifacts where the destination keeps files."""

    status: str
    summary_json: Optional[str] = None
    summary_txt: Optional[str] = None
    summary_html: Optional[str] = None

    def paths(self) -> list[str]:
        return [p for p in (self.summary_json, self.summary_txt, self.summary_html) if p]


@dataclass(frozen=True)
class Batch:
    at: float
    points: tuple[Point, ...] = ()
    verdict: Optional[VerdictNow] = None
    #: the run's status as the summary says it (a live batch: as of now)
    status: str = "running"
    final: Optional[FinalFiles] = None

    @property
    def size(self) -> int:
        """What counts as points (written or dropped): the buckets, and the verdict update."""
        return len(self.points) + (1 if self.verdict is not None else 0)


@dataclass
class BatchBuilder:
    """Turns summaries into batches, each bucket once (remembers the last bucket per series)."""

    #: series -> the last step (or second) already exported
    last: dict[str, float] = field(default_factory=dict)
    _verdict: Optional[VerdictNow] = None

    def build(self, summary: Union[Summary, dict[str, Any]], *, at: float,
              final: Optional[FinalFiles] = None) -> Batch:
        """The batch of everything new in ``summary``; ``final``: the end (newest buckets too)."""
        doc = summary if isinstance(summary, Summary) else read(summary)
        rows = [(self._point(r), r) for gen in (rank_rows(doc), node_rows(doc)) for r in gen]
        newest: dict[str, float] = {}
        for p, _ in rows:
            newest[p.series] = max(newest.get(p.series, p.x), p.x)
        points = []
        for p, row in sorted(rows, key=lambda pr: (pr[0].x, pr[0].series)):
            if not p.values or (final is None and p.x >= newest[p.series]):
                continue  # nothing measured, or the newest bucket: still filling
            first = float(row["step_first"]) if p.by_step else p.x
            if first <= self.last.get(p.series, float("-inf")):
                continue  # (part of) these steps went out already
            self.last[p.series] = p.x
            points.append(p)
        who = doc.verdict.culprit if isinstance(doc.verdict.culprit, dict) else {}
        verdict = VerdictNow(doc.verdict.kind, doc.verdict.severity, doc.verdict.why,
                             doc.verdict.next_step, who.get("rank"), who.get("node"),
                             who.get("host")) if doc.verdict.kind else None
        changed = verdict is not None and verdict != self._verdict
        self._verdict = verdict or self._verdict
        status = (doc.run.status or "completed") if final else "running"
        return Batch(at, tuple(points), verdict if (changed or final is not None) else None, status, final)

    @staticmethod
    def _point(row: dict[str, Any]) -> Point:
        kind = str(row["kind"])
        values = {k: float(v) for k, v in row.items() if k not in _WHERE and v is not None}
        if kind == "node":
            return Point(f"node_{int(row['node']):02d}", kind, float(row["t_s"] or 0.0), values,
                         node=int(row["node"]), host=str(row.get("host") or ""), t_s=row["t_s"])
        series = "all_ranks" if kind == "all_ranks" else f"rank_{int(row['rank']):04d}"
        node = row.get("node")
        return Point(series, kind, float(row["step_last"]), values,
                     rank=None if kind == "all_ranks" else int(row["rank"]),
                     node=None if node is None else int(node), host=str(row.get("host") or ""),
                     t_s=row.get("t_s"))

