"""The ledger as types: ``final_summary.json``'s ``goodput`` section (docs/summary-schema.md).

Amounts are kept in whole milliseconds of device time (GPU-milliseconds, or rank-milliseconds on
CPU), so every split sums *exactly*: a rank's buckets to its share of the allocation, a node's
ranks to the node, the nodes to the attempt, the attempts to the run. The JSON shows seconds
(the milliseconds / 1000). A bucket that could not be measured is ``null`` (its time is in another
bucket, named in ``not_measured`` with how to measure it), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from .buckets import KEYS

J = dict[str, Any]


def _d(v: Any) -> J:
    return v if isinstance(v, dict) else {}


def seconds(ms: Optional[int]) -> Optional[float]:
    return None if ms is None else round(ms / 1000.0, 3)


def to_ms(s: Any) -> Optional[int]:
    return None if s is None else int(round(float(s) * 1000.0))


def apportion(parts: Mapping[str, float], total_ms: int) -> dict[str, int]:
    """Whole milliseconds per part summing exactly to ``total_ms``: each part's share of
    ``total_ms`` in proportion to its (non-negative) value, rounded by the largest remainder."""
    vals = {k: max(0.0, float(v)) for k, v in parts.items()}
    whole = sum(vals.values())
    if total_ms <= 0 or whole <= 0:
        out = {k: 0 for k in vals}
        if total_ms > 0 and vals:  # nothing to divide by: all of it in the first part
            out[next(iter(vals))] = total_ms
        return out
    exact = {k: v * total_ms / whole for k, v in vals.items()}
    out = {k: int(x) for k, x in exact.items()}
    left = total_ms - sum(out.values())
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:left]:
        out[k] += 1
    return out


@dataclass(slots=True)
class Split:
    """Milliseconds per bucket (None: not measured), summing exactly to ``total_ms``."""

    total_ms: int = 0
    ms: dict[str, Optional[int]] = field(default_factory=dict)

    def get(self, key: str) -> Optional[int]:
        return self.ms.get(key)

    def add(self, other: "Split") -> None:
        self.total_ms += other.total_ms
        for k in KEYS:
            a, b = self.ms.get(k), other.ms.get(k)
            if k in self.ms or k in other.ms:
                self.ms[k] = None if a is None and b is None else (a or 0) + (b or 0)

    @classmethod
    def summed(cls, splits: Iterable["Split"]) -> "Split":
        out = cls()
        for s in splits:
            out.add(s)
        return out

    def fraction(self, key: str) -> Optional[float]:
        v = self.ms.get(key)
        return None if v is None or not self.total_ms else v / self.total_ms

    @classmethod
    def from_json(cls, d: Any) -> "Split":
        d = _d(d)
        return cls(to_ms(d.get("total_s")) or 0,
                   {k: to_ms(v) for k, v in _d(d.get("buckets")).items() if k in KEYS})

    def to_json(self) -> J:
        return {"total_s": seconds(self.total_ms),
                "buckets": {k: seconds(self.ms[k]) for k in KEYS if k in self.ms},
                "productive_fraction": (round(self.ms["productive"] / self.total_ms, 4)
                                        if self.total_ms and self.ms.get("productive") is not None else None)}


@dataclass(slots=True)
class NodeLedger:
    node: int
    host: str = ""
    #: the node's device (or rank) slots in the ledger
    slots: int = 0
    split: Split = field(default_factory=Split)

    @classmethod
    def from_json(cls, d: Any) -> "NodeLedger":
        d = _d(d)
        return cls(d.get("node", 0), str(d.get("host") or ""), d.get("slots") or 0, Split.from_json(d))

    def to_json(self) -> J:
        return {"node": self.node, "host": self.host, "slots": self.slots, **self.split.to_json()}


@dataclass(slots=True)
class Progress:
    """Where training stood in an attempt, in steps completed (``position``s): where it began,
    where it ended, what its last checkpoint held, and what it redid.

    ``source`` is ``"step"`` when the script gives its global step (``trace_step(step=...)`` or a
    framework's), so positions and ``redone_steps`` are exact; ``"inferred"`` when they are
    inferred from the attempt's own step count and its checkpoints (an attempt resumes from the
    last checkpoint before it); ``"unknown"`` when a later attempt has neither (its positions and
    ``redone_steps`` are None: not measured); ``"none"`` when no rank stepped."""

    source: str = "none"
    steps: int = 0
    first_position: Optional[int] = None
    end_position: Optional[int] = None
    checkpoint_position: Optional[int] = None
    checkpoints: int = 0
    #: the last checkpoint's end (epoch s) and how long the attempt trained after it (wall s)
    last_checkpoint_at: Optional[float] = None
    unsaved_s: Optional[float] = None
    redone_steps: Optional[int] = 0
    #: the most steps the attempt may have reached, and so the most a later one may have redone,
    #: when records of ranks killed before their goodbye never reached node 0 (None: the same as
    #: ``end_position``/``redone_steps``, or not bounded)
    end_position_max: Optional[int] = None
    redone_steps_max: Optional[int] = None

    @property
    def exact(self) -> bool:
        return self.source == "step"

    @classmethod
    def from_json(cls, d: Any) -> "Progress":
        d = _d(d)
        return cls(str(d.get("source") or "none"), d.get("steps") or 0, d.get("first_position"),
                   d.get("end_position"), d.get("checkpoint_position"), d.get("checkpoints") or 0,
                   d.get("last_checkpoint_at"), d.get("unsaved_s"), d.get("redone_steps"),
                   d.get("end_position_max"), d.get("redone_steps_max"))

    def to_json(self) -> J:
        return {"source": self.source, "exact": self.exact, "steps": self.steps,
                "first_position": self.first_position, "end_position": self.end_position,
                "checkpoint_position": self.checkpoint_position, "checkpoints": self.checkpoints,
                "last_checkpoint_at": self.last_checkpoint_at, "unsaved_s": self.unsaved_s,
                "redone_steps": self.redone_steps, "end_position_max": self.end_position_max,
                "redone_steps_max": self.redone_steps_max}


@dataclass(slots=True)
class Ending:
    """How an attempt met its time limit: the early warning of ``#SBATCH --signal`` (when it came,
    how long before the limit, whether a checkpoint was saved after it) and the SIGTERM at the
    limit, with the training since the last checkpoint that a resumed run redoes. ``words`` is the
    one line the text shows."""

    #: the early warning's signal (SIGUSR1 or SIGUSR2) and when the first launcher got it (epoch s)
    warning: Optional[str] = None
    warning_at: Optional[float] = None
    #: when the cluster meant to end the job, as it said when the warning came (epoch s)
    scheduled_end: Optional[float] = None
    #: the scheduled end less the warning's arrival (s)
    warning_lead_s: Optional[float] = None
    #: whether a checkpoint save ended after the warning (None: no warning)
    saved_after_warning: Optional[bool] = None
    #: the SIGTERM a launcher got (the time limit, scancel, a requeue), epoch s
    sigterm_at: Optional[float] = None
    #: the attempt ended before the scheduled end by this much (s; None: not known, or it did not)
    ended_before_limit_s: Optional[float] = None
    words: str = ""

    @classmethod
    def from_json(cls, d: Any) -> Optional["Ending"]:
        if not isinstance(d, dict):
            return None
        return cls(d.get("warning"), d.get("warning_at"), d.get("scheduled_end"), d.get("warning_lead_s"),
                   d.get("saved_after_warning"), d.get("sigterm_at"), d.get("ended_before_limit_s"),
                   str(d.get("words") or ""))

    def to_json(self) -> J:
        return {"warning": self.warning, "warning_at": self.warning_at, "scheduled_end": self.scheduled_end,
                "warning_lead_s": self.warning_lead_s, "saved_after_warning": self.saved_after_warning,
                "sigterm_at": self.sigterm_at, "ended_before_limit_s": self.ended_before_limit_s,
                "words": self.words}


@dataclass(slots=True)
class AttemptLedger:
    """One attempt: one allocation period of the run (a job, or one requeue of it)."""

    attempt: int = 0
    job_id: Optional[str] = None
    restart_count: Optional[int] = None
    run_id: Optional[str] = None
    #: the allocation's window, epoch seconds, and where each end came from
    start: float = 0.0
    start_source: str = ""
    end: float = 0.0
    end_source: str = ""
    slots: int = 0
    unit: str = "rank-seconds"
    #: how it ended: completed, failed, requeued, time_limit, preempted, cancelled, interrupted,
    #: running, unknown; and the run's reason in words
    ended: str = "unknown"
    reason: str = ""
    split: Split = field(default_factory=Split)
    nodes: list[NodeLedger] = field(default_factory=list)
    #: bucket -> why it was not measured and how to measure it
    not_measured: dict[str, str] = field(default_factory=dict)
    #: bucket -> how it was measured here when that differs from docs/goodput.md's rule
    notes: dict[str, str] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    #: wall seconds between the previous attempt's end and this one's start (queued, not allocated)
    queued_before_s: Optional[float] = None
    #: this attempt's own summary: where it is, whether it was rebuilt from a checkpoint
    summary: Optional[str] = None
    rebuilt: bool = False
    #: the attempt's nodes, listed in ``nodes`` or not (account.MAX_NODE_ROWS); 0: as many as listed
    nodes_total: int = 0
    #: the early warning and the time limit, where either came (None: neither)
    ending: Optional[Ending] = None

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    @classmethod
    def from_json(cls, d: Any) -> "AttemptLedger":
        d = _d(d)
        return cls(d.get("attempt") or 0, d.get("job_id"), d.get("restart_count"), d.get("run_id"),
                   d.get("start") or 0.0, str(d.get("start_source") or ""), d.get("end") or 0.0,
                   str(d.get("end_source") or ""), d.get("slots") or 0, str(d.get("unit") or "rank-seconds"),
                   str(d.get("ended") or "unknown"), str(d.get("reason") or ""), Split.from_json(d),
                   [NodeLedger.from_json(n) for n in d.get("nodes") or []], dict(_d(d.get("not_measured"))),
                   dict(_d(d.get("notes"))), Progress.from_json(d.get("progress")), d.get("queued_before_s"),
                   d.get("summary"), bool(d.get("rebuilt")), int(d.get("nodes_total") or 0),
                   Ending.from_json(d.get("ending")))

    def to_json(self) -> J:
        return {"attempt": self.attempt, "job_id": self.job_id, "restart_count": self.restart_count,
                "run_id": self.run_id, "start": self.start, "start_source": self.start_source,
                "end": self.end, "end_source": self.end_source, "wall_s": round(self.wall_s, 3),
                "slots": self.slots, "unit": self.unit, "ended": self.ended, "reason": self.reason,
                **self.split.to_json(), "nodes": [n.to_json() for n in self.nodes],
                "nodes_total": self.nodes_total or len(self.nodes),
                "not_measured": self.not_measured, "notes": self.notes,
                "progress": self.progress.to_json(), "queued_before_s": self.queued_before_s,
                "summary": self.summary, "rebuilt": self.rebuilt,
                "ending": self.ending.to_json() if self.ending else None}


@dataclass(slots=True)
class Advice:
    """The largest avoidable bucket, with its figure and a next step."""

    bucket: str
    seconds: float
    fraction: float
    why: str
    next_step: str

    @classmethod
    def from_json(cls, d: Any) -> Optional["Advice"]:
        if not isinstance(d, dict) or not d.get("bucket"):
            return None
        return cls(str(d["bucket"]), d.get("seconds") or 0.0, d.get("fraction") or 0.0,
                   str(d.get("why") or ""), str(d.get("next_step") or ""))

    def to_json(self) -> J:
        return {"bucket": self.bucket, "seconds": self.seconds, "fraction": self.fraction,
                "why": self.why, "next_step": self.next_step}


@dataclass(slots=True)
class NodeThroughput:
    node: int
    tokens_per_s: Optional[float] = None
    #: tokens per second of step time (while training), beside per second of allocation
    tokens_per_step_s: Optional[float] = None
    mfu: Optional[float] = None
    samples_per_s: Optional[float] = None
    samples_per_step_s: Optional[float] = None

    @classmethod
    def from_json(cls, d: Any) -> "NodeThroughput":
        d = _d(d)
        return cls(d.get("node", 0), d.get("tokens_per_s"), d.get("tokens_per_step_s"), d.get("mfu"),
                   d.get("samples_per_s"), d.get("samples_per_step_s"))

    def to_json(self) -> J:
        return {"node": self.node, "tokens_per_s": self.tokens_per_s,
                "tokens_per_step_s": self.tokens_per_step_s, "samples_per_s": self.samples_per_s,
                "samples_per_step_s": self.samples_per_step_s, "mfu": self.mfu}


@dataclass(slots=True)
class Throughput:
    """Tokens and samples per second per node and MFU, where the script declares its work per
    step (``traceml.declare_work``) and, for MFU, the device's peak is known; else why not."""

    tokens_per_s: Optional[float] = None
    mfu: Optional[float] = None
    #: the peak MFU is measured against, and where it comes from (device name, dtype)
    peak_flops: Optional[float] = None
    peak_source: Optional[str] = None
    nodes: list[NodeThroughput] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)
    samples_per_s: Optional[float] = None

    @classmethod
    def from_json(cls, d: Any) -> "Throughput":
        d = _d(d)
        return cls(d.get("tokens_per_s"), d.get("mfu"), d.get("peak_flops"), d.get("peak_source"),
                   [NodeThroughput.from_json(n) for n in d.get("nodes") or []], dict(_d(d.get("not_measured"))),
                   d.get("samples_per_s"))

    def to_json(self) -> J:
        return {"tokens_per_s": self.tokens_per_s, "samples_per_s": self.samples_per_s, "mfu": self.mfu,
                "peak_flops": self.peak_flops,
                "peak_source": self.peak_source, "nodes": [n.to_json() for n in self.nodes],
                "not_measured": self.not_measured}


@dataclass(slots=True)
class Ledger:
    """The run's ledger: every attempt, the run's total, the time queued between attempts, the
    advice and the throughput."""

    unit: str = "rank-seconds"
    attempts: list[AttemptLedger] = field(default_factory=list)
    total: Split = field(default_factory=Split)
    queued_s: float = 0.0
    advice: Optional[Advice] = None
    throughput: Throughput = field(default_factory=Throughput)

    @property
    def current(self) -> Optional[AttemptLedger]:
        return self.attempts[-1] if self.attempts else None

    @classmethod
    def from_json(cls, d: Any) -> Optional["Ledger"]:
        if not isinstance(d, dict):
            return None
        return cls(str(d.get("unit") or "rank-seconds"), [AttemptLedger.from_json(a) for a in d.get("attempts") or []],
                   Split.from_json(d.get("total")), d.get("queued_s") or 0.0, Advice.from_json(d.get("advice")),
                   Throughput.from_json(d.get("throughput")))

    def to_json(self) -> J:
        return {"unit": self.unit, "attempts": [a.to_json() for a in self.attempts],
                "total": self.total.to_json(), "queued_s": round(self.queued_s, 3),
                "advice": self.advice.to_json() if self.advice else None,
                "throughput": self.throughput.to_json()}
