"""INPUT-BOUND: the run waits for data.

How it decides. With a DataLoader (or ``wrap_dataloader``) the fetch is timed and credited to the
step: the share of the step a rank waits for its batches. Judged on the rank that waits most:
under DDP the slowest loader paces the run (that rank waits for its batches while the others,
prefetched, wait for it in the all-reduce), so judged on the rank that waits least a run of
equally slow loaders would read as a straggler in one run and input-bound in the next. Without
a DataLoader input is *not measured*: the time between traced steps, which nothing else
explains, is read as the input wait against the whole wall clock per step (a ``get_batch()``
before each step shows there), judged on the rank that spends least there (the others' extra
time between steps may be work of their own); where that rank's gaps come in pauses (periodic
work), only the part spread over every step counts. A warning from 10 % and 1 ms, critical from
30 % and 5 ms. Where the fetch is measured, the CPU's part (report/cpubinding.py: the pacing
rank's DataLoader workers against its CPUs) says whether more workers, more CPUs or faster
storage is the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .. import cpubinding
from .. import thresholds as T
from ..model import RankSummary
from .base import Evidence, Finding, Run, mean_ms, severity
from .periodic_work import pattern

KIND = "input_bound"
THRESHOLDS = ("INPUT_FRACTION_WARN", "INPUT_FRACTION_CRIT", "INPUT_FLOOR_MS", "INPUT_CRIT_FLOOR_MS")


@dataclass
class InputEvidence(Evidence):
    source: str
    input_fraction: float
    input_ms: float
    of_ms: float
    periodic_excluded: bool
    device: str
    pacing_rank: Optional[int]
    ranks: int
    cpu: Optional[dict[str, Any]] = None
    explained_by: Optional[str] = None


def input_wait(r: RankSummary) -> Optional[tuple[float, float, str, bool]]:
    """(wait ms, of how many ms, how it was measured, whether periodic pauses were left out) for
    one rank (see the module docstring)."""
    step = mean_ms(r, "step")
    if not step:
        return None
    inp = mean_ms(r, "input")
    if inp is not None:
        return inp, step, "fetch", False
    between = mean_ms(r, "outside")
    if between is None:
        return None
    between = max(0.0, between)
    if pattern(r.between):
        assert r.between is not None
        return min(between, r.between.uniform_ms), step + between, "between", True
    return between, step + between, "between", False


def detect(run: Run) -> Optional[Finding]:
    live, ctx = run.live, run.ctx
    measured = [(r.rank, w) for r, w in ((r, input_wait(r)) for r in live) if w is not None]
    if not measured:
        return None
    between = sum(1 for _, w in measured if w[2] == "between") > len(measured) / 2
    measured = [(rank, w) for rank, w in measured if (w[2] == "between") == between]
    pick = max if not between else min
    rank, (wait, of, _, periodic) = pick(measured, key=lambda m: m[1][0] / m[1][1])
    frac = wait / of
    sev = severity(frac, wait, T.INPUT_FRACTION_WARN, T.INPUT_FRACTION_CRIT, T.INPUT_FLOOR_MS,
                   T.INPUT_CRIT_FLOOR_MS)
    if sev is None:
        return None
    pacing = ctx.cpu_threads.get(rank)
    cpu = None if between else cpubinding.evidence([pacing] if pacing is not None else
                                                    [ctx.cpu_threads.get(r.rank) for r in live])
    return Finding(KIND, sev, None, InputEvidence(
        source="between_steps" if between else "fetch", input_fraction=round(frac, 4),
        input_ms=round(wait, 4), of_ms=round(of, 4), periodic_excluded=bool(between and periodic),
        device=ctx.device, pacing_rank=None if between else rank, ranks=len(measured), cpu=cpu))


def say(ev: InputEvidence) -> tuple[str, str]:
    gpu = ev.device == "cuda"
    if ev.source == "between_steps":
        why = (f"input is not measured (no DataLoader or wrap_dataloader), and every rank spends at least "
               f"{ev.input_ms:.1f} ms between steps for each {ev.of_ms:.1f} ms of wall clock per step "
               f"({ev.input_fraction:.0%})")
        why += ("; of the time between steps, only the part spread over every step, not the periodic "
                "pauses (see the periodic-work verdict)," if ev.periodic_excluded else ":")
        why += (" time between steps, e.g. fetching the next batch, counted as input wait because "
                "nothing else explains it")
        nxt = ("if that is data loading, move it into a DataLoader with num_workers"
               + (" and pin_memory" if gpu else "") + ", "
               "or prefetch the next batch in a background thread; wrap the batch source with "
               "traceml.wrap_dataloader(...) to measure the fetch itself; if it is logging, "
               "evaluation or checkpointing, do it less often")
        return why, nxt
    if gpu:
        nxt = ("feed the GPUs faster: raise DataLoader num_workers, set pin_memory=True and "
               "persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    else:
        nxt = ("load batches faster: raise DataLoader num_workers (the node's spare cores permitting), "
               "set persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    one = (f"waits for its next batch {ev.input_fraction:.0%} of its step time ({ev.input_ms:.1f} ms of "
           f"{ev.of_ms:.1f} ms per step on average)")
    if ev.ranks == 1:
        why = f"rank {ev.pacing_rank} {one}"
    else:
        why = (f"the run waits for data: rank {ev.pacing_rank}, whose DataLoader sets the pace, {one}; the "
               "other ranks wait for it")
    if ev.cpu:  # what the CPU says of it, and the fix that fits (report/cpubinding.py)
        cpu_why, nxt = cpubinding.say(ev.cpu)
        why += f"; {cpu_why}"
    return why, nxt


EVIDENCE = InputEvidence
