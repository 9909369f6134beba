"""COMPUTE-BOUND (information): the time goes into the model's own work.

How it decides. Forward, backward, the optimizer and host-to-device copies take 80 % or more of
the wall clock per step (step plus the time between steps: model work that fills a step is not
what bounds a loop that spends most of its time between steps), median over ranks, and, where
GPUs were sampled, they were busy at least 70 % of the time. Information, never a warning. It
cannot stand beside a verdict that says the time goes elsewhere (a straggler, input, the
network, periodic pauses, idle GPUs, more work on one rank): it is then dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from ..stats import median
from .base import Evidence, Finding, Run, iteration, mean_ms, rounded

KIND = "compute_bound"
THRESHOLDS = ("COMPUTE_FRACTION", "COMPUTE_GPU_UTIL_PCT")


@dataclass
class ComputeEvidence(Evidence):
    compute_fraction: float
    median_step_ms: float
    gpu_util_pct: Optional[float]
    comm: str
    device: str = "unknown"
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    fracs = []
    for r in run.live:
        wall = iteration(r)
        if not wall:
            continue
        comp = sum(v for v in (mean_ms(r, p) for p in ("forward", "backward", "optimizer", "h2d"))
                   if v is not None)
        fracs.append(comp / wall)
    frac = median(fracs)
    if frac is None or frac < T.COMPUTE_FRACTION:
        return None
    util = run.ctx.gpu_util_pct
    if util is not None and util < T.COMPUTE_GPU_UTIL_PCT:
        return None
    comm = "measured" if run.comm_measured() else "in_backward" if (run.ctx.world or 1) > 1 else "none"
    return Finding(KIND, "info", None, ComputeEvidence(
        compute_fraction=round(frac, 4), median_step_ms=round(run.median_step, 2),
        gpu_util_pct=rounded(util, 1), comm=comm, device=run.ctx.device))


def say(ev: ComputeEvidence) -> tuple[str, str]:
    note = {"measured": "; communication excluded: it is its own phase",
            "in_backward": "; backward includes the gradient all-reduce: communication was not measured",
            "none": ""}[ev.comm]
    util = ev.gpu_util_pct
    on_gpu = f"; GPUs {util:.0f}% busy" if util is not None else ""
    if ev.device == "cuda":
        nxt = ("speed-ups now come from the model itself: bf16 autocast, a larger batch per GPU, "
               "torch.compile or a fused optimizer; torch.profiler shows the heaviest kernels")
    elif ev.device == "cpu":
        nxt = ("the CPU does the math: give each rank the cores it can use (OMP_NUM_THREADS / "
               "torch.set_num_threads = cores per rank, no more ranks than cores); torch.profiler "
               "shows the heaviest operations")
    else:
        nxt = "speed-ups now come from the model itself; torch.profiler shows the heaviest operations"
    return (f"forward, backward and optimizer take {ev.compute_fraction:.0%} of the wall clock per "
            f"step (median step {ev.median_step_ms:.1f} ms{note}){on_gpu}"), nxt


EVIDENCE = ComputeEvidence
