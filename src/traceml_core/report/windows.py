"""A rank's run in windows of consecutive steps: its series buckets, read for the verdicts.

The aggregator keeps every rank's run as at most 256 buckets of consecutive steps (statistics/
series.py: per bucket the step's and each phase's sum and count, the time between steps, the
peak memory). Regrouped to one width for all ranks, bucket ``i`` covers the same steps on every
rank, so the verdicts can ask *when* something happened, not only how much on average: whether
a rank is slower through the whole run or only in a stretch of it (a stall, another process
taking its core for a while), whether the time between steps comes every step or in bursts
(an evaluation every k steps), whether memory still rises at the end.

Resolution: a window is at least one step, and the time between steps is measured record by
record (from one step's end to the next one's, less the next step's own time: statistics/
window.py), so a burst between two steps lands in the window of the step after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..statistics.series import OUTSIDE, regroup, series_phases, series_values
from ..rundata import RankData
from .thresholds import WARMUP_STEPS

NS_PER_MS = 1e6


def means(sums: list, cnts: list, n: int, digits: Optional[int] = None) -> list[Optional[float]]:
    """Per-bucket means in ms (None for an empty bucket), padded to ``n``."""
    out = [(s / c / NS_PER_MS if digits is None else round(s / c / NS_PER_MS, digits)) if c else None
           for s, c in zip(sums, cnts)]
    return out + [None] * (n - len(out))


def phase_col(name: str) -> str:
    return name[:-3] if name.endswith("_ns") else name


def common_width(ranks: Sequence[RankData]) -> int:
    """The coarsest bucket width of the ranks (every width is a power of two, so it is a
    multiple of each)."""
    return max((int(r.series.get("width") or 1) for r in ranks), default=1)


@dataclass
class Windows:
    """One rank's windows at ``width`` steps each: means per step (ms) of the step, of each
    measured phase and of the time between steps (``outside``), the step records per window
    and the peak memory (bytes; None where not sampled)."""

    rank: int
    width: int
    steps: list[int]
    step_ms: list[Optional[float]]
    phases_ms: dict[str, list[Optional[float]]] = field(default_factory=dict)
    mem_max: list[Optional[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def steady(self, i: int) -> bool:
        """Whether window ``i`` lies wholly after the warm-up steps."""
        return i * self.width >= WARMUP_STEPS and self.steps[i] > 0

    def phase(self, name: str, i: int) -> Optional[float]:
        col = self.phases_ms.get(name)
        return col[i] if col is not None and i < len(col) else None


def rank_windows(r: RankData, width: Optional[int] = None) -> Windows:
    """``r``'s series at ``width`` steps per window (a multiple of its own; default its own)."""
    s = r.series
    own = max(1, int(s.get("width") or 1))
    width = max(own, width or own)
    f = width // own
    cnt = regroup(series_values(s, "step_cnt"), f, "sum")
    n = len(cnt)
    step = means(regroup(series_values(s, "step_sum"), f, "sum"), cnt, n)
    phases: dict[str, list[Optional[float]]] = {}
    for col in dict.fromkeys([*series_phases(s), OUTSIDE]):
        pc = regroup(series_values(s, "phase_cnt", col), f, "sum")
        if any(pc):
            phases[phase_col(col)] = means(regroup(series_values(s, "phase_sum", col), f, "sum"), pc, n)
    mem = [None if m < 0 else m for m in regroup(series_values(s, "mem_max"), f, "max")]
    return Windows(rank=r.rank, width=width, steps=list(cnt), step_ms=step, phases_ms=phases,
                   mem_max=mem + [None] * max(0, n - len(mem)))


def run_windows(ranks: Sequence[RankData]) -> dict[int, Windows]:
    """Every rank's windows at the run's common width (window ``i`` = the same steps on all)."""
    width = common_width(ranks)
    return {r.rank: rank_windows(r, width) for r in ranks}


def memory_points(r: RankData) -> list[tuple[float, int]]:
    """``(step, peak bytes)`` per bucket of the rank's own series that has a memory sample: the
    finest the run keeps, for the memory trend (report/trend.py)."""
    s = r.series
    width = max(1, int(s.get("width") or 1))
    return [((i + 0.5) * width, m) for i, m in enumerate(series_values(s, "mem_max")) if m >= 0]
