"""Verdicts: why is this run slow? One module per rule, one registry, one graph of causes.

Each rule is a module of this package: its kind (``KIND``), its typed evidence (``EVIDENCE``, a
dataclass holding every figure its sentences quote), ``detect(run)`` (a pure function of the
run's figures: a :class:`~.base.Finding` or None), ``say(evidence)`` (its two sentences, written
from the evidence alone), the thresholds it reads (``THRESHOLDS``: names in report/thresholds.py,
each with the reason for its value) and a docstring that says how it decides (docs/headline.md is
generated from them). The failure, hang and did-not-start kinds are decided where the run's
ending is (report/failure.py, report/hang.py); their modules here only name them.

:func:`judge` runs every rule, then the graph (:mod:`.graph`: a cause before its consequence, a
verdict that contradicts another dropped), in any order of the rules. Adding a verdict is one
module here, listed in :data:`RULES`, plus its scenarios in benchmarks/scenarios/catalog.py.

Means are "steady" means (the warm-up steps left out). Advice fits the device the run used
(``ctx.device``: ``cuda``, ``cpu`` or ``unknown``): no bf16, torch.compile or "batch per GPU" on
a CPU run.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

from .. import thresholds as T
from ..model import RankSummary, VerdictContext
from . import (communication_bound, compute_bound, cpu_contention, cpu_oversubscribed, did_not_start, hang,
               input_bound, low_gpu_util, memory_creep, no_clear_bottleneck, no_steps, periodic_work,
               run_failed, straggler, work_imbalance)
from .base import WAIT_PHASES, Finding, Run, no_phase, own_time
from .graph import arrange

__all__ = ["RULES", "KINDS", "SAY", "judge", "say", "own_time", "no_phase", "WAIT_PHASES", "rule"]

Verdict = dict[str, Any]

#: every rule, in the order that breaks ties between verdicts of one severity (the first listed
#: comes first): failures and hangs, then the causes a user acts on first
RULES: tuple[ModuleType, ...] = (
    hang, did_not_start, run_failed, no_steps, work_imbalance, straggler, input_bound, periodic_work,
    communication_bound, memory_creep, cpu_oversubscribed, low_gpu_util, cpu_contention, compute_bound,
    no_clear_bottleneck)
KINDS = tuple(m.KIND for m in RULES)
_BY_KIND = {m.KIND: m for m in RULES}
#: the rules judge() runs (the others are decided where the run's ending is)
DETECTORS = tuple(m for m in RULES if hasattr(m, "detect"))


def rule(kind: str) -> ModuleType:
    return _BY_KIND[kind]


def say(kind: str, evidence: dict[str, Any]) -> tuple[str, str]:
    """``(why, next_step)`` of a verdict, from its evidence alone (also from
    ``final_summary.json``: re-derive a verdict's sentences to check them)."""
    m = _BY_KIND[kind]
    return m.say(m.EVIDENCE.from_json(evidence))


#: the kinds whose sentences :func:`say` writes, by kind
SAY: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    m.KIND: (lambda ev, k=m.KIND: say(k, ev)) for m in RULES if hasattr(m, "say")}


def written(f: Finding) -> Verdict:
    """A finding as the summary writes it: its sentences from its evidence."""
    why, nxt = _BY_KIND[f.kind].say(f.evidence)
    return {"kind": f.kind, "severity": f.severity, "why": why, "next_step": nxt, "culprit": f.culprit,
            "evidence": f.evidence.to_json()}


def _one(kind: str, evidence: Any) -> list[Verdict]:
    return [written(Finding(kind, "info" if kind == "no_clear_bottleneck" else "warning", None, evidence))]


def judge(ranks: Sequence[RankSummary], ctx: VerdictContext) -> list[Verdict]:
    """All verdicts for a run, primary first, from the summary's ranks and what else is known of
    the run (:class:`~.model.VerdictContext`: device, median step, GPUs, communication, windows
    of steps, each rank's CPU, ...)."""
    if ctx.no_steps:
        return _one("no_steps", no_steps.NoStepsEvidence(reason=ctx.no_steps, run_status=ctx.run_status))
    live = [r for r in ranks if r.phases.get("step") and r.steady_steps >= T.MIN_STEPS]
    if not live:
        most = max((r.steady_steps for r in ranks), default=0)
        unit = ("optimizer steps" if ctx.step_source not in (None, "trace_step")
                else "steps inside trace_step")
        return _one("no_clear_bottleneck", no_clear_bottleneck.BreakdownEvidence(
            too_few_steps=True, most=most, min_steps=T.MIN_STEPS, warmup=T.WARMUP_STEPS, unit=unit))
    run = Run(live, replace(ctx, found=dict(ctx.found), excused=dict(ctx.excused)))
    found: list[Finding] = [f for f in (m.detect(run) for m in DETECTORS) if f is not None]
    found = arrange(found, {r.rank: r.node for r in live}, KINDS)
    if not found:
        found = [Finding("no_clear_bottleneck", "info", None,
                         no_clear_bottleneck.BreakdownEvidence(shares=no_clear_bottleneck.shares(live)))]
    return [written(f) for f in found]


def evidence_class(kind: str) -> Optional[type]:
    m = _BY_KIND.get(kind)
    return getattr(m, "EVIDENCE", None) if m is not None else None
