"""Typed run data: what node 0 knows about a run, the one contract between the aggregator and the report.

The aggregator builds a :class:`RunData` (``aggregator/adapter.py``, the one place that knows its
own state); the summary, the ledger and the live verdict read nothing else. A checkpoint
(``aggregate.state``, msgpack) stores it through the one codec (``traceml_core/codec.py``), so a
summary rebuilt from a checkpoint after the aggregator died reads the same types as the live one,
and an older checkpoint (fewer fields) still loads: every field it lacks takes the default
declared here.

The statistics inside (a phase's quantile sketch, a rank's per-step series) are kept in the
statistics module's own serialised form, read only through its functions (``report/stats.py``).

This module depends on nothing of ``aggregator/`` or ``report/``: both import it, neither imports
the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Optional

from .codec import OMIT, PAIRS, REST, Number, Omit, Record
from .rankfacts import RankFacts

#: a statistics value in the statistics module's serialised form (a sketch or a series); opaque here
Serialised = dict[str, Any]


# --- one rank ----------------------------------------------------------------------------------------
@dataclass(slots=True)
class PhaseData:
    """One duration column (``step_ns``, ``forward_ns``, ...) of one rank, in nanoseconds.

    ``count``/``sum``/``max`` use every record; ``min`` is over the sketched values (-1 = none);
    ``warm_*`` are the records of the warm-up steps (left out of steady means); ``unmeasured``
    counts records where the phase was not measured (-1 on the wire)."""

    count: int = 0
    sum: int = 0
    max: int = -1
    min: int = -1
    warm_count: int = 0
    warm_sum: int = 0
    unmeasured: int = 0
    sketch: Serialised = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.count > 0

    @property
    def mean_ns(self) -> Optional[float]:
        return self.sum / self.count if self.count > 0 else None

    @property
    def steady_count(self) -> int:
        return max(0, self.count - self.warm_count)

    @property
    def steady_mean_ns(self) -> Optional[float]:
        """Mean without the warm-up steps; the plain mean when only warm-up steps were measured."""
        n = self.count - self.warm_count
        if n > 0:
            return (self.sum - self.warm_sum) / n
        return self.mean_ns


@dataclass(slots=True)
class TotalsData:
    """A column that only needs totals (communication bytes, calls, busy time): -1 values left out."""

    count: int = 0
    sum: int = 0
    max: int = -1
    warm_count: int = 0
    warm_sum: int = 0

    def steady(self) -> tuple[int, int]:
        """(sum, records) without the warm-up steps; all of them when only warm-up was measured."""
        n = self.count - self.warm_count
        return (self.sum - self.warm_sum, n) if n > 0 else (self.sum, self.count)


@dataclass(slots=True)
class MemData:
    """Peak memory per step (bytes): records that measured it, their sum and the largest."""

    count: int = 0
    sum: int = 0
    max: int = -1


@dataclass(slots=True)
class OutsideData:
    """Time between one traced step's end and the next one's start (ns): sum over ``count`` gaps,
    and their quantile sketch (serialised; empty from a checkpoint older than it), which tells
    pauses every k steps from time spread over every step."""

    sum: int = 0
    count: int = 0
    sketch: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_ns(self) -> Optional[float]:
        return self.sum / self.count if self.count else None


@dataclass(slots=True)
class RankBye:
    """A rank's own goodbye: how it ended, how many records it produced, where it failed."""

    status: str
    steps: Optional[int] = None
    error: Optional[str] = None
    at: Optional[float] = None
    fail_step: Optional[int] = None
    fail_in_step: bool = False


@dataclass(slots=True)
class RankEvent:
    """An event a rank reported (``exception``, ``error``, ``warning``, ...), text bounded."""

    kind: str
    text: str
    ts: Optional[float] = None


@dataclass(slots=True)
class StepSource(Record):
    """How a rank's steps are found (its ``step_source`` event, sdk/source.py)."""

    source: str = "trace_step"
    framework: Annotated[Optional[str], OMIT] = None
    accumulation: Annotated[Optional[int], OMIT] = None
    backward_per_step: Annotated[Optional[int], OMIT] = None
    #: whether forward is timed (inferred steps only; None: not said)
    forward: Annotated[Optional[bool], OMIT] = None
    note: Annotated[Optional[str], OMIT] = None
    #: any other field the rank sent, kept for the round-trip
    extra: Annotated[dict[str, Any], REST] = field(default_factory=dict)


@dataclass(slots=True)
class RankData(Record):
    """Everything node 0 knows about one global rank: identity, connection, loss accounting,
    its ending and its statistics."""

    rank: int
    node: Optional[int] = None
    host: str = ""
    local_rank: Optional[int] = None
    pid: Optional[int] = None
    joined_at: Optional[float] = None
    last_seen: Optional[float] = None
    connected: bool = False
    closed_at: Optional[float] = None
    #: accepted hellos (more than one: it reconnected)
    connections: int = 0
    bye: Optional[RankBye] = None
    #: unique records ingested
    received: int = 0
    #: records skipped in sequence (never received)
    gaps: int = 0
    duplicates: int = 0
    client_dropped: int = 0
    relay_dropped: int = 0
    #: sequence number after the last record its relay received from it
    relay_seq_end: int = 0
    #: records it last said it held unsent when its relay saw it go (None: never said)
    open_bound: Optional[int] = None
    last_open: Optional[int] = None
    #: its answer to the last ``counts`` request (wire/frames.REQUESTS), with ``at``
    counts: Optional[dict[str, Any]] = None
    next_seq: int = 0
    #: sequence number of the first record in its statistics (0 but for a rank first heard of
    #: mid-run; the statistics are one WindowStats, traceml_core/statistics/window.py)
    first_seq: int = 0
    last_step: int = -1
    first_t_end: Optional[int] = None
    last_t_end: Optional[int] = None
    #: duration columns by name (``step_ns``, ``forward_ns``, ...)
    phases: dict[str, PhaseData] = field(default_factory=dict)
    #: totals-only columns by name (``comm_busy_ns``, ``comm_bytes``, ...)
    sums: dict[str, TotalsData] = field(default_factory=dict)
    mem: MemData = field(default_factory=MemData)
    outside: OutsideData = field(default_factory=OutsideData)
    series: Serialised = field(default_factory=dict)
    #: the last few events (the aggregator keeps 8), oldest first
    events: list[RankEvent] = field(default_factory=list)
    event_count: int = 0
    step_source: Optional[StepSource] = None
    #: records that fed the sketches (weighted), against ``received``
    sketched: int = 0
    #: records of frames found malformed when their statistics were computed (checkpoints of
    #: protocol version 3 and before; since, a frame is refused whole where it enters, and this
    #: stays 0)
    rejected: Annotated[int, Omit(0)] = 0
    #: what the rank reported besides its steps: checkpoint spans, progress, declared work
    facts: RankFacts = field(default_factory=RankFacts)

    def phase(self, name: str) -> PhaseData:
        """A phase by column (``step_ns``) or phase name (``step``); empty when never measured."""
        ph = self.phases.get(name) or self.phases.get(name + "_ns")
        return ph if ph is not None else PhaseData()

    def totals(self, name: str) -> Optional[TotalsData]:
        return self.sums.get(name)

    @classmethod
    def _upgrade(cls, d: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint older than ``sketched``: every record it received fed the sketches."""
        return d if "sketched" in d else {**d, "sketched": d.get("received", 0)}

    @property
    def expected(self) -> int:
        """Records this rank is known to have produced: the furthest of what node 0 received, what
        its goodbye says and how far its relay saw its sequence go."""
        return max(self.next_seq, (self.bye.steps if self.bye else None) or 0, self.relay_seq_end)


# --- nodes and the end -----------------------------------------------------------------------------
@dataclass(slots=True)
class WorkerExit:
    """torchrun's record of one failed worker (its launcher passes it on): exit code or signal."""

    rank: int
    exitcode: Optional[int] = None
    signal: Optional[str] = None
    local_rank: Optional[int] = None
    pid: Optional[int] = None
    #: when torchrun saw it end (epoch seconds), None when not said
    ts: Optional[float] = None
    #: Python's error of the worker (its last line) and traceback, from torchrun's error file
    message: Optional[str] = None
    traceback: Optional[str] = None
    #: the end of its stderr (launcher/stderrtee.py), None when it was not kept
    stderr: Optional[str] = None


@dataclass(slots=True)
class OomReport(Record):
    """A node's memory cgroup after the run: OOM kills it counted and its limit."""

    kills: int = 0
    limit_bytes: Optional[int] = None
    source: Optional[str] = None
    extra: Annotated[dict[str, Any], REST] = field(default_factory=dict)


@dataclass(slots=True)
class TorchrunEnd:
    """How a node's torchrun ended, as its launcher reported it (launcher/run.py)."""

    exitcode: Optional[int] = None
    #: the signal that killed it, only when its launcher did not send it (the OOM killer, a user)
    signal: Optional[str] = None
    #: when it ended (epoch seconds)
    at: Optional[float] = None
    #: when its launcher, signalled itself (scancel, srun stopping the step), began stopping it
    stopped_at: Optional[float] = None


@dataclass(slots=True)
class LaunchEnd(Record):
    """How a node's launch ended, as its launcher reported it: node 0's in the run's finish (with
    the run's exit and why; or, when the aggregator was gone, as the launcher told ``traceml
    summarize``), another node's in its goodbye (with its status)."""

    #: a node's own status in its goodbye (None: node 0's finish)
    status: Optional[str] = None
    exit_code: Optional[int] = None
    at: Optional[float] = None
    #: torchrun's failed workers on the node
    workers: list[WorkerExit] = field(default_factory=list)
    #: the node's OOM report; None when the launcher sent none, or could not read its cgroup
    oom: Optional[OomReport] = None
    #: how the node's torchrun ended (None: not said)
    torchrun: Annotated[Optional[TorchrunEnd], OMIT] = None
    #: node 0's finish only: whether the run was interrupted, why it ended, the nodes that failed,
    #: and who reported it ("launcher", or "launcher (after the aggregator was gone)")
    interrupted: bool = False
    reason: str = ""
    failed_nodes: list[int] = field(default_factory=list)
    source: Optional[str] = None

    @property
    def has_oom(self) -> bool:
        """The launcher read the node's memory cgroup."""
        return self.oom is not None


@dataclass(slots=True)
class LaunchLifecycle:
    """When one node's launch entered each phase (traceml_core/launcher/lifecycle.py), epoch
    seconds, as its launcher reported it at the end (node 0 in its finish, the others in their
    goodbye): what the goodput ledger divides the allocation's time by."""

    #: phase name (wire/protocol.LAUNCH_PHASES) -> when it began, in the order they came
    phases: Annotated[dict[str, float], PAIRS] = field(default_factory=dict)
    #: when the node's relay first received a step record; None when none did
    first_step: Optional[float] = None
    #: when the cluster started the job (its allocation); None when it did not say
    allocation_start: Optional[float] = None
    #: how often the cluster requeued the job before this run; None when it did not say
    restarts: Optional[int] = None
    #: the signals the launcher received: name (SIGUSR1, SIGTERM, ...) -> first arrival (epoch s)
    signals: Annotated[dict[str, float], PAIRS] = field(default_factory=dict)
    #: when the cluster meant to end the job, as it said when the early warning came; None: not asked
    scheduled_end: Optional[float] = None


@dataclass(slots=True)
class NodeData:
    """One node as node 0 saw it: who joined when, through what, and how its launcher ended."""

    node: int
    host: str = ""
    joined_at: Optional[float] = None
    #: "control" (node 0's launcher), "node" (a node launcher) or "rank"
    via: str = ""
    nproc: Optional[int] = None
    connected: bool = False
    #: its launcher's connection closed without a goodbye at this time
    left_at: Optional[float] = None
    bye: Optional[LaunchEnd] = None
    lifecycle: Optional[LaunchLifecycle] = None


# --- system evidence -------------------------------------------------------------------------------
@dataclass(slots=True)
class Running:
    """count / sum / max of a sampled metric (``max`` None: never sampled)."""

    n: int = 0
    sum: Number = 0.0
    max: Optional[Number] = None

    @property
    def mean(self) -> Optional[float]:
        return self.sum / self.n if self.n else None

    def add(self, x: Optional[float]) -> None:
        """One more sample (None: not available, skipped)."""
        if x is not None:
            self.n, self.sum = self.n + 1, self.sum + x
            self.max = x if self.max is None or x > self.max else self.max


@dataclass(slots=True)
class GpuData:
    """One GPU's sampled metrics (the system frame's, wire/frames.GPU_LIMITS), each running."""

    index: int
    util_pct: Running = field(default_factory=Running)
    mem_used: Running = field(default_factory=Running)
    mem_total: Running = field(default_factory=Running)
    temp_c: Running = field(default_factory=Running)
    power_w: Running = field(default_factory=Running)


#: the metrics a :class:`GpuData` holds, in its order
GPU_METRICS = tuple(f.name for f in fields(GpuData) if f.name != "index")


@dataclass(slots=True)
class OverTime:
    """A node's metrics over wall-clock time: ``used`` buckets of ``width_s`` from ``t0``; per
    metric the bucket means (``mean``) or maxima (``max``), None where nothing was sampled."""

    t0: Optional[float] = None
    width_s: float = 1.0
    used: int = 0
    mean: dict[str, list[Optional[float]]] = field(default_factory=dict)
    max: dict[str, list[Optional[float]]] = field(default_factory=dict)


@dataclass(slots=True)
class SystemData:
    """One node's system evidence: CPU, RAM and per-GPU metrics (running), and over time."""

    node: int
    host: str = ""
    samples: int = 0
    first_ts: Optional[float] = None
    last_ts: Optional[float] = None
    cpu_pct: Running = field(default_factory=Running)
    ram_used: Running = field(default_factory=Running)
    ram_total: Running = field(default_factory=Running)
    gpus: list[GpuData] = field(default_factory=list)
    over_time: OverTime = field(default_factory=OverTime)


# --- hangs -------------------------------------------------------------------------------------------
@dataclass(slots=True)
class HangReport(Record):
    """One hang autopsy (report/hang.py builds it): where each rank was stuck when no rank had
    completed a step for ``silent_s``. ``groups`` and ``ranks`` are the JSON rows the summary's
    ``hang`` section shows as they are."""

    at: float
    silent_s: float
    threshold_s: float
    threshold_source: str
    finding: str
    culprits: list[int] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    #: records node 0 had received when the autopsy started: more later means training went on
    records_at: int = 0
    collect_s: Optional[float] = None
    #: the rule that declared it (aggregator/hangwatch.py): ``{"kind": "state"|"time", "name",
    #: "because"}``; None for a report asked for (``--hang-timeout``)
    rule: Annotated[Optional[dict[str, Any]], OMIT] = None
    #: when the last step records before the silence arrived (epoch s), and the seconds from
    #: then to the declaration (the time to detect)
    began_at: Annotated[Optional[float], OMIT] = None
    detect_s: Annotated[Optional[float], OMIT] = None
    #: when step records reached node 0 again (the stall resolved), and how long none had:
    #: from the last records before the stall to the first after it (None: not resolved)
    resolved_at: Annotated[Optional[float], OMIT] = None
    stall_s: Annotated[Optional[float], OMIT] = None

    def culprit_row(self) -> Optional[dict[str, Any]]:
        """The first culprit's autopsy row (rank, node, host, ...), None when nobody is named."""
        if not self.culprits:
            return None
        return next((a for a in self.ranks if a.get("rank") == self.culprits[0]), None)


# --- the run -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunSettings(Record):
    """What the launcher told the aggregator about the run (``AggregatorSettings.public()``,
    without the tokens); ``public`` keeps its other fields (``run_id``, ``job_start_time``, ...)."""

    run_name: str
    nnodes: int
    nproc_per_node: int
    started_at: float
    job_id: Optional[str] = None
    mode: Optional[str] = None
    master_addr: str = ""
    hostnames: list[str] = field(default_factory=list)
    node_join_window_s: float = 60.0
    late_join_s: Optional[float] = None
    script: str = ""
    script_args: Optional[list[str]] = None
    public: Annotated[dict[str, Any], REST] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def late_after_s(self) -> float:
        """A node joining later than this after the start is noted as late."""
        return self.late_join_s if self.late_join_s is not None else self.node_join_window_s


@dataclass(slots=True)
class RunData(Record):
    """The whole run as node 0 knows it: settings, ranks, nodes, system evidence, hangs, the
    launcher's finish, and the aggregator's own counters.

    ``ranks`` are the ranks that ever said hello (a rank that never joined is absent), sorted;
    ``nodes`` and ``system`` likewise by node."""

    settings: RunSettings
    aggregator_started_at: float
    #: the duration columns this aggregator kept (wire/protocol.DURATION_COLUMNS)
    phases: list[str] = field(default_factory=list)
    ranks: list[RankData] = field(default_factory=list)
    nodes: list[NodeData] = field(default_factory=list)
    system: list[SystemData] = field(default_factory=list)
    #: the wire server's counters (wire/server.SERVER_COUNTERS)
    counters: dict[str, int] = field(default_factory=dict)
    #: step records received in all
    records: int = 0
    finish: Optional[LaunchEnd] = None
    #: why the run directory moved to the fallback, when it did
    run_dir_note: Optional[str] = None
    hangs: list[HangReport] = field(default_factory=list)
    #: the link probe's result from node 0's launcher (linkprobe/), or None
    probe: Optional[dict[str, Any]] = None
    #: how often node 0's aggregator was restarted from a checkpoint during the run
    resumed: Annotated[int, Omit(0)] = 0

    def rank_by_id(self) -> dict[int, RankData]:
        return {r.rank: r for r in self.ranks}

    def node_by_id(self) -> dict[int, NodeData]:
        return {n.node: n for n in self.nodes}
