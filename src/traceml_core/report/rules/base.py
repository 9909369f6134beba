"""What every rule is made of: the run as the rules see it, a finding, and the figures they share.

A rule (one module of this package) reads a :class:`Run` (the ranks with enough steady steps, and
what else is known of the run: :class:`~..model.VerdictContext`) and returns a :class:`Finding`
or None. A finding's evidence is the rule's own dataclass (every figure its sentences quote, as
stored); its sentences are written from that evidence alone, so they come back from
``final_summary.json`` (``rules.say(kind, evidence)``). Rules never read each other's findings:
how findings relate (a cause before its consequence, a verdict that contradicts another) is the
declared graph of :mod:`.graph`, applied after every rule has run, so the order rules run in
changes nothing.

The figures here are the ones several rules read: a rank's steady mean of a phase, its own time
(the straggler, the per-rank charts), time in no phase, the wall clock per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..model import CpuThreads, RankSummary, VerdictContext
from ..stats import median

SEVERITIES = ("critical", "warning", "info")
#: the measured phases inside a traced step
IN_STEP = ("input", "forward", "backward", "optimizer", "h2d", "comm")
#: the phases :func:`own_time` may take out of a step as the wait for the other ranks: the
#: measured communication, else (not measured) backward, where DDP's all-reduce then hides
WAIT_PHASES = ("comm", "backward")
#: the phases a rank's own time is made of, besides backward (own work where communication is
#: measured): ``nophase`` is inside the traced step but outside every measured phase, ``outside``
#: is between steps
OWN_PHASES = ("input", "forward", "optimizer", "h2d", "nophase", "outside")
#: how a sentence names a phase
IN = {"input": "waiting for input", "forward": "in forward", "backward": "in backward",
      "optimizer": "in the optimizer step", "h2d": "in host-to-device copies",
      "nophase": "in no phase (inside trace_step, outside forward, backward and the optimizer)",
      "outside": "between steps (outside trace_step)", "comm": "waiting for communication",
      "step": "the step"}


def own_time(step: Optional[float], phase_ms: Callable[[str], Optional[float]]) -> Optional[float]:
    """A rank's own time per step: ``step - wait + outside``, where the wait for the others is the
    measured communication (``comm``) or, where that was not measured, ``backward`` (DDP's
    gradient all-reduce hides inside it). The straggler verdict and the report's per-rank charts
    both use it."""
    if step is None:
        return None
    wait = phase_ms("comm")
    if wait is None:
        wait = phase_ms("backward")
    return step - (wait or 0.0) + (phase_ms("outside") or 0.0)


def no_phase(step: Optional[float], phase_ms: Callable[[str], Optional[float]]) -> Optional[float]:
    """Time inside the traced step that no measured phase holds (a phase of its own: "no
    phase"): ``step`` less input, forward, backward, optimizer, host-to-device copies and
    communication, where measured; never below zero (timer granularity)."""
    if step is None:
        return None
    return max(0.0, step - sum(v for v in (phase_ms(p) for p in IN_STEP) if v is not None))


def mean_ms(r: RankSummary, phase: str) -> Optional[float]:
    """Steady mean (ms) of a phase for one rank; ``outside`` and ``nophase`` included; None when
    not measured."""
    if phase == "nophase":
        return no_phase(r.steady_ms("step"), r.steady_ms)
    return r.steady_ms(phase)


def iteration(r: RankSummary) -> Optional[float]:
    """Wall time per step of one rank: the traced step plus the time between steps."""
    step = mean_ms(r, "step")
    if not step:
        return None
    return step + max(0.0, mean_ms(r, "outside") or 0.0)


def own(r: RankSummary) -> float:
    """A rank's own time per steady step (0 where its step is not measured)."""
    return own_time(mean_ms(r, "step") or 0.0, lambda p: mean_ms(r, p)) or 0.0


def rounded(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)


def quantile(values: Sequence[float], q: float) -> float:
    vals = sorted(values)
    pos = q * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def severity(frac: float, abs_ms: float, warn: float, crit: float, floor: float,
             crit_floor: Optional[float] = None) -> Optional[str]:
    """``critical``/``warning`` when a share reaches its threshold *and* the absolute figure its
    floor (thresholds.py: every verdict needs both), else None."""
    if frac >= crit and abs_ms >= (crit_floor if crit_floor is not None else floor):
        return "critical"
    if frac >= warn and abs_ms >= floor:
        return "warning"
    return None


@dataclass
class Run:
    """The run as the rules read it: the ranks with enough steady steps (``live``) and the
    context (device, median step, windows of steps, each rank's CPU and work facts, ...)."""

    live: Sequence[RankSummary]
    ctx: VerdictContext
    #: figures several rules read, computed once (by the module that owns them)
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def median_step(self) -> float:
        """The run's one median step (ms), or the median of the ranks' steady means."""
        return self.ctx.median_step_ms or median([mean_ms(r, "step") or 0.0 for r in self.live]) or 0.0

    def comm_measured(self) -> bool:
        return all(mean_ms(r, "comm") is not None for r in self.live)

    def cpu(self, rank: int) -> Optional[CpuThreads]:
        return self.ctx.cpu_threads.get(rank)

    def median_iteration(self) -> float:
        return median([it for it in (iteration(r) for r in self.live) if it]) or 0.0


class Evidence:
    """Base of every rule's evidence dataclass: what it writes into ``final_summary.json`` and
    reads back (an older summary's evidence may lack a field: its default is used; a field this
    version does not know is ignored)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Any:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Finding:
    """A verdict before it is written: its kind, how bad, who, and its typed evidence. The
    sentences are the rule's ``say(evidence)``, written when the finding is (after the graph has
    said what explains it)."""

    kind: str
    severity: str
    culprit: Optional[dict[str, Any]]
    evidence: Any
    #: what the graph did to it (for the tests and the docs): ``explained_by`` lives in evidence
    notes: list[str] = field(default_factory=list)

    @property
    def rank(self) -> Optional[int]:
        return (self.culprit or {}).get("rank")
