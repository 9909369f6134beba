"""The ledger as types: ``final_summary.json``'s ``goodput`` section (docs/summary-schema.md).

Amounts are kept in whole milliseconds of device time (GPU-milliseconds, or rank-milliseconds on
CPU), so every split sums *exactly*: a rank's buckets to its share of the allocation, a node's
ranks to the node, the nodes to the attempt, the attempts to the run. The JSON shows seconds
(the milliseconds / 1000). A bucket that could not be measured is ``null`` (its time is in another
bucket, named in ``not_measured`` with how to measure it), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable, Mapping, Optional

from ...codec import FLAT, Convert, Key, Record, written_after
from .buckets import KEYS


def seconds(ms: Optional[int]) -> Optional[float]:
    return None if ms is None else round(ms / 1000.0, 3)


def to_ms(s: Any) -> Optional[int]:
    return None if s is None else int(round(float(s) * 1000.0))


#: whole milliseconds kept, seconds written (a total; None read as 0)
SECONDS = Convert(lambda s: to_ms(s) or 0, seconds)
#: milliseconds per bucket, written as seconds in the buckets' order (a bucket this version does
#: not know is not read)
BUCKET_SECONDS = Convert(lambda b: {k: to_ms(v) for k, v in b.items() if k in KEYS} if isinstance(b, dict) else b,
                         lambda ms: {k: seconds(ms[k]) for k in KEYS if k in ms})


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
class Split(Record):
    """Milliseconds per bucket (None: not measured), summing exactly to ``total_ms``."""

    total_ms: Annotated[int, Key("total_s"), SECONDS] = 0
    ms: Annotated[dict[str, Optional[int]], Key("buckets"), BUCKET_SECONDS] = field(default_factory=dict)

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

    @written_after()
    def productive_fraction(self) -> Optional[float]:
        p = self.ms.get("productive")
        return round(p / self.total_ms, 4) if self.total_ms and p is not None else None


@dataclass(slots=True)
class NodeLedger(Record):
    node: int = 0
    host: str = ""
    #: the node's device (or rank) slots in the ledger
    slots: int = 0
    split: Annotated[Split, FLAT] = field(default_factory=Split)


@dataclass(slots=True)
class Progress(Record):
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

    @written_after("source")
    def exact(self) -> bool:
        return self.source == "step"


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


@dataclass(slots=True)
class AttemptLedger(Record):
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
    split: Annotated[Split, FLAT] = field(default_factory=Split)
    nodes: list[NodeLedger] = field(default_factory=list)
    #: the attempt's nodes, listed in ``nodes`` or not (account.MAX_NODE_ROWS)
    nodes_total: int = 0
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
    #: the early warning and the time limit, where either came (None: neither)
    ending: Optional[Ending] = None

    @written_after("end_source")
    def wall_s(self) -> float:
        return round(max(0.0, self.end - self.start), 3)


@dataclass(slots=True)
class Advice:
    """The largest avoidable bucket, with its figure and a next step."""

    bucket: str
    seconds: float = 0.0
    fraction: float = 0.0
    why: str = ""
    next_step: str = ""


@dataclass(slots=True)
class NodeThroughput:
    node: int = 0
    tokens_per_s: Optional[float] = None
    #: tokens per second of step time (while training), beside per second of allocation
    tokens_per_step_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    samples_per_step_s: Optional[float] = None
    mfu: Optional[float] = None


@dataclass(slots=True)
class Throughput:
    """Tokens and samples per second per node and MFU, where the script declares its work per
    step (``traceml.declare_work``) and, for MFU, the device's peak is known; else why not."""

    tokens_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    mfu: Optional[float] = None
    #: the peak MFU is measured against, and where it comes from (device name, dtype)
    peak_flops: Optional[float] = None
    peak_source: Optional[str] = None
    nodes: list[NodeThroughput] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Ledger:
    """The run's ledger: every attempt, the run's total, the time queued between attempts, the
    advice and the throughput."""

    unit: str = "rank-seconds"
    attempts: list[AttemptLedger] = field(default_factory=list)
    total: Split = field(default_factory=Split)
    #: wall seconds queued between attempts (ms resolution)
    queued_s: float = 0.0
    advice: Optional[Advice] = None
    throughput: Throughput = field(default_factory=Throughput)

    @property
    def current(self) -> Optional[AttemptLedger]:
        return self.attempts[-1] if self.attempts else None
