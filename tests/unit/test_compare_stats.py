"""The statistics behind ``traceml compare``: the exact bootstrap against brute-force resampling.

The exact bootstrap of a quantile from a histogram (report/uncertainty.py) claims to be the
bootstrap with infinitely many resamples; here it is checked against actual resampling, and the
binomial tail against a direct sum, on the sizes compare meets (tens to hundreds of thousands of
steps).
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from traceml_core.statistics.sketch import QuantileSketch
from traceml_core.report.compare import histogram
from traceml_core.report.stats import merge_sketches
from traceml_core.report.uncertainty import (binom_sf, block_relative_halfwidth, difference_interval,
                                             drift, quantile_bootstrap)


def _exact_sf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize("n,k,p", [(10, 5, 0.3), (101, 51, 0.5), (300, 150, 0.47), (1000, 520, 0.5),
                                   (25, 1, 0.01), (25, 25, 0.99)])
def test_binomial_tail_matches_the_direct_sum(n, k, p):
    assert binom_sf(k, n, p) == pytest.approx(_exact_sf(k, n, p), rel=1e-7, abs=1e-12)


def test_binomial_tail_for_large_n_is_close_to_exact():
    n = 50_000  # normal approximation above 20,000 steps
    for p in (0.495, 0.5, 0.505):
        exact = sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                             + i * math.log(p) + (n - i) * math.log1p(-p)) for i in range(25_001, n + 1))
        assert binom_sf(25_001, n, p) == pytest.approx(exact, abs=5e-3)


def _sketch_of(values: list[int]) -> dict:
    sk = QuantileSketch()
    sk.add(values)
    return merge_sketches([sk.to_data()])


def test_exact_bootstrap_of_the_median_matches_resampling():
    rng = random.Random(3)
    steps = [int(rng.lognormvariate(math.log(5e6), 0.3)) for _ in range(400)]
    values, counts = histogram(_sketch_of(steps))
    dist = dict(quantile_bootstrap(values, counts, 0.5))
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    population = [v for v, c in zip(values, counts) for _ in range(c)]
    n, trials = len(population), 4000
    seen = Counter(sorted(rng.choices(population, k=n))[(n - 1) // 2] for _ in range(trials))
    for v, p in dist.items():
        if p > 0.02:
            assert seen[v] / trials == pytest.approx(p, abs=0.03), v


def test_difference_interval_covers_zero_for_one_distribution_and_not_for_a_shift():
    rng = random.Random(5)
    a = [int(rng.gauss(5e6, 3e5)) for _ in range(500)]
    b = [int(rng.gauss(5e6, 3e5)) for _ in range(500)]
    c = [int(rng.gauss(5.5e6, 3e5)) for _ in range(500)]
    ha, hb, hc = (histogram(_sketch_of(x)) for x in (a, b, c))
    lo, hi = difference_interval(quantile_bootstrap(*ha, 0.5), quantile_bootstrap(*hb, 0.5))
    assert lo <= 0 <= hi
    lo, hi = difference_interval(quantile_bootstrap(*ha, 0.5), quantile_bootstrap(*hc, 0.5))
    assert 0.3 < lo < 0.5 < hi < 0.7  # ms: the true shift is 0.5 ms


def test_block_spread_and_drift_see_a_run_whose_speed_wanders():
    steady = [10.0 + 0.01 * (i % 3) for i in range(100)]
    wandering = [10.0 + (3.0 if i >= 50 else 0.0) + 0.01 * (i % 3) for i in range(100)]
    assert block_relative_halfwidth(steady) < 0.005
    assert block_relative_halfwidth(wandering) > 0.1
    assert drift(steady) < 0.005
    assert drift(wandering) == pytest.approx(0.3, abs=0.01)
    assert drift([1.0] * 5) is None  # too few buckets to say


def test_an_interval_of_a_time_never_falls_below_minus_100_percent():
    """B about ten times faster than a widely spread A, and both runs wandering over time: an
    interval of the difference widened symmetrically reached -140 %; on the ratio it cannot
    reach -100 % (a time cannot fall by more than all of it), and it still excludes zero."""
    from pathlib import Path

    from traceml_core.report.compare import Run, compare_phase
    from traceml_core.report.uncertainty import ratio_interval, widen_ratio

    rng = random.Random(11)
    a = [int(rng.lognormvariate(math.log(10e6), 1.0)) for _ in range(30)]
    b = [int(rng.lognormvariate(math.log(1e6), 0.05)) for _ in range(30)]

    def run(label, steps):
        return Run(label, Path("x"), {"compare": {"sketches": {"step": _sketch_of(steps)}}})

    pc = compare_phase("step", run("A", a), run("B", b), floor_pct=3.0, block_hw=(0.5, 0.5))
    lo, hi = pc.interval_pct
    assert -100.0 < lo < hi < 0.0, pc
    assert pc.verdict == "faster"
    # the ratio interval itself brackets the point ratio and stays positive however wide
    ha, hb = histogram(_sketch_of(a)), histogram(_sketch_of(b))
    rlo, rhi = ratio_interval(quantile_bootstrap(*ha, 0.5), quantile_bootstrap(*hb, 0.5))
    r = pc.b_ms / pc.a_ms
    assert 0.0 < rlo <= r <= rhi
    wlo, whi = widen_ratio(rlo, rhi, r, (5.0, 5.0))
    assert 0.0 < wlo < rlo and whi > rhi
