"""Typed run data: what node 0 knows about a run, the one contract between the aggregator and the report.

The aggregator builds a :class:`RunData` (``aggregator/adapter.py``, the one place that knows its
own state); the summary, the ledger and the live verdict read nothing else. Every class here has a
checkpoint round-trip (``from_checkpoint`` / ``to_checkpoint``) over the plain data the
aggregator's checkpoints store (``aggregate.state``, msgpack), so a summary rebuilt from a
checkpoint after the aggregator died reads the same types as the live one, and an older
checkpoint (fewer fields) still loads: every field it lacks takes the default documented here.

The statistics inside (a phase's quantile sketch, a rank's per-step series) are kept in the
statistics module's own serialised form, read only through its functions (``report/stats.py``).

This module depends on nothing of ``aggregator/`` or ``report/``: both import it, neither imports
the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

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

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "PhaseData":
        try:  # the usual case, every field there: the fast way (node 0 holds thousands of these)
            return cls(**d)
        except TypeError:
            pass
        return cls(d.get("count", 0), d.get("sum", 0), d.get("max", -1),
                   d.get("min", -1), d.get("warm_count", 0), d.get("warm_sum", 0),
                   d.get("unmeasured", 0), dict(d.get("sketch") or {}))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "max": self.max, "min": self.min,
                "warm_count": self.warm_count, "warm_sum": self.warm_sum,
                "unmeasured": self.unmeasured, "sketch": self.sketch}


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

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "TotalsData":
        try:
            return cls(**d)
        except TypeError:
            pass
        return cls(d.get("count", 0), d.get("sum", 0), d.get("max", -1),
                   d.get("warm_count", 0), d.get("warm_sum", 0))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "max": self.max,
                "warm_count": self.warm_count, "warm_sum": self.warm_sum}


@dataclass(slots=True)
class MemData:
    """Peak memory per step (bytes): records that measured it, their sum and the largest."""

    count: int = 0
    sum: int = 0
    max: int = -1

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "MemData":
        return cls(d.get("count", 0), d.get("sum", 0), d.get("max", -1))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.sum, "max": self.max}


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

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "OutsideData":
        return cls(d.get("sum", 0), d.get("count", 0), dict(d.get("sketch") or {}))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"sum": self.sum, "count": self.count, "sketch": self.sketch}


@dataclass(slots=True)
class RankBye:
    """A rank's own goodbye: how it ended, how many records it produced, where it failed."""

    status: str
    steps: Optional[int] = None
    error: Optional[str] = None
    at: Optional[float] = None
    fail_step: Optional[int] = None
    fail_in_step: bool = False

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["RankBye"]:
        if not d:
            return None
        return cls(str(d.get("status")), d.get("steps"), d.get("error"),
                   d.get("at"), d.get("fail_step"), bool(d.get("fail_in_step")))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"status": self.status, "steps": self.steps, "error": self.error, "at": self.at,
                "fail_step": self.fail_step, "fail_in_step": self.fail_in_step}


@dataclass(slots=True)
class RankEvent:
    """An event a rank reported (``exception``, ``error``, ``warning``, ...), text bounded."""

    kind: str
    text: str
    ts: Optional[float] = None

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "RankEvent":
        return cls(str(d.get("kind") or ""), str(d.get("text") or ""), d.get("ts"))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "ts": self.ts}


@dataclass(slots=True)
class StepSource:
    """How a rank's steps are found (its ``step_source`` event, sdk/source.py)."""

    source: str = "trace_step"
    framework: Optional[str] = None
    accumulation: Optional[int] = None
    backward_per_step: Optional[int] = None
    #: whether forward is timed (inferred steps only; None: not said)
    forward: Optional[bool] = None
    note: Optional[str] = None
    #: any other field the rank sent, kept for the round-trip
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("source", "framework", "accumulation", "backward_per_step", "forward", "note")

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["StepSource"]:
        if not d:
            return None
        return cls(str(d.get("source") or "trace_step"), d.get("framework"), d.get("accumulation"),
                   d.get("backward_per_step"), d.get("forward"), d.get("note"),
                   {k: v for k, v in d.items() if k not in cls._KNOWN})

    def to_checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source}
        for k in self._KNOWN[1:]:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        out.update(self.extra)
        return out


@dataclass(slots=True)
class RankData:
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
    rejected: int = 0
    #: what the rank reported besides its steps: checkpoint spans, progress, declared work
    facts: RankFacts = field(default_factory=RankFacts)

    def phase(self, name: str) -> PhaseData:
        """A phase by column (``step_ns``) or phase name (``step``); empty when never measured."""
        ph = self.phases.get(name) or self.phases.get(name + "_ns")
        return ph if ph is not None else PhaseData()

    def totals(self, name: str) -> Optional[TotalsData]:
        return self.sums.get(name)

    @property
    def expected(self) -> int:
        """Records this rank is known to have produced: the furthest of what node 0 received, what
        its goodbye says and how far its relay saw its sequence go."""
        return max(self.next_seq, (self.bye.steps if self.bye else None) or 0, self.relay_seq_end)

    @classmethod
    def from_checkpoint(cls, r: dict[str, Any]) -> "RankData":
        received = r.get("received", 0)
        return cls(
            rank=r["rank"], node=r.get("node"), host=str(r.get("host") or ""),
            local_rank=r.get("local_rank"), pid=r.get("pid"),
            joined_at=r.get("joined_at"), last_seen=r.get("last_seen"),
            connected=bool(r.get("connected")), closed_at=r.get("closed_at"),
            connections=r.get("connections", 0), bye=RankBye.from_checkpoint(r.get("bye")),
            received=received, gaps=r.get("gaps", 0), duplicates=r.get("duplicates", 0),
            client_dropped=r.get("client_dropped", 0),
            relay_dropped=r.get("relay_dropped", 0),
            relay_seq_end=r.get("relay_seq_end", 0),
            open_bound=r.get("open_bound"), last_open=r.get("last_open"),
            counts=r.get("counts"), next_seq=r.get("next_seq", 0), first_seq=r.get("first_seq", 0),
            last_step=r.get("last_step", -1), first_t_end=r.get("first_t_end"),
            last_t_end=r.get("last_t_end"),
            phases={k: PhaseData.from_checkpoint(v) for k, v in (r.get("phases") or {}).items()},
            sums={k: TotalsData.from_checkpoint(v) for k, v in (r.get("sums") or {}).items()},
            mem=MemData.from_checkpoint(r.get("mem") or {}),
            outside=OutsideData.from_checkpoint(r.get("outside") or {}),
            series=dict(r.get("series") or {}),
            events=[RankEvent.from_checkpoint(e) for e in r.get("events") or []],
            event_count=r.get("event_count", 0),
            step_source=StepSource.from_checkpoint(r.get("step_source")),
            sketched=r.get("sketched", received), rejected=r.get("rejected", 0),
            facts=RankFacts.from_checkpoint(r.get("facts")))

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "node": self.node, "host": self.host, "local_rank": self.local_rank,
            "pid": self.pid, "joined_at": self.joined_at, "last_seen": self.last_seen,
            "connected": self.connected, "closed_at": self.closed_at,
            "connections": self.connections,
            "bye": self.bye.to_checkpoint() if self.bye else None, "received": self.received,
            "gaps": self.gaps, "duplicates": self.duplicates, "client_dropped": self.client_dropped,
            "relay_dropped": self.relay_dropped, "relay_seq_end": self.relay_seq_end,
            "open_bound": self.open_bound, "last_open": self.last_open, "counts": self.counts,
            "next_seq": self.next_seq, "first_seq": self.first_seq, "last_step": self.last_step,
            "first_t_end": self.first_t_end, "last_t_end": self.last_t_end,
            "phases": {k: v.to_checkpoint() for k, v in self.phases.items()},
            "sums": {k: v.to_checkpoint() for k, v in self.sums.items()},
            "mem": self.mem.to_checkpoint(), "outside": self.outside.to_checkpoint(),
            "series": self.series,
            "events": [e.to_checkpoint() for e in self.events], "event_count": self.event_count,
            "step_source": self.step_source.to_checkpoint() if self.step_source else None,
            "sketched": self.sketched, **({"rejected": self.rejected} if self.rejected else {}),
            "facts": self.facts.to_checkpoint(),
        }


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

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "WorkerExit":
        return cls(d["rank"], d.get("exitcode"), d.get("signal"), d.get("local_rank"),
                   d.get("pid"), d.get("ts"), d.get("message"), d.get("traceback"), d.get("stderr"))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "pid": self.pid,
                "exitcode": self.exitcode, "signal": self.signal, "ts": self.ts,
                "message": self.message, "traceback": self.traceback, "stderr": self.stderr}


@dataclass(slots=True)
class OomReport:
    """A node's memory cgroup after the run: OOM kills it counted and its limit."""

    kills: int = 0
    limit_bytes: Optional[int] = None
    source: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["OomReport"]:
        if d is None:
            return None
        return cls(d.get("kills") or 0, d.get("limit_bytes"), d.get("source"),
                   {k: v for k, v in d.items() if k not in ("kills", "limit_bytes", "source")})

    def to_checkpoint(self) -> dict[str, Any]:
        return {"kills": self.kills, "limit_bytes": self.limit_bytes, "source": self.source,
                **self.extra}


def _workers(v: Any) -> list[WorkerExit]:
    return [WorkerExit.from_checkpoint(w) for w in v or []]


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

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["TorchrunEnd"]:
        if not d:
            return None
        return cls(d.get("exitcode"), d.get("signal"), d.get("at"), d.get("stopped_at"))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"exitcode": self.exitcode, "signal": self.signal, "at": self.at, "stopped_at": self.stopped_at}


@dataclass(slots=True)
class NodeBye:
    """A node launcher's own end (nodes other than 0): its status, exit code and worker report."""

    status: Optional[str] = None
    exit_code: Optional[int] = None
    at: Optional[float] = None
    workers: list[WorkerExit] = field(default_factory=list)
    #: its OOM report; ``has_oom`` False when the launcher sent none
    oom: Optional[OomReport] = None
    has_oom: bool = False
    #: how its torchrun ended (None: not said)
    torchrun: Optional[TorchrunEnd] = None

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["NodeBye"]:
        if d is None:
            return None
        return cls(d.get("status"), d.get("exit_code"), d.get("at"), _workers(d.get("workers")),
                   OomReport.from_checkpoint(d.get("oom")), "oom" in d,
                   TorchrunEnd.from_checkpoint(d.get("torchrun")))

    def to_checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "exit_code": self.exit_code, "at": self.at,
                               "workers": [w.to_checkpoint() for w in self.workers]}
        if self.has_oom:
            out["oom"] = self.oom.to_checkpoint() if self.oom else None
        if self.torchrun is not None:
            out["torchrun"] = self.torchrun.to_checkpoint()
        return out


@dataclass(slots=True)
class LaunchLifecycle:
    """When one node's launch entered each phase (traceml_core/launcher/lifecycle.py), epoch
    seconds, as its launcher reported it at the end (node 0 in its finish, the others in their
    goodbye): what the goodput ledger divides the allocation's time by."""

    #: phase name (wire/protocol.LAUNCH_PHASES) -> when it began, in the order they came
    phases: dict[str, float] = field(default_factory=dict)
    #: when the node's relay first received a step record; None when none did
    first_step: Optional[float] = None
    #: when the cluster started the job (its allocation); None when it did not say
    allocation_start: Optional[float] = None
    #: how often the cluster requeued the job before this run; None when it did not say
    restarts: Optional[int] = None
    #: the signals the launcher received: name (SIGUSR1, SIGTERM, ...) -> first arrival (epoch s)
    signals: dict[str, float] = field(default_factory=dict)
    #: when the cluster meant to end the job, as it said when the early warning came; None: not asked
    scheduled_end: Optional[float] = None

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["LaunchLifecycle"]:
        if d is None:
            return None
        return cls({str(p): float(at) for p, at in d.get("phases") or []}, d.get("first_step"),
                   d.get("allocation_start"), d.get("restarts"),
                   {str(n): float(at) for n, at in d.get("signals") or []}, d.get("scheduled_end"))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"phases": [[p, at] for p, at in self.phases.items()], "first_step": self.first_step,
                "allocation_start": self.allocation_start, "restarts": self.restarts,
                "signals": [[n, at] for n, at in self.signals.items()], "scheduled_end": self.scheduled_end}


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
    bye: Optional[NodeBye] = None
    lifecycle: Optional[LaunchLifecycle] = None

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "NodeData":
        return cls(d["node"], str(d.get("host") or ""), d.get("joined_at"), str(d.get("via") or ""),
                   d.get("nproc"), bool(d.get("connected")), d.get("left_at"),
                   NodeBye.from_checkpoint(d.get("bye")), LaunchLifecycle.from_checkpoint(d.get("lifecycle")))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "joined_at": self.joined_at, "via": self.via,
                "nproc": self.nproc, "connected": self.connected, "left_at": self.left_at,
                "bye": self.bye.to_checkpoint() if self.bye else None,
                "lifecycle": self.lifecycle.to_checkpoint() if self.lifecycle else None}


@dataclass(slots=True)
class Finish:
    """How the run ended, as node 0's launcher reported it (or, when the aggregator was gone, as
    the launcher told ``traceml summarize``)."""

    exit_code: Optional[int] = None
    interrupted: bool = False
    reason: str = ""
    failed_nodes: list[int] = field(default_factory=list)
    #: who reported it ("launcher", or "launcher (after the aggregator was gone)")
    source: Optional[str] = None
    at: Optional[float] = None
    #: torchrun's failed workers on node 0
    workers: list[WorkerExit] = field(default_factory=list)
    #: node 0's OOM report; ``has_oom`` False when the launcher sent none
    oom: Optional[OomReport] = None
    has_oom: bool = False
    #: how node 0's torchrun ended (None: not said)
    torchrun: Optional[TorchrunEnd] = None

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> Optional["Finish"]:
        if d is None:
            return None
        return cls(d.get("exit_code"), bool(d.get("interrupted")), str(d.get("reason") or ""),
                   [n for n in d.get("failed_nodes") or []], d.get("source"), d.get("at"),
                   _workers(d.get("workers")), OomReport.from_checkpoint(d.get("oom")), "oom" in d,
                   TorchrunEnd.from_checkpoint(d.get("torchrun")))

    def to_checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exit_code": self.exit_code, "interrupted": self.interrupted,
                               "reason": self.reason, "failed_nodes": list(self.failed_nodes),
                               "source": self.source, "at": self.at,
                               "workers": [w.to_checkpoint() for w in self.workers]}
        if self.has_oom:
            out["oom"] = self.oom.to_checkpoint() if self.oom else None
        if self.torchrun is not None:
            out["torchrun"] = self.torchrun.to_checkpoint()
        return out


# --- system evidence -------------------------------------------------------------------------------
@dataclass(slots=True)
class Running:
    """count / sum / max of a sampled metric (``max`` None: never sampled)."""

    n: int = 0
    sum: float = 0.0
    max: Optional[float] = None

    @property
    def mean(self) -> Optional[float]:
        return self.sum / self.n if self.n else None

    def add(self, x: Optional[float]) -> None:
        """One more sample (None: not available, skipped)."""
        if x is not None:
            self.n, self.sum = self.n + 1, self.sum + x
            self.max = x if self.max is None or x > self.max else self.max

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> "Running":
        d = d or {}
        return cls(d.get("n", 0), d.get("sum", 0.0), d.get("max"))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"n": self.n, "sum": self.sum, "max": self.max}


@dataclass(slots=True)
class GpuData:
    """One GPU's sampled metrics (the system frame's, wire/frames.GPU_LIMITS), each running."""

    index: int
    util_pct: Running = field(default_factory=Running)
    mem_used: Running = field(default_factory=Running)
    mem_total: Running = field(default_factory=Running)
    temp_c: Running = field(default_factory=Running)
    power_w: Running = field(default_factory=Running)

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "GpuData":
        return cls(d["index"], *(Running.from_checkpoint(d.get(m)) for m in GPU_METRICS))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"index": self.index, **{m: getattr(self, m).to_checkpoint() for m in GPU_METRICS}}


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

    @classmethod
    def from_checkpoint(cls, d: Optional[dict[str, Any]]) -> "OverTime":
        d = d or {}
        return cls(d.get("t0"), d.get("width_s") or 1.0, d.get("used") or 0,
                   dict(d.get("mean") or {}), dict(d.get("max") or {}))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"t0": self.t0, "width_s": self.width_s, "used": self.used, "mean": self.mean,
                "max": self.max}


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

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "SystemData":
        return cls(d["node"], str(d.get("host") or ""), d.get("samples", 0),
                   d.get("first_ts"), d.get("last_ts"), Running.from_checkpoint(d.get("cpu_pct")),
                   Running.from_checkpoint(d.get("ram_used")), Running.from_checkpoint(d.get("ram_total")),
                   [GpuData.from_checkpoint(g) for g in d.get("gpus") or []],
                   OverTime.from_checkpoint(d.get("over_time")))

    def to_checkpoint(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "samples": self.samples,
                "first_ts": self.first_ts, "last_ts": self.last_ts,
                "cpu_pct": self.cpu_pct.to_checkpoint(), "ram_used": self.ram_used.to_checkpoint(),
                "ram_total": self.ram_total.to_checkpoint(),
                "gpus": [g.to_checkpoint() for g in self.gpus],
                "over_time": self.over_time.to_checkpoint()}


# --- hangs -------------------------------------------------------------------------------------------
@dataclass(slots=True)
class HangReport:
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
    #: when step records reached node 0 again (the stall resolved), and how long none had:
    #: from the last records before the stall to the first after it (None: not resolved)
    resolved_at: Optional[float] = None
    stall_s: Optional[float] = None
    #: the rule that declared it (aggregator/hangwatch.py): ``{"kind": "state"|"time", "name",
    #: "because"}``; None for a report asked for (``--hang-timeout``)
    rule: Optional[dict[str, Any]] = None
    #: when the last step records before the silence arrived (epoch s), and the seconds from
    #: then to the declaration (the time to detect)
    began_at: Optional[float] = None
    detect_s: Optional[float] = None

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "HangReport":
        return cls(d.get("at") or 0.0, d.get("silent_s") or 0.0,
                   d.get("threshold_s") or 0.0, str(d.get("threshold_source") or ""),
                   str(d.get("finding") or ""), list(d.get("culprits") or []),
                   list(d.get("groups") or []), list(d.get("ranks") or []),
                   d.get("records_at") or 0, d.get("collect_s"), d.get("resolved_at"), d.get("stall_s"),
                   d.get("rule") if isinstance(d.get("rule"), dict) else None, d.get("began_at"),
                   d.get("detect_s"))

    def to_checkpoint(self) -> dict[str, Any]:
        out = {"at": self.at, "silent_s": self.silent_s, "threshold_s": self.threshold_s,
               "threshold_source": self.threshold_source, "finding": self.finding,
               "culprits": list(self.culprits), "groups": self.groups, "ranks": self.ranks,
               "records_at": self.records_at, "collect_s": self.collect_s}
        if self.rule is not None:
            out.update(rule=self.rule, began_at=self.began_at, detect_s=self.detect_s)
        if self.stall_s is not None:
            out.update(resolved_at=self.resolved_at, stall_s=self.stall_s)
        return out

    def culprit_row(self) -> Optional[dict[str, Any]]:
        """The first culprit's autopsy row (rank, node, host, ...), None when nobody is named."""
        if not self.culprits:
            return None
        return next((a for a in self.ranks if a.get("rank") == self.culprits[0]), None)


# --- the run -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunSettings:
    """What the launcher told the aggregator about the run (``AggregatorSettings.public()``,
    without the tokens); ``public`` keeps every field for the checkpoint."""

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
    public: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def late_after_s(self) -> float:
        """A node joining later than this after the start is noted as late."""
        return self.late_join_s if self.late_join_s is not None else self.node_join_window_s

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "RunSettings":
        late = d.get("late_join_s")
        return cls(str(d["run_name"]), d["nnodes"], d["nproc_per_node"],
                   d["started_at"], d.get("job_id"), d.get("mode"),
                   str(d.get("master_addr") or ""), list(d.get("hostnames") or []),
                   d.get("node_join_window_s", 60.0), None if late is None else late,
                   str(d.get("script") or ""), d.get("script_args"), dict(d))

    def to_checkpoint(self) -> dict[str, Any]:
        return dict(self.public)


@dataclass(slots=True)
class RunData:
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
    finish: Optional[Finish] = None
    #: why the run directory moved to the fallback, when it did
    run_dir_note: Optional[str] = None
    hangs: list[HangReport] = field(default_factory=list)
    #: the link probe's result from node 0's launcher (linkprobe/), or None
    probe: Optional[dict[str, Any]] = None
    #: how often node 0's aggregator was restarted from a checkpoint during the run
    resumed: int = 0

    def rank_by_id(self) -> dict[int, RankData]:
        return {r.rank: r for r in self.ranks}

    def node_by_id(self) -> dict[int, NodeData]:
        return {n.node: n for n in self.nodes}

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> "RunData":
        """From a checkpoint's ``state`` (or the aggregator's plain data, which is the same shape)."""
        return cls(
            settings=RunSettings.from_checkpoint(d["settings"]),
            aggregator_started_at=d.get("aggregator_started_at") or 0.0,
            phases=list(d.get("phases") or []),
            ranks=sorted((RankData.from_checkpoint(r) for r in d.get("ranks") or []), key=lambda r: r.rank),
            nodes=sorted((NodeData.from_checkpoint(n) for n in d.get("nodes") or []), key=lambda n: n.node),
            system=sorted((SystemData.from_checkpoint(s) for s in d.get("system") or []),
                          key=lambda s: s.node),
            counters=dict(d.get("counters") or {}), records=d.get("records") or 0,
            finish=Finish.from_checkpoint(d.get("finish")), run_dir_note=d.get("run_dir_note"),
            hangs=[HangReport.from_checkpoint(h) for h in d.get("hangs") or []],
            probe=d.get("probe"), resumed=d.get("resumed") or 0)

    def to_checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "settings": self.settings.to_checkpoint(),
            "aggregator_started_at": self.aggregator_started_at,
            "phases": list(self.phases),
            "ranks": [r.to_checkpoint() for r in self.ranks],
            "nodes": [n.to_checkpoint() for n in self.nodes],
            "system": [s.to_checkpoint() for s in self.system],
            "counters": dict(self.counters),
            "records": self.records,
            "finish": self.finish.to_checkpoint() if self.finish else None,
            "run_dir_note": self.run_dir_note,
            "hangs": [h.to_checkpoint() for h in self.hangs],
            "probe": self.probe,
        }
        if self.resumed:
            out["resumed"] = self.resumed
        return out
