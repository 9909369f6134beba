"""How the run's steps were found, in the summary's words (``final_summary.json`` ``"steps"``).

Each rank says it in a ``step_source`` event (sdk/source.py): its own ``trace_step``, inferred
from optimizer steps, or a framework's hooks. A rank that never said (a process that called
``traceml.init()`` itself, without ``traceml run``'s worker bootstrap) counts as ``trace_step``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from ..rundata import RankData, StepSource
from .document import StepsBlock
from .model import RankSummary
from .ranklist import ranks_phrase

#: the two lines a script needs for exact phases (shown where steps were inferred or missing)
TWO_LINES = ("import traceml_core as traceml",
             "with traceml.trace_step(model):   # around the body of each training step")

_FRAMEWORK_WORDS = {
    "lightning": "Lightning's hooks (TraceMLCallback): one step per optimizer step",
    "huggingface": "the Hugging Face Trainer's callbacks (TraceMLCallback): one step per optimizer step",
    "accelerate": "Accelerate's optimizer: one step per optimizer step (from its end to the next one's)",
}


def _most_common(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return Counter(vals).most_common(1)[0][0] if vals else None


def steps_block(ranks_data: Sequence[RankData], ranks_summary: Sequence[RankSummary]) -> StepsBlock:
    """``ranks_data``: the run's ranks (with their step source); ``ranks_summary``: the summary's
    rank rows (for step counts)."""
    by_source: dict[str, list[int]] = {}
    infos: list[StepSource] = []
    for r in ranks_data:
        src = r.step_source or StepSource()
        by_source.setdefault(src.source, []).append(r.rank)
        infos.append(src)
    source: Optional[str]
    if not by_source:
        source = None
    elif len(by_source) == 1:
        source = next(iter(by_source))
    else:
        source = "mixed"
    recorded = sum(r.steps for r in ranks_summary)
    accumulation = _most_common([i.accumulation for i in infos])
    bwd = _most_common([i.backward_per_step for i in infos])
    forward_known = [i.forward for i in infos if i.forward is not None]
    out = StepsBlock(source=source, by_source={k: sorted(v) for k, v in sorted(by_source.items())},
                     framework=_most_common([i.framework for i in infos]), accumulation=accumulation,
                     backward_per_step=bwd,
                     forward_measured=(all(forward_known) if forward_known else None),
                     recorded=recorded, notes=sorted({i.note for i in infos if i.note}))
    out.explain = explain(out)
    return out


def explain(steps: StepsBlock) -> list[str]:
    """Lines for the text summary (empty for plain trace_step runs)."""
    src = steps.source
    lines: list[str] = []
    if not steps.recorded:
        return lines       # the no-steps verdict says what happened
    folded = _folded(steps)
    if src == "inferred":
        fwd = ("forward is timed for the DistributedDataParallel model" if steps.forward_measured
               else "forward is not measured (no DistributedDataParallel model to time)")
        lines.append("Steps: inferred (no rank calls traceml): one step = one optimizer step, from the "
                     f"end of one Optimizer.step() to the end of the next{folded}; input = DataLoader "
                     f"waits, {fwd}; the rest of the loop is in the step but in no phase")
        lines.append(f"  for exact phases add two lines: `{TWO_LINES[0]}` and `{TWO_LINES[1].split('  ')[0]}`"
                     " around each step")
    elif src in _FRAMEWORK_WORDS:
        fw = f" ({steps.framework})" if steps.framework else ""
        lines.append(f"Steps: from {_FRAMEWORK_WORDS[src]}{fw}{folded}")
    elif src == "mixed":
        parts = ", ".join(f"{k} on {ranks_phrase(v)}" for k, v in steps.by_source.items())
        lines.append(f"Steps: found differently on different ranks ({parts}); compare ranks with care")
    for note in steps.notes:
        lines.append(f"  note: {note}")
    return lines


def _folded(steps: StepsBlock) -> str:
    acc = steps.accumulation
    bwd = steps.backward_per_step
    if acc and acc > 1:
        return f"; gradient accumulation {acc}: each step holds {acc} micro-batches"
    if steps.source == "inferred" and bwd and bwd > 1:
        return (f"; {bwd} backward passes per step (gradient accumulation folded into the step)")
    return ""


def no_steps_reason(steps: StepsBlock, joined: int, world: int, run_status: str) -> Optional[str]:
    """Why no rank recorded a single step, in words a user can act on; None when some did."""
    if steps.recorded:
        return None
    src = steps.source
    if joined == 0:
        if run_status != "completed":
            return None     # a launch failure: the failure verdicts say what happened
        return (f"none of the {world} ranks connected to TraceML although the workers ran and exited "
                "cleanly: the script never imported torch under `traceml run` (or it was started "
                "with --no-python), so no rank called traceml")
    if run_status in ("interrupted", "failed"):
        # stopped (scancel, a time limit, Ctrl-C) or failed while the ranks were still starting:
        # whether the script would have reached trace_step cannot be told from this run
        ended = "was interrupted" if run_status == "interrupted" else "failed"
        return (f"the run {ended} before any of its {joined} joined "
                "rank(s) finished a first step, so nothing about the training can be judged")
    if src == "inferred":
        return ("no rank calls traceml (init()/trace_step) and no torch optimizer ever stepped, so no "
                "step could be inferred (steps are inferred from Optimizer.step())")
    if src in _FRAMEWORK_WORDS:
        return (f"the {src} integration saw no completed optimizer step (training ended or failed "
                "before the first one?)")
    return "no rank recorded a step: the script never entered trace_step (init() alone records none)"
