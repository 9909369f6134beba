"""How sure we are about a change in step time: intervals from the serialised distributions.

``traceml compare`` sees each run only through its summary: per phase one histogram of every
step (the merged quantile sketch) and, for the whole step, a series of bucket means over the run.
Two sources of uncertainty are estimated from them and the wider one is used:

* **sampling**: the exact bootstrap of a quantile from a histogram. Resampling ``n`` steps with
  replacement from the histogram and taking the sample quantile has a closed-form distribution:
  the ``k``-th order statistic is at most ``v`` exactly when at least ``k`` of the ``n`` draws are,
  so ``P(stat <= v) = P(Binomial(n, F(v)) >= k)``. That is the bootstrap with infinitely many
  resamples, deterministic and cheap (one binomial tail per histogram bucket);
* **time structure**: steps are not independent (a slow minute, a noisy neighbour, thermal
  throttling), which the per-step bootstrap ignores. Bucket means of the step series (each a run
  of consecutive steps) are resampled instead (a block bootstrap with a fixed seed), so a run whose
  speed wanders gets a wider interval.

On top of that, :func:`drift` measures how much a run's own median moves between its first and
second half; a change between two runs smaller than that is not evidence of anything.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from itertools import accumulate
from typing import Optional, Sequence

#: probability mass below which a bucket of a bootstrap distribution is dropped
_EPS = 1e-12
#: above this many steps the binomial tail uses the normal approximation (error ~1/sqrt(n))
_EXACT_MAX_N = 20_000
#: resamples of the block bootstrap (fixed seed: the same inputs always give the same interval)
BLOCK_RESAMPLES = 1000


# --- binomial tails -------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 20_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-13:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) >= k)``."""
    if k <= 0 or p >= 1.0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    sd = math.sqrt(n * p * (1.0 - p))
    z = (k - 0.5 - n * p) / sd
    if z > 12.0:
        return 0.0
    if z < -12.0:
        return 1.0
    if n > _EXACT_MAX_N:
        return 0.5 * math.erfc(z / math.sqrt(2.0))
    return betainc(k, n - k + 1, p)


# --- the exact bootstrap of a quantile --------------------------------------------------------------
def quantile_bootstrap(values: Sequence[float], counts: Sequence[int], q: float) -> list[tuple[float, float]]:
    """Distribution ``[(value, probability)]`` of the sample ``q``-quantile of ``n`` steps drawn
    with replacement from a histogram (``values`` ascending, ``counts`` per value).

    The sample quantile is the order statistic of 0-based rank ``int(q * (n - 1))``, the same
    definition the summary's quantiles use.
    """
    n = int(sum(counts))
    if n <= 0:
        return []
    k = int(q * (n - 1)) + 1  # 1-based order statistic
    out: list[tuple[float, float]] = []
    prev = 0.0
    for v, cum in zip(values, accumulate(counts)):
        g = binom_sf(k, n, cum / n)
        p = g - prev
        prev = g
        if p > _EPS:
            out.append((float(v), p))
    return out


def _dist_quantiles(pairs: list[tuple[float, float]], qs: Sequence[float]) -> list[float]:
    pairs = sorted(pairs)
    total = sum(p for _, p in pairs)
    cum = list(accumulate(p for _, p in pairs))
    out = []
    for q in qs:
        i = bisect_left(cum, q * total)
        out.append(pairs[min(i, len(pairs) - 1)][0])
    return out


def _trim(dist: list[tuple[float, float]], keep: int = 400) -> list[tuple[float, float]]:
    """The ``keep`` most probable points (the tails beyond them carry negligible mass)."""
    if len(dist) <= keep:
        return dist
    return sorted(sorted(dist, key=lambda vp: -vp[1])[:keep])


def difference_interval(a: list[tuple[float, float]], b: list[tuple[float, float]],
                        level: float = 0.95) -> tuple[float, float]:
    """Interval of ``stat_B - stat_A`` for independent bootstrap distributions ``a`` and ``b``."""
    a, b = _trim(a), _trim(b)
    pairs = [(vb - va, pa * pb) for va, pa in a for vb, pb in b]
    tail = (1.0 - level) / 2.0
    lo, hi = _dist_quantiles(pairs, (tail, 1.0 - tail))
    return lo, hi


def ratio_interval(a: list[tuple[float, float]], b: list[tuple[float, float]],
                   level: float = 0.95) -> Optional[tuple[float, float]]:
    """Interval of ``stat_B / stat_A`` for independent bootstrap distributions ``a`` and ``b``.

    A time cannot fall by more than all of it: an interval of the *difference* widened
    symmetrically can reach below -100 % of A (a 95 % interval of [-140 %, -28 %]), one of the
    *ratio* cannot go below 0 (the ratio of two positive times), whatever the spread. None when
    A's distribution has no positive value (a ratio to zero is no figure)."""
    a = [(va, pa) for va, pa in _trim(a) if va > 0]
    b = _trim(b)
    if not a or not b:
        return None
    pairs = [(vb / va, pa * pb) for va, pa in a for vb, pb in b]
    tail = (1.0 - level) / 2.0
    lo, hi = _dist_quantiles(pairs, (tail, 1.0 - tail))
    return lo, hi


def widen_ratio(lo: float, hi: float, ratio: float, rel_halfwidths: Sequence[float]) -> tuple[float, float]:
    """The ratio interval ``[lo, hi]`` widened, where wider, by the runs' relative spread over
    time (each a relative half-width of one run's median, see :func:`block_relative_halfwidth`),
    combined on the log scale: ``ratio * exp(+-sqrt(sum(log(1 + h)^2)))``, which stays above 0."""
    if not rel_halfwidths or ratio <= 0:
        return lo, hi
    half = math.sqrt(sum(math.log1p(max(0.0, h)) ** 2 for h in rel_halfwidths))
    return min(lo, ratio * math.exp(-half)), max(hi, ratio * math.exp(half))


# --- the block bootstrap over the step series -----------------------------------------------------
def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2.0


def block_relative_halfwidth(blocks: Sequence[float], level: float = 0.95,
                             resamples: int = BLOCK_RESAMPLES) -> Optional[float]:
    """Half-width of the interval of the median of ``blocks`` (bucket means), relative to that
    median; None with fewer than 8 blocks (too few to say anything)."""
    xs = [x for x in blocks if x is not None and x > 0]
    if len(xs) < 8:
        return None
    mid = _median(xs)
    if mid <= 0:
        return None
    rng = random.Random(0x7ACE)
    n = len(xs)
    choices = rng.choices
    meds = sorted(_median(choices(xs, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = meds[int(tail * (resamples - 1))]
    hi = meds[int((1.0 - tail) * (resamples - 1))]
    return (hi - lo) / 2.0 / mid


def drift(blocks: Sequence[float]) -> Optional[float]:
    """``|median(second half) / median(first half) - 1|`` of a run's bucket means: how much the
    run's own speed moved while nothing changed; None with fewer than 8 buckets."""
    xs = [x for x in blocks if x is not None and x > 0]
    if len(xs) < 8:
        return None
    half = len(xs) // 2
    first, second = _median(xs[:half]), _median(xs[half:])
    return abs(second / first - 1.0) if first > 0 else None
