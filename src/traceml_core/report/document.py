"""``final_summary.json`` as types: the one definition of the summary document.

The summary builder (``report/summary.py``) assembles a :class:`Summary` from its steps' typed
sections and writes ``to_json()``; every view of a finished run (the text summary, ``traceml
compare``, the exports, the report page) reads ``Summary.from_json(doc)``. ``from_json`` accepts
every summary of ``schema_version`` 1, older ones too: a field they lack takes the value
``docs/summary-schema.md`` documents for it ("null", empty).

Sections that hold statistics in their own serialised form (``compare.sketches``), the link probe
and a verdict's ``evidence`` stay plain mappings: their shape belongs to the statistics, the probe
and each verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .goodput.ledger import Ledger
from ..rundata import HangReport
from .model import Communication, GpuSummary, RankSummary
from .runcontext import RunContext, context_from_json, context_to_json

J = dict[str, Any]


def _d(v: Any) -> J:
    return v if isinstance(v, dict) else {}


@dataclass(slots=True)
class Verdict:
    """One verdict: what was found, how bad, why (with the numbers), what to do, who."""

    kind: str
    severity: str
    why: str
    next_step: str
    culprit: Optional[J] = None
    evidence: J = field(default_factory=dict)
    #: fields a verdict carries besides these (kept for the round trip)
    extra: J = field(default_factory=dict)

    _KEYS = ("kind", "severity", "why", "next_step", "culprit", "evidence")

    @property
    def label(self) -> str:
        """``RUN-FAILED``: how the text names its kind."""
        return self.kind.upper().replace("_", "-")

    @classmethod
    def from_json(cls, v: Any) -> "Verdict":
        v = _d(v)
        return cls(str(v.get("kind") or ""), str(v.get("severity") or ""), str(v.get("why") or ""),
                   str(v.get("next_step") or ""), v.get("culprit"), _d(v.get("evidence")),
                   {k: x for k, x in v.items() if k not in cls._KEYS})

    def to_json(self) -> J:
        return {"kind": self.kind, "severity": self.severity, "why": self.why,
                "next_step": self.next_step, "culprit": self.culprit, "evidence": self.evidence,
                **self.extra}


@dataclass(slots=True)
class RunSection:
    """The run's identity and outcome (``run``)."""

    name: Optional[str] = None
    job_id: Optional[str] = None
    mode: Optional[str] = None
    script: Optional[str] = None
    script_args: Optional[list[str]] = None
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    duration_s: float = 0.0
    status: Optional[str] = None
    exit_code: Optional[int] = None
    reason: str = ""
    finish_reported_by: Optional[str] = None

    @classmethod
    def from_json(cls, r: Any) -> "RunSection":
        r = _d(r)
        return cls(r.get("name"), r.get("job_id"), r.get("mode"), r.get("script"), r.get("script_args"),
                   r.get("started_at"), r.get("ended_at"), r.get("duration_s") or 0.0,
                   r.get("status"), r.get("exit_code"), r.get("reason") or "",
                   r.get("finish_reported_by"))

    def to_json(self) -> J:
        return {"name": self.name, "job_id": self.job_id, "mode": self.mode, "script": self.script,
                "script_args": self.script_args, "started_at": self.started_at,
                "ended_at": self.ended_at, "duration_s": self.duration_s, "status": self.status,
                "exit_code": self.exit_code, "reason": self.reason,
                "finish_reported_by": self.finish_reported_by}


@dataclass(slots=True)
class NodeLifecycle:
    """When one node's launch entered each phase, as its launcher reported it
    (``topology.nodes[].lifecycle``; local ISO times; rundata.LaunchLifecycle)."""

    phases: dict[str, Optional[str]] = field(default_factory=dict)
    first_step: Optional[str] = None
    allocation_start: Optional[str] = None
    restarts: Optional[int] = None

    @classmethod
    def from_json(cls, n: Any) -> Optional["NodeLifecycle"]:
        if n is None:
            return None
        n = _d(n)
        return cls(dict(n.get("phases") or {}), n.get("first_step"), n.get("allocation_start"),
                   n.get("restarts"))

    def to_json(self) -> J:
        return {"phases": self.phases, "first_step": self.first_step,
                "allocation_start": self.allocation_start, "restarts": self.restarts}


@dataclass(slots=True)
class TopoNode:
    """One node of the topology: who joined when, and how its launcher left."""

    node: int
    hostname: Optional[str] = None
    joined: bool = False
    joined_at: Optional[str] = None
    join_delay_s: Optional[float] = None
    late: bool = False
    left_early: bool = False
    exit_code: Optional[int] = None
    ranks: list[int] = field(default_factory=list)
    lifecycle: Optional[NodeLifecycle] = None

    @classmethod
    def from_json(cls, n: Any) -> "TopoNode":
        n = _d(n)
        return cls(n.get("node", 0), n.get("hostname"), bool(n.get("joined")), n.get("joined_at"),
                   n.get("join_delay_s"), bool(n.get("late")), bool(n.get("left_early")),
                   n.get("exit_code"), list(n.get("ranks") or []), NodeLifecycle.from_json(n.get("lifecycle")))

    def to_json(self) -> J:
        return {"node": self.node, "hostname": self.hostname, "joined": self.joined,
                "joined_at": self.joined_at, "join_delay_s": self.join_delay_s, "late": self.late,
                "left_early": self.left_early, "exit_code": self.exit_code, "ranks": self.ranks,
                "lifecycle": self.lifecycle.to_json() if self.lifecycle else None}


@dataclass(slots=True)
class Topology:
    nnodes: int = 0
    nproc_per_node: int = 0
    world_size: int = 0
    master_addr: Optional[str] = None
    nodes_joined: int = 0
    nodes: list[TopoNode] = field(default_factory=list)

    @classmethod
    def from_json(cls, t: Any) -> "Topology":
        t = _d(t)
        return cls(t.get("nnodes") or 0, t.get("nproc_per_node") or 0, t.get("world_size") or 0,
                   t.get("master_addr"), t.get("nodes_joined") or 0,
                   [TopoNode.from_json(n) for n in t.get("nodes") or []])

    def to_json(self) -> J:
        return {"nnodes": self.nnodes, "nproc_per_node": self.nproc_per_node,
                "world_size": self.world_size, "master_addr": self.master_addr,
                "nodes_joined": self.nodes_joined, "nodes": [n.to_json() for n in self.nodes]}


@dataclass(slots=True)
class StepsBlock:
    """How the run's steps were found (``steps``; report/steps.py)."""

    source: Optional[str] = None
    by_source: dict[str, list[int]] = field(default_factory=dict)
    framework: Optional[str] = None
    accumulation: Optional[int] = None
    backward_per_step: Optional[int] = None
    forward_measured: Optional[bool] = None
    recorded: int = 0
    notes: list[str] = field(default_factory=list)
    #: the lines the text summary shows about it
    explain: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, s: Any) -> "StepsBlock":
        s = _d(s)
        return cls(s.get("source"), dict(s.get("by_source") or {}), s.get("framework"),
                   s.get("accumulation"), s.get("backward_per_step"), s.get("forward_measured"),
                   s.get("recorded") or 0, list(s.get("notes") or []), list(s.get("explain") or []))

    def to_json(self) -> J:
        return {"source": self.source, "by_source": self.by_source, "framework": self.framework,
                "accumulation": self.accumulation, "backward_per_step": self.backward_per_step,
                "forward_measured": self.forward_measured, "recorded": self.recorded,
                "notes": self.notes, "explain": self.explain}


@dataclass(slots=True)
class StepTime:
    """THE median step of the run, and its spread, over every step of every rank (ms)."""

    median_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    steps: int = 0

    @classmethod
    def from_json(cls, s: Any) -> "StepTime":
        s = _d(s)
        return cls(s.get("median_ms"), s.get("p90_ms"), s.get("p99_ms"), s.get("steps") or 0)

    def to_json(self) -> J:
        return {"median_ms": self.median_ms, "p90_ms": self.p90_ms, "p99_ms": self.p99_ms,
                "steps": self.steps}


@dataclass(slots=True)
class Across:
    """One phase across ranks: how many measured it, the median, the worst rank, the skew."""

    ranks: int
    median_ms: Optional[float]
    worst_rank: int
    worst_node: Optional[int]
    worst_ms: float
    skew: Optional[float]

    @classmethod
    def from_json(cls, a: Any) -> Optional["Across"]:
        if not isinstance(a, dict):
            return None
        return cls(a.get("ranks") or 0, a.get("median_ms"), a.get("worst_rank", -1), a.get("worst_node"),
                   a.get("worst_ms") or 0.0, a.get("skew"))

    def to_json(self) -> J:
        return {"ranks": self.ranks, "median_ms": self.median_ms, "worst_rank": self.worst_rank,
                "worst_node": self.worst_node, "worst_ms": self.worst_ms, "skew": self.skew}


@dataclass(slots=True)
class SystemNode:
    """One node's system evidence over the run (``system.nodes[]``)."""

    node: int
    host: str = ""
    samples: int = 0
    cpu_pct_mean: Optional[float] = None
    cpu_pct_max: Optional[float] = None
    ram_used_max: Optional[float] = None
    ram_total: Optional[float] = None
    gpus: list[GpuSummary] = field(default_factory=list)

    @classmethod
    def from_json(cls, n: Any) -> "SystemNode":
        n = _d(n)
        node = n.get("node", 0)
        return cls(node, n.get("host") or "", n.get("samples") or 0, n.get("cpu_pct_mean"),
                   n.get("cpu_pct_max"), n.get("ram_used_max"), n.get("ram_total"),
                   [GpuSummary.from_json(g, node) for g in n.get("gpus") or []])

    def to_json(self) -> J:
        return {"node": self.node, "host": self.host, "samples": self.samples,
                "cpu_pct_mean": self.cpu_pct_mean, "cpu_pct_max": self.cpu_pct_max,
                "ram_used_max": self.ram_used_max, "ram_total": self.ram_total,
                "gpus": [g.to_json() for g in self.gpus]}


@dataclass(slots=True)
class Telemetry:
    """Every record accounted for (``telemetry``)."""

    records_received: int = 0
    records_expected: int = 0
    records_lost: int = 0
    gaps: int = 0
    duplicates: int = 0
    client_dropped: int = 0
    relay_dropped: int = 0
    #: what ranks without a goodbye may have held unsent; None when one of them is unbounded
    records_unsent_max: Optional[int] = None
    ranks_without_goodbye: int = 0
    complete: bool = False
    sketched_fraction: Optional[float] = None
    aggregator_restarts: int = 0
    wire: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, t: Any) -> "Telemetry":
        t = _d(t)
        return cls(t.get("records_received") or 0, t.get("records_expected") or 0,
                   t.get("records_lost") or 0, t.get("gaps") or 0, t.get("duplicates") or 0,
                   t.get("client_dropped") or 0, t.get("relay_dropped") or 0,
                   t.get("records_unsent_max"), t.get("ranks_without_goodbye") or 0,
                   bool(t.get("complete")), t.get("sketched_fraction"),
                   t.get("aggregator_restarts") or 0, dict(t.get("wire") or {}))

    def to_json(self) -> J:
        return {"records_received": self.records_received, "records_expected": self.records_expected,
                "records_lost": self.records_lost, "gaps": self.gaps, "duplicates": self.duplicates,
                "client_dropped": self.client_dropped, "relay_dropped": self.relay_dropped,
                "records_unsent_max": self.records_unsent_max,
                "ranks_without_goodbye": self.ranks_without_goodbye, "complete": self.complete,
                "sketched_fraction": self.sketched_fraction,
                "aggregator_restarts": self.aggregator_restarts, "wire": self.wire}


@dataclass(slots=True)
class StepSeries:
    """Step time per series bucket over all ranks (``compare.step_series``)."""

    steps_per_bucket: int = 1
    mean_ms: list[Optional[float]] = field(default_factory=list)
    max_ms: list[Optional[float]] = field(default_factory=list)

    @classmethod
    def from_json(cls, s: Any) -> "StepSeries":
        s = _d(s)
        return cls(s.get("steps_per_bucket") or 1, list(s.get("mean_ms") or []), list(s.get("max_ms") or []))

    def to_json(self) -> J:
        return {"steps_per_bucket": self.steps_per_bucket, "mean_ms": self.mean_ms, "max_ms": self.max_ms}


@dataclass(slots=True)
class CompareSection:
    """What ``traceml compare`` reads: each phase's histogram over every step of every rank (the
    statistics' serialised merged sketch), and the step time over the run."""

    sketches: dict[str, J] = field(default_factory=dict)
    step_series: StepSeries = field(default_factory=StepSeries)

    @classmethod
    def from_json(cls, c: Any) -> "CompareSection":
        c = _d(c)
        return cls(dict(c.get("sketches") or {}), StepSeries.from_json(c.get("step_series")))

    def to_json(self) -> J:
        return {"sketches": self.sketches, "step_series": self.step_series.to_json()}


@dataclass(slots=True)
class RankSeries:
    """One rank over the run, per step bucket (``timeline.ranks[]``; report/timeline.py)."""

    rank: int
    node: Optional[int] = None
    host: str = ""
    step_ms: list[Optional[float]] = field(default_factory=list)
    step_max_ms: list[Optional[float]] = field(default_factory=list)
    own_ms: list[Optional[float]] = field(default_factory=list)
    phases_ms: dict[str, list[Optional[float]]] = field(default_factory=dict)
    #: None when memory was not measured
    mem_max_bytes: Optional[list[Optional[int]]] = None
    t_s: list[Optional[float]] = field(default_factory=list)

    @classmethod
    def from_json(cls, r: Any) -> "RankSeries":
        r = _d(r)
        return cls(r.get("rank", -1), r.get("node"), r.get("host") or "", list(r.get("step_ms") or []),
                   list(r.get("step_max_ms") or []), list(r.get("own_ms") or []),
                   dict(r.get("phases_ms") or {}), r.get("mem_max_bytes"), list(r.get("t_s") or []))

    def to_json(self) -> J:
        return {"rank": self.rank, "node": self.node, "host": self.host, "step_ms": self.step_ms,
                "step_max_ms": self.step_max_ms, "own_ms": self.own_ms, "phases_ms": self.phases_ms,
                "mem_max_bytes": self.mem_max_bytes, "t_s": self.t_s}


@dataclass(slots=True)
class GpuSeries:
    index: int
    util_pct: Optional[list[Optional[float]]] = None
    mem_used_bytes: Optional[list[Optional[float]]] = None
    mem_total_bytes: Optional[float] = None

    @classmethod
    def from_json(cls, g: Any) -> "GpuSeries":
        g = _d(g)
        return cls(g.get("index", 0), g.get("util_pct"), g.get("mem_used_bytes"), g.get("mem_total_bytes"))

    def to_json(self) -> J:
        return {"index": self.index, "util_pct": self.util_pct, "mem_used_bytes": self.mem_used_bytes,
                "mem_total_bytes": self.mem_total_bytes}


@dataclass(slots=True)
class NodeSeries:
    """One node over wall-clock time (``timeline.nodes[]``)."""

    node: int
    host: str = ""
    seconds_per_bucket: float = 1.0
    t_s: list[float] = field(default_factory=list)
    cpu_pct: Optional[list[Optional[float]]] = None
    ram_used_bytes: Optional[list[Optional[float]]] = None
    ram_total_bytes: Optional[float] = None
    gpus: list[GpuSeries] = field(default_factory=list)

    @classmethod
    def from_json(cls, n: Any) -> "NodeSeries":
        n = _d(n)
        return cls(n.get("node", 0), n.get("host") or "", n.get("seconds_per_bucket") or 1.0,
                   list(n.get("t_s") or []), n.get("cpu_pct"), n.get("ram_used_bytes"),
                   n.get("ram_total_bytes"), [GpuSeries.from_json(g) for g in n.get("gpus") or []])

    def to_json(self) -> J:
        return {"node": self.node, "host": self.host, "seconds_per_bucket": self.seconds_per_bucket,
                "t_s": self.t_s, "cpu_pct": self.cpu_pct, "ram_used_bytes": self.ram_used_bytes,
                "ram_total_bytes": self.ram_total_bytes, "gpus": [g.to_json() for g in self.gpus]}


@dataclass(slots=True)
class Envelope:
    """Over all ranks of a large run, per bucket: the least, median and most (``timeline.envelope``)."""

    ranks: int
    #: ``{"min": [...], "median": [...], "max": [...]}`` per metric
    step_ms: dict[str, list[Optional[float]]]
    own_ms: dict[str, list[Optional[float]]]

    @classmethod
    def from_json(cls, e: Any) -> Optional["Envelope"]:
        if not isinstance(e, dict):
            return None
        return cls(e.get("ranks") or 0, dict(e.get("step_ms") or {}), dict(e.get("own_ms") or {}))

    def to_json(self) -> J:
        return {"ranks": self.ranks, "step_ms": self.step_ms, "own_ms": self.own_ms}


@dataclass(slots=True)
class Timeline:
    """The run over time (``timeline``): per rank per step bucket, per node per time bucket."""

    steps_per_bucket: int = 1
    buckets: int = 0
    bucket_limit: int = 0
    rank_limit: int = 0
    ranks_total: int = 0
    #: ``all``, or ``selected`` (a large run: some ranks, and the envelope over all)
    ranks_shown: str = "all"
    phases: list[str] = field(default_factory=list)
    ranks: list[RankSeries] = field(default_factory=list)
    envelope: Optional[Envelope] = None
    nodes: list[NodeSeries] = field(default_factory=list)
    #: the run's global step of this attempt's first step (the goodput ledger's first position of
    #: the current attempt; 0 for a first attempt): a resumed attempt's charts and exports are
    #: drawn against the steps the ledger uses, not from 0 again
    step_offset: int = 0

    def step_range(self, bucket: int) -> tuple[int, int]:
        """The first and last step of a bucket, as the run's global steps."""
        w = max(1, self.steps_per_bucket)
        return self.step_offset + bucket * w, self.step_offset + (bucket + 1) * w - 1

    @classmethod
    def from_json(cls, t: Any) -> "Timeline":
        t = _d(t)
        return cls(t.get("steps_per_bucket") or 1, t.get("buckets") or 0, t.get("bucket_limit") or 0,
                   t.get("rank_limit") or 0, t.get("ranks_total") or 0, t.get("ranks_shown") or "all",
                   list(t.get("phases") or []), [RankSeries.from_json(r) for r in t.get("ranks") or []],
                   Envelope.from_json(t.get("envelope")), [NodeSeries.from_json(n) for n in t.get("nodes") or []],
                   int(t.get("step_offset") or 0))

    def to_json(self) -> J:
        return {"steps_per_bucket": self.steps_per_bucket, "buckets": self.buckets,
                "bucket_limit": self.bucket_limit, "rank_limit": self.rank_limit,
                "ranks_total": self.ranks_total, "ranks_shown": self.ranks_shown, "phases": self.phases,
                "ranks": [r.to_json() for r in self.ranks],
                "envelope": self.envelope.to_json() if self.envelope else None,
                "nodes": [n.to_json() for n in self.nodes], "step_offset": self.step_offset}


@dataclass(slots=True)
class HangSection:
    """The last hang report as the summary shows it: the report, and whether steps resumed."""

    report: HangReport
    resumed: bool

    @classmethod
    def from_json(cls, h: Any) -> Optional["HangSection"]:
        if not isinstance(h, dict):
            return None
        return cls(HangReport.from_checkpoint(h), bool(h.get("resumed")))

    def to_json(self) -> J:
        return {**self.report.to_checkpoint(), "resumed": self.resumed}


@dataclass(slots=True)
class NextJobSection:
    """``next_job`` of the summary (docs/summary-schema.md): ``lines`` to paste into the next job
    script, ``why`` (one reason per line), ``notes`` (what could not be judged, and why)."""

    lines: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Any) -> Optional["NextJobSection"]:
        if not isinstance(d, dict):
            return None
        return cls([str(x) for x in d.get("lines") or []], [str(x) for x in d.get("why") or []],
                   [str(x) for x in d.get("notes") or []])

    def to_json(self) -> J:
        return {"lines": self.lines, "why": self.why, "notes": self.notes}

    def __bool__(self) -> bool:
        return bool(self.lines or self.notes)


@dataclass(slots=True)
class Summary:
    """The whole ``final_summary.json`` (docs/summary-schema.md)."""

    schema_version: int = 1
    provisional: bool = False
    #: ``{checkpoint, taken_at, taken_at_iso, final_checkpoint}`` when rebuilt from a checkpoint
    rebuilt: Optional[J] = None
    run: RunSection = field(default_factory=RunSection)
    topology: Topology = field(default_factory=Topology)
    steps: StepsBlock = field(default_factory=StepsBlock)
    verdict: Verdict = field(default_factory=lambda: Verdict("no_clear_bottleneck", "info", "", ""))
    other_verdicts: list[Verdict] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    warmup_steps: int = 0
    step_time: StepTime = field(default_factory=StepTime)
    #: by phase (``outside`` included); None where no rank measured it
    across_ranks: dict[str, Optional[Across]] = field(default_factory=dict)
    device: str = "unknown"
    communication: Optional[Communication] = None
    ranks: list[RankSummary] = field(default_factory=list)
    rank_endings: dict[str, int] = field(default_factory=dict)
    system_nodes: list[SystemNode] = field(default_factory=list)
    gpu_util_pct_mean: Optional[float] = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    compare: CompareSection = field(default_factory=CompareSection)
    timeline: Optional[Timeline] = None
    files: dict[str, str] = field(default_factory=dict)
    hang: Optional[HangSection] = None
    hangs: list[HangReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the last resort's mark (report/partial.py); None for a whole summary
    partial: Optional[J] = None
    #: the goodput ledger over the run's attempts (goodput/ledger.py); None in older summaries
    goodput: Optional[Ledger] = None
    #: lines for the next job script (report/nextjob.py); None when there are none
    next_job: Optional[NextJobSection] = None
    #: what the run ran on (report/runcontext.py); None in older summaries
    context: Optional[RunContext] = None

    @property
    def verdicts(self) -> list[Verdict]:
        """The primary verdict, then the others."""
        return [self.verdict] + self.other_verdicts

    @property
    def whole(self) -> bool:
        return self.partial is None or bool(self.partial.get("whole", True))

    @classmethod
    def from_json(cls, doc: Any) -> "Summary":
        doc = _d(doc)
        sysd = _d(doc.get("system"))
        comm = doc.get("communication")
        return cls(
            schema_version=doc.get("schema_version") or 1, provisional=bool(doc.get("provisional")),
            rebuilt=doc.get("rebuilt"), run=RunSection.from_json(doc.get("run")),
            topology=Topology.from_json(doc.get("topology")), steps=StepsBlock.from_json(doc.get("steps")),
            verdict=Verdict.from_json(doc.get("verdict")),
            other_verdicts=[Verdict.from_json(v) for v in doc.get("other_verdicts") or []],
            phases=list(doc.get("phases") or []), warmup_steps=doc.get("warmup_steps") or 0,
            step_time=StepTime.from_json(doc.get("step_time")),
            across_ranks={k: Across.from_json(v) for k, v in _d(doc.get("across_ranks")).items()},
            device=doc.get("device") or "unknown",
            communication=Communication.from_json(comm) if isinstance(comm, dict) else None,
            ranks=[RankSummary.from_json(r) for r in doc.get("ranks") or []],
            rank_endings=dict(doc.get("rank_endings") or {}),
            system_nodes=[SystemNode.from_json(n) for n in sysd.get("nodes") or []],
            gpu_util_pct_mean=sysd.get("gpu_util_pct_mean"),
            telemetry=Telemetry.from_json(doc.get("telemetry")),
            compare=CompareSection.from_json(doc.get("compare")),
            timeline=Timeline.from_json(doc["timeline"]) if isinstance(doc.get("timeline"), dict) else None,
            files=dict(doc.get("files") or {}), hang=HangSection.from_json(doc.get("hang")),
            hangs=[HangReport.from_checkpoint(h) for h in doc.get("hangs") or [] if isinstance(h, dict)],
            notes=list(doc.get("notes") or []), partial=doc.get("partial"),
            goodput=Ledger.from_json(doc.get("goodput")),
            next_job=NextJobSection.from_json(doc.get("next_job")),
            context=context_from_json(doc.get("context")))

    def to_json(self) -> J:
        out: J = {
            "schema_version": self.schema_version, "provisional": self.provisional,
            "rebuilt": self.rebuilt, "run": self.run.to_json(), "topology": self.topology.to_json(),
            "steps": self.steps.to_json(), "verdict": self.verdict.to_json(),
            "other_verdicts": [v.to_json() for v in self.other_verdicts], "phases": self.phases,
            "warmup_steps": self.warmup_steps, "step_time": self.step_time.to_json(),
            "across_ranks": {k: a.to_json() if a else None for k, a in self.across_ranks.items()},
            "device": self.device,
            "communication": self.communication.to_json() if self.communication else None,
            "ranks": [r.to_json() for r in self.ranks], "rank_endings": self.rank_endings,
            "system": {"nodes": [n.to_json() for n in self.system_nodes],
                       "gpu_util_pct_mean": self.gpu_util_pct_mean},
            "telemetry": self.telemetry.to_json(), "compare": self.compare.to_json(),
            "timeline": self.timeline.to_json() if self.timeline else None, "files": self.files,
            "hang": self.hang.to_json() if self.hang else None,
            "hangs": [h.to_checkpoint() for h in self.hangs], "notes": self.notes,
        }
        if self.goodput is not None:
            out["goodput"] = self.goodput.to_json()
        if self.partial is not None:
            out["partial"] = self.partial
        if self.next_job is not None:
            out["next_job"] = self.next_job.to_json()
        if self.context is not None:
            out["context"] = context_to_json(self.context)
        return out
