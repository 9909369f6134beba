"""What a rank reports about its work besides step records: timed spans, progress, declared work.

Three kinds of rank ``event`` carry them (the payload is the event's JSON ``text``, checked at
the trust boundary by ``wire/frames.rank_fact``; see docs/wire-protocol.md):

``span``
    One timed span of the rank's own (the SDK's one span kind today: ``checkpoint``, a
    ``torch.save``, ``torch.distributed.checkpoint.save`` or a Lightning / Hugging Face checkpoint
    hook): ``{"span", "dur_ns", "end", "step", "gstep", "in_step", "api"}``. ``end`` is the wall
    clock at its end (epoch s), ``step`` the rank's own step count when it ran (steps completed),
    ``gstep`` the script's global step (``trace_step(step=...)``) or null, ``in_step`` whether
    it ran inside a traced step.
``progress``
    Where the rank's training is: ``{"step", "gstep", "start", "end"}`` for the step whose index
    (0-based, the rank's own) is ``step``: its global step as the script numbers it (null when the
    script does not say) and its wall-clock start or end (epoch s, either may be null). Sent when
    the worker starts (step 0, no global step: it also says that the worker times its
    checkpoints; traceml_core/sdk/spans.py), whenever the global step given to
    ``trace_step(step=...)`` stops following the rank's own count (its first use, a resume), and
    at the end.
``work``
    What one step is worth, when the script declares it (``traceml.declare_work``):
    ``{"tokens_per_step", "samples_per_step", "flops_per_step", "dtype", "device"}`` (any may be
    null; ``device``: the GPU's name as NVML gives it, or ``cpu``).

Node 0 keeps them per rank in :class:`RankFacts` (bounded: totals, the last few spans, the first
and last progress marks), in its checkpoints and the typed run data (``RankData.facts``); the
goodput ledger (``traceml_core/goodput``) reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

#: the event kinds that carry rank facts, and the span kinds there are
FACT_KINDS = ("span", "progress", "work")
SPAN_KINDS = ("checkpoint",)
#: spans kept one by one per rank and kind (the rest only in the totals)
RECENT_SPANS = 64


@dataclass(slots=True)
class Span:
    """One timed span: when it ended (epoch s), how long it took, and at which step."""

    end: float
    dur_ns: int
    step: Optional[int] = None
    gstep: Optional[int] = None
    in_step: bool = False
    api: str = ""

    @property
    def start(self) -> float:
        return self.end - self.dur_ns / 1e9


@dataclass(slots=True)
class SpanTotals:
    """Every span of one kind on one rank: totals, and the last :data:`RECENT_SPANS` one by one."""

    count: int = 0
    sum_ns: int = 0
    max_ns: int = 0
    in_step_ns: int = 0
    recent: list[Span] = field(default_factory=list)

    def add(self, span: Span) -> None:
        self.count += 1
        self.sum_ns += span.dur_ns
        self.max_ns = max(self.max_ns, span.dur_ns)
        if span.in_step:
            self.in_step_ns += span.dur_ns
        self.recent.append(span)
        if len(self.recent) > RECENT_SPANS:
            del self.recent[0]

    @property
    def last(self) -> Optional[Span]:
        return self.recent[-1] if self.recent else None


@dataclass(slots=True)
class Mark:
    """One progress mark: the rank's step ``step`` is the script's global step ``gstep``."""

    step: int
    gstep: Optional[int] = None
    start: Optional[float] = None
    end: Optional[float] = None


@dataclass(slots=True)
class Progress:
    """A rank's first and latest progress marks, and how often its global step stopped following
    its own count (0: ``gstep = step + offset`` throughout, so any step's global step is exact)."""

    first: Optional[Mark] = None
    last: Optional[Mark] = None
    jumps: int = 0

    def add(self, mark: Mark) -> None:
        # the first mark that gives the script's global step, else the first mark (the worker's
        # start: step 0, no global step yet)
        if self.first is None or (self.first.gstep is None and mark.gstep is not None):
            self.first = mark
        elif self.last is not None and mark.gstep is not None and self.last.gstep is not None \
                and mark.gstep - mark.step != self.last.gstep - self.last.step:
            self.jumps += 1
        if self.last is None or mark.step >= self.last.step:
            self.last = mark

    @property
    def given(self) -> bool:
        """The script gives its global step (``trace_step(step=...)`` or a framework's own)."""
        return self.first is not None and self.first.gstep is not None

    def gstep_at(self, step: int) -> Optional[int]:
        """The global step of the rank's own step ``step`` (from the latest mark's offset)."""
        ref = self.last or self.first
        if ref is None or ref.gstep is None:
            return None
        return ref.gstep + (step - ref.step)


@dataclass(slots=True)
class Work:
    """What one step of this rank is worth, as the script declared it."""

    tokens_per_step: Optional[float] = None
    flops_per_step: Optional[float] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    samples_per_step: Optional[float] = None


@dataclass(slots=True)
class RankFacts:
    """Everything of the above node 0 knows about one rank."""

    spans: dict[str, SpanTotals] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    work: Optional[Work] = None

    def apply(self, kind: str, payload: dict[str, Any]) -> None:
        """One checked ``span``/``progress``/``work`` payload (wire/frames.rank_fact)."""
        if kind == "span":
            self.spans.setdefault(payload["span"], SpanTotals()).add(Span(
                payload["end"], payload["dur_ns"], payload.get("step"), payload.get("gstep"),
                bool(payload.get("in_step")), payload.get("api") or ""))
        elif kind == "progress":
            self.progress.add(Mark(payload["step"], payload.get("gstep"), payload.get("start"),
                                   payload.get("end")))
        elif kind == "work":
            self.work = Work(payload.get("tokens_per_step"), payload.get("flops_per_step"),
                             payload.get("dtype"), payload.get("device"), payload.get("samples_per_step"))

    def span(self, kind: str) -> SpanTotals:
        return self.spans.get(kind) or SpanTotals()

    @property
    def empty(self) -> bool:
        return not self.spans and self.progress.first is None and self.work is None
