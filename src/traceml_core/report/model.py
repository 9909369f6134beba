"""The summary's typed parts: what one summary step hands the next (and the verdicts read).

The summary is built from :class:`~traceml_core.rundata.RunData` by small pure steps
(``report/summary.py``); each rank becomes a :class:`RankSummary`, the run's figures the verdicts
need travel in a :class:`VerdictContext`. The one codec (``traceml_core/codec.py``) writes each
class as its part of ``final_summary.json``, as documented in ``docs/summary-schema.md`` (its
fields are the keys, in order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from ..codec import OMIT, SKIP, Number, Record
from ..rundata import RankEvent
from .pauses import BetweenSteps


@dataclass(slots=True)
class PhaseSummary:
    """One rank's phase in ms: mean over all steps, steady mean (without warm-up), quantiles."""

    count: int = 0
    mean_ms: Optional[float] = None
    steady_mean_ms: Optional[float] = None
    #: the 10th percentile: for ``comm``, what even the last rank to arrive waits (the verdicts)
    p10_ms: Optional[float] = None
    p50_ms: Optional[float] = None
    p90_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    max_ms: Optional[float] = None


@dataclass(slots=True)
class CommSummary:
    """One rank's communication per steady step (nccl-tests' algbw / busbw)."""

    steps: int
    exposed_ms: Optional[float]
    exposed_fraction: Optional[float]
    busy_ms: Optional[float]
    overlap_fraction: Optional[float]
    bytes_per_step: int
    calls_per_step: float
    algbw_gbps: Optional[float]
    busbw_gbps: Optional[float]

    #: the figures compared across ranks (the run's ``communication`` section), in its order
    FIGURES = ("exposed_ms", "exposed_fraction", "busy_ms", "overlap_fraction", "bytes_per_step",
               "calls_per_step", "algbw_gbps", "busbw_gbps")


@dataclass(slots=True)
class MemTrend(Record):
    """A rank's peak-memory trend over its run (report/trend.py): the robust (Theil-Sen) line
    through its windows of steps, the growth it fits from the first steady window to the last,
    whether it was still rising at the end, and the smallest growth it could tell from the
    samples' own scatter."""

    method: str
    #: windows of steps with a memory sample that the line was fit to, and the steps they span
    windows: int
    steps: int
    start_bytes: int
    end_bytes: int
    growth_bytes: int
    growth_pct: Optional[float]
    slope_bytes_per_step: float
    #: the slope over the last half of the windows (a plateau's is ~0)
    late_slope_bytes_per_step: float
    rising: bool
    #: the scatter of the samples about the line (robust standard deviation)
    noise_bytes: int
    #: a growth over the run below this cannot be told from that scatter (or is under the floor)
    min_detectable_bytes: int

    @classmethod
    def _upgrade(cls, t: dict[str, Any]) -> dict[str, Any]:
        """An older summary's early/middle/late trend: its first and last thirds, no line."""
        if "start_bytes" in t:
            return t
        return {"method": "early-late", "windows": 0, "steps": 0, "start_bytes": t.get("early_bytes") or 0,
                "end_bytes": t.get("late_bytes") or 0, "growth_bytes": t.get("growth_bytes") or 0,
                "growth_pct": t.get("growth_pct"), "slope_bytes_per_step": 0.0, "late_slope_bytes_per_step": 0.0,
                "rising": bool(t.get("rising")), "noise_bytes": 0, "min_detectable_bytes": 0}


@dataclass(slots=True)
class MemPeak:
    max_bytes: int
    mean_bytes: int
    trend: Optional[MemTrend]
    #: why there is no trend (too few windows, and how many it needs); None when there is one
    trend_why: Optional[str] = None


@dataclass(slots=True)
class RankTelemetry:
    """One rank's record accounting: what arrived, what it produced, what may be unsent."""

    received: int = 0
    #: None for a rank that never joined (nothing bounds what it produced)
    expected: Optional[int] = None
    lost: Optional[int] = None
    #: records it may have produced that nobody could count (0 after its goodbye; None: unbounded)
    unsent_max: Optional[int] = None
    gaps: int = 0
    duplicates: int = 0
    client_dropped: int = 0
    relay_dropped: int = 0
    rejected: int = 0
    reconnects: int = 0
    sketched: int = 0


@dataclass(slots=True)
class ExitRecord:
    """torchrun's record of a worker that failed: its exit code or the signal that ended it, and
    Python's error when the worker wrote one (its last line, and the traceback)."""

    exitcode: Optional[int] = None
    signal: Optional[str] = None
    message: Optional[str] = None
    traceback: Optional[str] = None
    #: the end of the worker's stderr (launcher/stderrtee.py; read by report/stderr.py)
    stderr: Optional[str] = None


@dataclass(slots=True)
class RankSummary(Record):
    """One rank in the summary (``ranks[]``): how it ended, its phases and its telemetry."""

    rank: int
    node: Optional[int] = None
    host: str = ""
    local_rank: Optional[int] = None
    status: str = "unknown"
    error: Optional[str] = None
    #: records received (= traced steps that reached node 0)
    steps: int = 0
    steady_steps: int = 0
    last_step: int = -1
    #: records it said it produced (its goodbye), None without one
    steps_produced: Optional[int] = None
    fail_step: Optional[int] = None
    fail_in_step: bool = False
    failed_at: Optional[float] = None
    #: when it ended, however it ended (epoch seconds): its goodbye's arrival, else when its
    #: connection closed; None while it runs. A rank that finished cleanly while others still
    #: trained is named by the failure headline (report/failure.py)
    ended_at: Optional[float] = None
    exit: Optional[ExitRecord] = None
    #: by phase name (``step``, ``forward``, ...); None where not measured
    phases: dict[str, Optional[PhaseSummary]] = field(default_factory=dict)
    outside_ms: Optional[float] = None
    #: the steady gaps between steps as a distribution (report/pauses.py); None where not sketched
    between: Optional[BetweenSteps] = None
    comm: Optional[CommSummary] = None
    mem_peak: Optional[MemPeak] = None
    telemetry: RankTelemetry = field(default_factory=RankTelemetry)
    #: events it reported in all
    events: int = 0
    last_events: list[RankEvent] = field(default_factory=list)
    #: set by the failure diagnosis (report/failure.py) on a failed run's failed ranks
    failure: Annotated[Optional[dict[str, Any]], OMIT] = None

    def steady_ms(self, phase: str) -> Optional[float]:
        """Steady mean (ms) of a phase, ``outside`` included; None when not measured."""
        if phase == "outside":
            return self.outside_ms
        ph = self.phases.get(phase)
        return None if not ph else ph.steady_mean_ms

    @property
    def name(self) -> str:
        """``rank 3 (node 1, gpu-node-1)``: how every sentence names a rank."""
        host = f", {self.host}" if self.host else ""
        return f"rank {self.rank} (node {self.node}{host})"

    def culprit(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "host": self.host or None}


@dataclass(slots=True)
class Spread:
    """A figure across ranks: the median, and the least and most with their ranks."""

    median: float
    min: Any
    min_rank: int
    max: Any
    max_rank: int


@dataclass(slots=True)
class Communication:
    """The run's communication: each rank's figures side by side (:data:`CommSummary.FIGURES`;
    None where no rank has it), and the link probe."""

    measured: bool = False
    ranks_measured: int = 0
    not_measured_why: Optional[str] = None
    exposed_ms: Optional[Spread] = None
    exposed_fraction: Optional[Spread] = None
    busy_ms: Optional[Spread] = None
    overlap_fraction: Optional[Spread] = None
    bytes_per_step: Optional[Spread] = None
    calls_per_step: Optional[Spread] = None
    algbw_gbps: Optional[Spread] = None
    busbw_gbps: Optional[Spread] = None
    probe: Optional[dict[str, Any]] = None

    def spread(self, figure: str) -> Optional[Spread]:
        return getattr(self, figure) if figure in CommSummary.FIGURES else None

    def median(self, figure: str) -> Optional[float]:
        s = self.spread(figure)
        return None if s is None else s.median


@dataclass(slots=True)
class GpuSummary(Record):
    """One GPU over the run (the summary's ``system.nodes[].gpus[]``), with its node (which its
    node's row says: set by the row, not written)."""

    node: Annotated[int, SKIP] = 0
    index: int = 0
    samples: int = 0
    util_pct_mean: Optional[float] = None
    util_pct_max: Optional[Number] = None
    mem_used_max: Optional[Number] = None
    mem_total: Optional[Number] = None
    temp_c_max: Optional[Number] = None
    power_w_mean: Optional[float] = None
    power_w_max: Optional[Number] = None


@dataclass(frozen=True, slots=True)
class CpuRequest:
    """What the scheduler gave each task in CPUs, as the cluster plugin read it in the launcher
    (``ClusterEnvironment.cpu_request``) and each rank passed on: for the input-bound verdict's
    CPU cause (report/cpubinding.py). ``fix``: the lines that ask for N CPUs per task in the next
    job, ``{n}`` for N; ``pass_on``: the lines that make the launch pass the job's request on to
    its tasks. None: not known."""

    scheduler: Optional[str] = None
    version: Optional[str] = None
    cpus_per_task: Optional[int] = None
    cpus_per_task_source: Optional[str] = None
    srun_cpus_per_task: Optional[int] = None
    cpus_on_node: Optional[int] = None
    fix: tuple[str, ...] = ()
    pass_on: tuple[str, ...] = ()

    @classmethod
    def bounded(cls, raw: Any) -> Optional["CpuRequest"]:
        """Bounded reading of what a rank sent (it crossed the wire: sizes and types checked)."""
        if not isinstance(raw, dict):
            return None

        def text(key: str, n: int = 64) -> Optional[str]:
            v = raw.get(key)
            return v[:n] if isinstance(v, str) and v else None

        def count(key: str) -> Optional[int]:
            v = raw.get(key)
            return v if type(v) is int and 0 < v < 1 << 16 else None

        def lines(key: str) -> tuple[str, ...]:
            v = raw.get(key)
            return tuple(x[:200] for x in v[:4] if isinstance(x, str)) if isinstance(v, list) else ()

        return cls(text("scheduler"), text("version"), count("cpus_per_task"), text("cpus_per_task_source"),
                   count("srun_cpus_per_task"), count("cpus_on_node"), lines("fix"), lines("pass_on"))


@dataclass(frozen=True, slots=True)
class StepWork:
    """What a rank's steps consumed, measured on sampled steps (sdk/worksample.py): per sampled
    step, the training thread's CPU time and wall time from the step's start to the next one's,
    the same in forward, backward and the optimizer, and the batch its model was given: samples,
    elements, and tokens where the batch is integer ids (None: not measured)."""

    sampled: int
    cpu_ms: Optional[float] = None
    wall_ms: Optional[float] = None
    phase_cpu_ms: tuple[tuple[str, float], ...] = ()
    phase_wall_ms: tuple[tuple[str, float], ...] = ()
    samples: Optional[float] = None
    elements: Optional[float] = None
    tokens: Optional[float] = None

    #: at least this many sampled steps before a figure is read (a few steps are one-off hiccups)
    MIN_SAMPLED = 5

    def phase_cpu(self, phase: str) -> Optional[float]:
        return dict(self.phase_cpu_ms).get(phase)

    @classmethod
    def bounded(cls, raw: Any) -> Optional["StepWork"]:
        """Bounded reading of the ``work`` part of a ``cpu_threads`` event (it crossed the wire)."""
        if not isinstance(raw, dict):
            return None

        def count(key: str, d: Any = raw) -> Optional[int]:
            v = d.get(key) if isinstance(d, dict) else None
            return v if type(v) is int and 0 <= v < 1 << 62 else None

        n = count("n")
        if not n or n < cls.MIN_SAMPLED:
            return None
        cpu, wall = count("cpu_ns"), count("wall_ns")
        phases = ("forward", "backward", "optimizer")
        pc = [(p, round(v / n / 1e6, 4)) for p in phases for v in [count(p, raw.get("phase_cpu_ns"))] if v is not None]
        pw = [(p, round(v / n / 1e6, 4)) for p in phases for v in [count(p, raw.get("phase_wall_ns"))] if v is not None]
        measured = count("measured") or 0
        per = (lambda key: None if measured < cls.MIN_SAMPLED or count(key) is None
               else round((count(key) or 0) / measured, 2))
        tokens = per("tokens")
        return cls(sampled=n, cpu_ms=None if cpu is None else round(cpu / n / 1e6, 4),
                   wall_ms=None if wall is None else round(wall / n / 1e6, 4), phase_cpu_ms=tuple(pc),
                   phase_wall_ms=tuple(pw), samples=per("samples"), elements=per("elements"),
                   tokens=tokens or None)


@dataclass(frozen=True, slots=True)
class CpuThreads:
    """What a rank said about its CPU (sdk/threads.py): torch's intra-op threads, the cores it may
    run on, and how long per steady step its training thread waited for a core (the run queue;
    None where not measured: a rank that never shut down cleanly, a kernel without schedstat).
    For the input-bound verdict's CPU cause (report/cpubinding.py), over the same steady steps:
    its DataLoader worker processes (its live child processes), the CPUs they used
    (``workers_cores``: CPU seconds per wall second) and waited for (``workers_waiting``: runnable,
    no core free), the rank process's own CPU use
    (``proc_cores``), the share of the wall clock its cgroup's CPU quota throttled it
    (``throttled``), ``OMP_NUM_THREADS`` and the scheduler's CPU request (None: not measured).
    ``throttled_ms``: how long per steady step the cgroup's CPU quota throttled it (the same
    counter as ``throttled``, per step like ``wait_ms``: a throttled thread is runnable, so the run
    queue's wait includes it, but it is the task's own CPU limit, not other processes)."""

    threads: int
    cpus: frozenset[int]
    wait_ms: Optional[float] = None
    run_ms: Optional[float] = None
    workers: Optional[int] = None
    workers_cores: Optional[float] = None
    workers_waiting: Optional[float] = None
    proc_cores: Optional[float] = None
    throttled: Optional[float] = None
    omp: Optional[str] = None
    request: Optional[CpuRequest] = None
    throttled_ms: Optional[float] = None
    #: the rank's torch version (None: not said)
    torch: Optional[str] = None
    #: what its steps consumed (sampled steps), or None where not measured
    work: Optional[StepWork] = None

    @classmethod
    def of_event(cls, text: str) -> Optional["CpuThreads"]:
        """The ``cpu_threads`` event's text (sdk/threads.py), or None when it is not one."""
        import json

        try:
            raw = json.loads(text)
            threads = int(raw["threads"])
            cpus: set[int] = set()
            for lo, hi in raw.get("cpuset") or []:
                if 0 <= int(lo) <= int(hi) < 1 << 16:
                    cpus.update(range(int(lo), int(hi) + 1))
            if not cpus:  # only a count: cores 0..n-1 (shared with the node's other ranks)
                cpus = set(range(max(1, min(int(raw.get("cpus") or 1), 1 << 16))))
            wait = run = None
            steps = int(raw.get("steps") or 0) - int(raw.get("steps0") or 0)
            if steps > 0 and all(type(raw.get(k)) is int for k in ("wait_ns", "wait0_ns", "run_ns", "run0_ns")):
                wait = max(0.0, (raw["wait_ns"] - raw["wait0_ns"]) / steps / 1e6)
                run = max(0.0, (raw["run_ns"] - raw["run0_ns"]) / steps / 1e6)
            thr = _delta(raw, "thr_ns")
            thr_ms = thr / steps / 1e6 if thr is not None and steps > 0 else None
            wall = _delta(raw, "wall_ns")
            workers = raw.get("workers")
            workers = workers if type(workers) is int and 0 <= workers < 1 << 16 else None
            per_wall = [None if d is None or not wall else round(d / wall, 4)
                        for d in (_delta(raw, "wrun_ns"), _delta(raw, "wwait_ns"), _delta(raw, "pcpu_ns"),
                                  _delta(raw, "thr_ns"))]
            omp = raw.get("omp")
            omp = omp[:32] if isinstance(omp, str) else None
            request = CpuRequest.bounded(raw.get("request"))
            torch_v = raw.get("torch")
            torch_v = torch_v[:40] if isinstance(torch_v, str) else None
            work = StepWork.bounded(raw.get("work"))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not 0 < threads < 1 << 16:
            return None
        return cls(threads, frozenset(cpus), wait, run, workers, per_wall[0], per_wall[1], per_wall[2],
                   None if per_wall[3] is None else min(1.0, per_wall[3]), omp, request, thr_ms, torch_v, work)


def _delta(raw: dict[str, Any], key: str) -> Optional[int]:
    """``raw[key] - raw[key0]`` for a counter of the settled steps and the last sample (ns), or None."""
    a, b = raw.get(key), raw.get(key.replace("_ns", "0_ns"))
    if type(a) is not int or type(b) is not int or not 0 <= b <= a < 1 << 62:
        return None
    return a - b


@dataclass(slots=True)
class VerdictContext:
    """What the verdicts know about the run besides its ranks (report/rules/)."""

    #: ``cuda``, ``cpu`` or ``unknown`` (what the ranks computed on, as far as was measured)
    device: str = "unknown"
    world: int = 1
    nnodes: int = 1
    #: the run's one median step (every step of every rank), ms
    median_step_ms: Optional[float] = None
    #: how steps were found (report/steps.py): ``trace_step``, ``inferred``, a framework, ``mixed``
    step_source: Optional[str] = None
    #: why no rank recorded a step, or None
    no_steps: Optional[str] = None
    #: how the run ended (report/status.py); a run stopped before its first step gets other advice
    run_status: Optional[str] = None
    gpus: list[GpuSummary] = field(default_factory=list)
    #: every GPU's mean utilisation, averaged; None without GPUs
    gpu_util_pct: Optional[float] = None
    #: the busiest node's mean CPU use, %
    cpu_busy_pct: Optional[float] = None
    communication: Optional[Communication] = None
    #: the verdicts found so far, by kind (a later detector may defer to an earlier one)
    found: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: each rank's run in windows of steps (report/windows.py), by rank: when things happened
    windows: dict[int, Any] = field(default_factory=dict)
    #: each rank's compute threads and the cores it may use, by rank (sdk/threads.py; ranks
    #: that never said are missing)
    cpu_threads: dict[int, "CpuThreads"] = field(default_factory=dict)
    #: what a detector found and left out, and why (the straggler: an excess that waiting for a
    #: core explains), for the detectors after it
    excused: dict[str, Any] = field(default_factory=dict)
    #: what one step of each rank is worth as its script declared it (``traceml.declare_work``:
    #: ``rankfacts.Work``), by rank; declared work overrides the measured batch
    declared: dict[int, Any] = field(default_factory=dict)
