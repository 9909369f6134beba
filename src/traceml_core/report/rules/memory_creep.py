"""MEMORY-CREEP: a rank's memory keeps growing (a leak: tensors kept across steps, a growing cache).

How it decides. Each rank's peak memory per window of steps (sampled 10 times a second) is fit
with a robust Theil-Sen line after the first 10 % of the run (report/trend.py): the growth over
the run, whether it is still rising at the end (the slope over the last half of the windows is
at least half the whole run's: a plateau, memory that grew and stopped, is not creep), and the
smallest growth its scatter lets it tell. A rank still rising that grew at least 10 % and 64 MiB,
above what the trend can tell, creeps: a warning, critical from 30 %. The rank that grew most
(relative) is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import thresholds as T
from .base import Evidence, Finding, Run

KIND = "memory_creep"
THRESHOLDS = ("MEM_SKIP_FRACTION", "MEM_CREEP_GROWTH_WARN", "MEM_CREEP_GROWTH_CRIT", "MEM_CREEP_FLOOR_BYTES",
              "MEM_MIN_WINDOWS", "MEM_STILL_RISING")


@dataclass
class MemoryEvidence(Evidence):
    rank: int
    who: str
    growth_fraction: float
    growth_bytes: int
    start_bytes: int
    end_bytes: int
    steps: int
    slope_bytes_per_step: float
    windows: int
    min_detectable_bytes: int
    ranks_affected: int
    ranks: int
    device: str = "unknown"
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    creeping = []
    for r in run.live:
        tr = r.mem_peak.trend if r.mem_peak else None
        if not tr or not tr.rising or tr.start_bytes <= 0:
            continue
        rel = tr.growth_bytes / tr.start_bytes
        if (rel >= T.MEM_CREEP_GROWTH_WARN and tr.growth_bytes >= T.MEM_CREEP_FLOOR_BYTES
                and tr.growth_bytes >= tr.min_detectable_bytes):
            creeping.append((rel, r, tr))
    if not creeping:
        return None
    rel, worst, tr = max(creeping, key=lambda x: x[0])
    sev = "critical" if rel >= T.MEM_CREEP_GROWTH_CRIT else "warning"
    return Finding(KIND, sev, worst.culprit(), MemoryEvidence(
        rank=worst.rank, who=worst.name, growth_fraction=round(rel, 4), growth_bytes=tr.growth_bytes,
        start_bytes=tr.start_bytes, end_bytes=tr.end_bytes, steps=tr.steps,
        slope_bytes_per_step=tr.slope_bytes_per_step, windows=tr.windows,
        min_detectable_bytes=tr.min_detectable_bytes, ranks_affected=len(creeping), ranks=len(run.live),
        device=run.ctx.device))


def say(ev: MemoryEvidence) -> tuple[str, str]:
    mib = 1024 * 1024
    why = (f"peak memory of {ev.who} grew by {ev.growth_bytes / mib:.0f} MiB "
           f"({ev.start_bytes / mib:.0f} -> {ev.end_bytes / mib:.0f} MiB, +{ev.growth_fraction:.0%}) "
           f"over {ev.steps} steps, {ev.slope_bytes_per_step / 1024:.0f} KiB per step, and was still "
           f"rising at the end; {ev.ranks_affected} of {ev.ranks} ranks show it")
    if ev.device == "cuda":
        tool = "torch.cuda.memory._record_memory_history() shows who holds GPU memory"
    else:
        tool = "tracemalloc (or gc.get_objects() counts of tensors between steps) shows who holds it"
    return why, ("look for tensors kept across steps (a loss summed without .item() or .detach(), "
                 f"growing lists or caches); {tool}")


EVIDENCE = MemoryEvidence
