"""``final_summary.json`` as types: the one definition of the summary document.

The summary builder (``report/summary.py``) assembles a :class:`Summary` from its steps' typed
sections; every view of a run (the text summary, the next job's advice, ``traceml compare``, the
exports, the report page) reads the typed :class:`Summary`, which the one codec
(``traceml_core/codec.py``) writes as ``final_summary.json`` and reads back (:func:`read`): every
summary of ``schema_version`` 1, older ones too, a field they lack taking the value
``docs/summary-schema.md`` documents for it ("null", empty).

Sections that hold statistics in their own serialised form (``compare.sketches``), the link probe
and a verdict's ``evidence`` stay plain mappings: their shape belongs to the statistics, the probe
and each verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from ..codec import FLAT, OMIT, REST, Number, Record, decode, encode
from .goodput.ledger import Ledger
from ..rundata import HangReport
from .model import Communication, GpuSummary, RankSummary
from .runcontext import RunContext

J = dict[str, Any]


@dataclass(slots=True)
class Verdict(Record):
    """One verdict: what was found, how bad, why (with the numbers), what to do, who."""

    kind: str = ""
    severity: str = ""
    why: str = ""
    next_step: str = ""
    culprit: Optional[J] = None
    evidence: J = field(default_factory=dict)
    #: fields a verdict carries besides these (kept for the round trip)
    extra: Annotated[J, REST] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``RUN-FAILED``: how the text names its kind."""
        return self.kind.upper().replace("_", "-")


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


@dataclass(slots=True)
class NodeLifecycle:
    """When one node's launch entered each phase, as its launcher reported it
    (``topology.nodes[].lifecycle``; local ISO times; rundata.LaunchLifecycle)."""

    phases: dict[str, Optional[str]] = field(default_factory=dict)
    first_step: Optional[str] = None
    allocation_start: Optional[str] = None
    restarts: Optional[int] = None


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


@dataclass(slots=True)
class Topology:
    nnodes: int = 0
    nproc_per_node: int = 0
    world_size: int = 0
    master_addr: Optional[str] = None
    nodes_joined: int = 0
    nodes: list[TopoNode] = field(default_factory=list)


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


@dataclass(slots=True)
class StepTime:
    """THE median step of the run, and its spread, over every step of every rank (ms)."""

    median_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    steps: int = 0


@dataclass(slots=True)
class Across:
    """One phase across ranks: how many measured it, the median, the worst rank, the skew."""

    ranks: int = 0
    median_ms: Optional[float] = None
    worst_rank: int = -1
    worst_node: Optional[int] = None
    worst_ms: float = 0.0
    skew: Optional[float] = None


@dataclass(slots=True)
class SystemNode:
    """One node's system evidence over the run (``system.nodes[]``)."""

    node: int
    host: str = ""
    samples: int = 0
    cpu_pct_mean: Optional[float] = None
    cpu_pct_max: Optional[float] = None
    ram_used_max: Optional[Number] = None
    ram_total: Optional[Number] = None
    gpus: list[GpuSummary] = field(default_factory=list)

    def __post_init__(self) -> None:
        for g in self.gpus:  # a GPU's node is the node it is listed under
            g.node = self.node


@dataclass(slots=True)
class SystemSection:
    """The nodes' system evidence over the run (``system``), and every GPU's mean utilisation,
    averaged (None without GPUs)."""

    nodes: list[SystemNode] = field(default_factory=list)
    gpu_util_pct_mean: Optional[float] = None


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


@dataclass(slots=True)
class StepSeries:
    """Step time per series bucket over all ranks (``compare.step_series``)."""

    steps_per_bucket: int = 1
    mean_ms: list[Optional[float]] = field(default_factory=list)
    max_ms: list[Optional[float]] = field(default_factory=list)


@dataclass(slots=True)
class CompareSection:
    """What ``traceml compare`` reads: each phase's histogram over every step of every rank (the
    statistics' serialised merged sketch), and the step time over the run."""

    sketches: dict[str, J] = field(default_factory=dict)
    step_series: StepSeries = field(default_factory=StepSeries)


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


@dataclass(slots=True)
class GpuSeries:
    index: int
    util_pct: Optional[list[Optional[float]]] = None
    mem_used_bytes: Optional[list[Optional[float]]] = None
    mem_total_bytes: Optional[float] = None


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


@dataclass(slots=True)
class Envelope:
    """Over all ranks of a large run, per bucket: the least, median and most (``timeline.envelope``)."""

    ranks: int
    #: ``{"min": [...], "median": [...], "max": [...]}`` per metric
    step_ms: dict[str, list[Optional[float]]]
    own_ms: dict[str, list[Optional[float]]]


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


@dataclass(slots=True)
class HangSection(Record):
    """The last hang report as the summary shows it: the report, and whether steps resumed."""

    report: Annotated[HangReport, FLAT]
    resumed: bool = False


@dataclass(slots=True)
class NextJobSection:
    """``next_job`` of the summary (docs/summary-schema.md): ``lines`` to paste into the next job
    script, ``why`` (one reason per line), ``notes`` (what could not be judged, and why)."""

    lines: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.lines or self.notes)


@dataclass(slots=True)
class Summary(Record):
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
    system: SystemSection = field(default_factory=SystemSection)
    telemetry: Telemetry = field(default_factory=Telemetry)
    compare: CompareSection = field(default_factory=CompareSection)
    timeline: Optional[Timeline] = None
    files: dict[str, str] = field(default_factory=dict)
    hang: Optional[HangSection] = None
    hangs: list[HangReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the goodput ledger over the run's attempts (goodput/ledger.py); None in older summaries
    goodput: Annotated[Optional[Ledger], OMIT] = None
    #: the last resort's mark (report/partial.py); None for a whole summary
    partial: Annotated[Optional[J], OMIT] = None
    #: lines for the next job script (report/nextjob.py); None when there are none
    next_job: Annotated[Optional[NextJobSection], OMIT] = None
    #: what the run ran on (report/runcontext.py); None in older summaries
    context: Annotated[Optional[RunContext], OMIT] = None

    @property
    def verdicts(self) -> list[Verdict]:
        """The primary verdict, then the others."""
        return [self.verdict] + self.other_verdicts

    @property
    def whole(self) -> bool:
        return self.partial is None or bool(self.partial.get("whole", True))


def read(doc: Any) -> Summary:
    """A summary document (``final_summary.json``'s JSON) as the typed :class:`Summary`;
    pydantic's ``ValidationError`` (a ``ValueError``) when it is not one."""
    return decode(Summary, doc)


def document(summary: Summary) -> J:
    """The summary as ``final_summary.json`` holds it (plain JSON data)."""
    return encode(summary)
