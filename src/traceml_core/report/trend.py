"""Trends fit for few points: a robust slope (Theil-Sen) and the memory trend built on it.

A short run has few windows of steps (a 250-step run of fast steps: 8), so a trend must work
on a handful of points and survive an outlier or two (an allocator that returns a cache, a
sample taken mid-allocation). The Theil-Sen slope, the median of the slopes between every pair
of points, does both: it has a breakdown point of 29 % (up to that share of points can be
arbitrary without moving it far), it needs no distribution, and with n points it costs n^2/2
pairs (n is at most the 256 series buckets).

The memory trend of one rank says how much its peak memory grew over the run (the fitted line's
rise from the first steady window to the last), whether it was *still rising* at the end (the
slope over the last half of the windows is at least half the whole run's: a plateau, memory that
grew and then stopped, is not a leak), and what it cannot see: the smallest growth it can tell
from the samples' own scatter about the line (3 x their robust spread, never under the creep
floor), stated with every trend as ``min_detectable_bytes``.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .stats import median
from .model import MemTrend
from .thresholds import (MEM_CREEP_FLOOR_BYTES, MEM_CREEP_GROWTH_WARN, MEM_MIN_WINDOWS, MEM_SKIP_FRACTION,
                         MEM_STILL_RISING)

#: the robust spread of a sample (median absolute deviation) times this is its standard deviation
#: for normally distributed scatter
MAD_TO_SD = 1.4826
#: a growth smaller than this many standard deviations of the scatter about the line is noise
DETECT_SDS = 3.0


def median_of(values: Sequence[float]) -> float:
    m = median(values)
    assert m is not None, "median of no values"
    return m


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> Optional[tuple[float, float]]:
    """(slope, intercept) of the Theil-Sen line through the points; None with fewer than two
    distinct x. The intercept is the median of ``y - slope * x``."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i])
              for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not slopes:
        return None
    slope = median_of(slopes)
    intercept = median_of([y - slope * x for x, y in zip(xs, ys)])
    return slope, intercept


def memory_trend(points: Sequence[tuple[float, int]]) -> tuple[Optional[MemTrend], Optional[str]]:
    """The trend of one rank's peak memory from ``(step, bytes)`` points (one per window of
    steps with a sample, in order), or ``(None, why)`` when it cannot be computed: the sentence
    says how many windows there were and how many it needs."""
    skip = int(len(points) * MEM_SKIP_FRACTION)
    body = list(points[skip:])
    if len(body) < MEM_MIN_WINDOWS:
        return None, (f"memory trend not computed: {len(body)} window(s) of steps with a memory sample "
                      f"after the start, {MEM_MIN_WINDOWS} needed")
    xs = [float(x) for x, _ in body]
    ys = [float(y) for _, y in body]
    fit = theil_sen(xs, ys)
    if fit is None:
        return None, "memory trend not computed: every sample is from the same step"
    slope, intercept = fit
    half = body[len(body) // 2:]
    late = theil_sen([float(x) for x, _ in half], [float(y) for _, y in half]) if len(half) >= 2 else None
    late_slope = late[0] if late else slope
    start = intercept + slope * xs[0]
    end = intercept + slope * xs[-1]
    growth = end - start
    resid = [y - (intercept + slope * x) for x, y in zip(xs, ys)]
    mad = median_of([abs(r - median_of(resid)) for r in resid])
    noise = MAD_TO_SD * mad
    detectable = max(float(MEM_CREEP_FLOOR_BYTES), DETECT_SDS * noise,
                     MEM_CREEP_GROWTH_WARN * max(start, 0.0))
    rising = slope > 0 and late_slope >= MEM_STILL_RISING * slope
    return MemTrend(
        method="theil-sen", windows=len(body), steps=int(xs[-1] - xs[0]),
        start_bytes=int(start), end_bytes=int(end), growth_bytes=int(growth),
        growth_pct=round(100.0 * growth / start, 2) if start > 0 else None,
        slope_bytes_per_step=round(slope, 1), late_slope_bytes_per_step=round(late_slope, 1),
        rising=rising, noise_bytes=int(noise), min_detectable_bytes=int(detectable)), None
