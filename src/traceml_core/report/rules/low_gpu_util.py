"""LOW-GPU-UTIL: the GPUs were idle much of the time.

How it decides. NVML's utilisation (the share of time any kernel ran), sampled about once a
second on every node, averaged over the GPUs with at least 10 samples: under 50 % a warning,
under 25 % critical. When the run waits for data or for the network, that verdict is the cause
and this one says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from .base import Evidence, Finding, Run

KIND = "low_gpu_util"
THRESHOLDS = ("GPU_UTIL_WARN_PCT", "GPU_UTIL_CRIT_PCT", "GPU_MIN_SAMPLES")


@dataclass
class GpuUtilEvidence(Evidence):
    gpu_util_pct: float
    gpus: int
    lowest_gpu: int
    lowest_node: int
    lowest_pct: float
    #: the verdict that explains it (``input_bound``, ``communication_bound``), or None
    see: Optional[str] = None
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    gpus = [g for g in run.ctx.gpus if g.samples >= T.GPU_MIN_SAMPLES and g.util_pct_mean is not None]
    if not gpus:
        return None
    overall = sum(g.util_pct_mean or 0.0 for g in gpus) / len(gpus)
    if overall >= T.GPU_UTIL_WARN_PCT:
        return None
    sev = "critical" if overall < T.GPU_UTIL_CRIT_PCT else "warning"
    low = min(gpus, key=lambda g: g.util_pct_mean or 0.0)
    return Finding(KIND, sev, None, GpuUtilEvidence(
        gpu_util_pct=round(overall, 2), gpus=len(gpus), lowest_gpu=low.index, lowest_node=low.node,
        lowest_pct=round(low.util_pct_mean or 0.0, 2)))


def say(ev: GpuUtilEvidence) -> tuple[str, str]:
    see = ev.explained_by or ev.see
    if see == "input_bound":
        nxt = "see the input verdict: the GPUs are waiting for data"
    elif see == "communication_bound":
        nxt = "see the communication verdict: the GPUs are waiting for the network"
    else:
        nxt = ("the GPUs wait on the host: look at time outside the model phases, raise the batch "
               "size per GPU, or cut kernel-launch overhead with torch.compile / CUDA graphs")
    return (f"the {ev.gpus} GPU(s) were busy {ev.gpu_util_pct:.0f}% of the time on average (lowest: "
            f"GPU {ev.lowest_gpu} on node {ev.lowest_node}, {ev.lowest_pct:.0f}%)"), nxt


EVIDENCE = GpuUtilEvidence
