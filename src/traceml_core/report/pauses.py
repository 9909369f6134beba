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
(the median), longer than it by :data:`~.thresholds.PERIODIC_BURST_FLOOR_MS`, and longer than it
by more than the rank's own scheduling jitter (:data:`~.thresholds.PERIODIC_JITTER_SPREADS` times
the spread of its steps): on a loaded machine a thread loses its core for milliseconds at random,
between steps as in them. Of those, the pauses that hold the time are kept: at least
:data:`~.thresholds.PERIODIC_OF_MEAN_PAUSE` of the mean pause (jitter that passed the cut is
short beside an evaluation). Counts are estimates where the gaps were sampled (a few records per
window on a fast run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
    #: how long a gap had to be to be a pause (ms; None in an older summary)
    cut_ms: Optional[float] = None

    @property
    def pause_ms(self) -> float:
        """A pause's mean length above the typical gap."""
        return self.pause_excess_ms / self.pauses if self.pauses else 0.0


def pause_cut_ms(typical_ms: float, jitter_ms: float = 0.0) -> float:
    """How long a gap must be to be a pause, given the typical gap and the spread of the rank's
    steps (its scheduling jitter)."""
    return max(T.PERIODIC_BURST_RATIO * typical_ms, typical_ms + T.PERIODIC_BURST_FLOOR_MS,
               typical_ms + T.PERIODIC_JITTER_SPREADS * max(0.0, jitter_ms))


def between_steps(outside: OutsideData, jitter_ms: float = 0.0) -> Optional[BetweenSteps]:
    """The distribution of a rank's steady gaps and its pauses; ``jitter_ms``: the spread of its
    steps (p90 - p50 of its step time). None without a sketch of the gaps (an older checkpoint, or
    fewer than two steady steps)."""
    if not outside.sketch:
        return None
    sk = QuantileSketch.from_data(outside.sketch)
    p50, p90, top = sk.quantiles((0.5, 0.9, 1.0))
    if p50 is None:
        return None
    typical = p50 / 1e6
    cut = pause_cut_ms(typical, jitter_ms)
    n_lo, s_lo, n_hi, s_hi = sk.split(cut * 1e6)
    for _ in range(2):  # the pauses that hold the time: at least a share of the mean pause
        if not n_hi:
            break
        longer = T.PERIODIC_OF_MEAN_PAUSE * (s_hi / 1e6 / n_hi)
        if longer <= cut:
            break
        cut = longer
        n_lo, s_lo, n_hi, s_hi = sk.split(cut * 1e6)
    total = (s_lo + s_hi) / 1e6
    excess = max(0.0, s_hi / 1e6 - n_hi * typical)
    return BetweenSteps(
        gaps=n_lo + n_hi, typical_ms=round(typical, 4),
        p90_ms=None if p90 is None else round(p90 / 1e6, 4),
        max_ms=None if top is None else round(top / 1e6, 4),
        pauses=n_hi, pause_excess_ms=round(excess, 3),
        uniform_ms=round(s_lo / 1e6 / n_lo, 4) if n_lo else 0.0,
        pause_share=round(excess / total, 4) if total > 0 else 0.0, cut_ms=round(cut, 4))
