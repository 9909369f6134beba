"""The time between steps as a distribution: a few long pauses, or time spread over every step.

Why a distribution and not windows of steps: an evaluation or a checkpoint every k steps and a
``get_batch()`` before every step can add the same mean time between steps. Only how that time
is spread tells them apart, and windows of steps cannot: their width follows how records were
batched on the way to node 0 (2 steps in a live mode, 8 or 128 in ``summary`` mode on the same
run), and a window as wide as the period holds one pause each, so every window looks alike. The
quantile sketch of the steady gaps (``statistics/window.py``: every gap after the warm-up, or a
systematic sample of them, each standing for its stride) sees each gap on its own, whatever the
batching.

A *pause* is a gap longer than :data:`~.thresholds.PERIODIC_BURST_RATIO` times the typical gap
(the median) and longer than it by :data:`~.thresholds.PERIODIC_BURST_FLOOR_MS`. Counts are
estimates where the gaps were sampled (a few records per window on a fast run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..rundata import OutsideData
from ..statistics.sketch import QuantileSketch
from . import thresholds as T


@dataclass(slots=True)
class BetweenSteps:
    """One rank's steady gaps between traced steps (ms), and its pauses among them."""

    #: gaps the sketch stands for (steady: after the warm-up)
    gaps: int
    typical_ms: float
    p90_ms: Optional[float]
    max_ms: Optional[float]
    #: gaps above the pause cut, and their time above the typical gap, in all
    pauses: int
    pause_excess_ms: float
    #: mean of the other gaps: the part spread over every step
    uniform_ms: float
    #: the pauses' excess as a share of all the time between steps
    pause_share: float

    def to_json(self) -> dict[str, Any]:
        return {"gaps": self.gaps, "typical_ms": self.typical_ms, "p90_ms": self.p90_ms,
                "max_ms": self.max_ms, "pauses": self.pauses, "pause_excess_ms": self.pause_excess_ms,
                "uniform_ms": self.uniform_ms, "pause_share": self.pause_share}

    @classmethod
    def from_json(cls, d: Any) -> Optional["BetweenSteps"]:
        if not isinstance(d, dict):
            return None
        try:
            return cls(**{k: d[k] for k in ("gaps", "typical_ms", "p90_ms", "max_ms", "pauses",
                                            "pause_excess_ms", "uniform_ms", "pause_share")})
        except (KeyError, TypeError):
            return None


def pause_cut_ms(typical_ms: float) -> float:
    """How long a gap must be to be a pause, given the typical gap."""
    return max(T.PERIODIC_BURST_RATIO * typical_ms, typical_ms + T.PERIODIC_BURST_FLOOR_MS)


def between_steps(outside: OutsideData) -> Optional[BetweenSteps]:
    """The distribution of a rank's steady gaps; None without a sketch of them (an older
    checkpoint, or fewer than two steady steps)."""
    if not outside.sketch:
        return None
    sk = QuantileSketch.from_data(outside.sketch)
    p50, p90, top = sk.quantiles((0.5, 0.9, 1.0))
    if p50 is None:
        return None
    typical = p50 / 1e6
    n_lo, s_lo, n_hi, s_hi = sk.split(pause_cut_ms(typical) * 1e6)
    total = (s_lo + s_hi) / 1e6
    excess = max(0.0, s_hi / 1e6 - n_hi * typical)
    return BetweenSteps(
        gaps=n_lo + n_hi, typical_ms=round(typical, 4),
        p90_ms=None if p90 is None else round(p90 / 1e6, 4),
        max_ms=None if top is None else round(top / 1e6, 4),
        pauses=n_hi, pause_excess_ms=round(excess, 3),
        uniform_ms=round(s_lo / 1e6 / n_lo, 4) if n_lo else 0.0,
        pause_share=round(excess / total, 4) if total > 0 else 0.0)
