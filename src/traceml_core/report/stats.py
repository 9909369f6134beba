"""Small statistics over typed run data: medians, merged series, memory trend, sketches.

Everything here reads :class:`~traceml_core.rundata.RunData` parts (the live summary and a summary
rebuilt from a checkpoint share them), and the sketches and series in the statistics' own
serialised form. Cost is proportional to ranks x buckets, never to the number of steps.
"""

from __future__ import annotations

from array import array
from typing import Any, Optional, Sequence

from ..statistics.series import step_across
from ..statistics.sketch import merge_serialised as merge_sketches  # noqa: F401  (the summary's name)
from ..statistics.sketch import quantiles_of
from ..rundata import PhaseData, RankData

NS_PER_MS = 1_000_000.0


def median(values: Sequence[float]) -> Optional[float]:
    vals = sorted(values)
    if not vals:
        return None
    mid = len(vals) // 2
    return float(vals[mid]) if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def ms(ns: Optional[float], digits: int = 4) -> Optional[float]:
    return None if ns is None else round(ns / NS_PER_MS, digits)


def sketch_counts(sk: dict[str, Any]) -> array:
    counts = array("Q")
    counts.frombytes(sk["counts"])
    return counts


def phase_quantiles(ph: PhaseData, qs: Sequence[float]) -> list[Optional[float]]:
    """Quantiles (ns) of one rank's phase, clamped to the exact maximum."""
    sk = ph.sketch
    est = quantiles_of(sk["lo"], sketch_counts(sk), sk["zero"], qs)
    mx = ph.max
    return [None if v is None else float(min(v, mx)) if mx >= 0 else v for v in est]


def step_time(merged_step: dict[str, Any]) -> dict[str, Any]:
    """THE median step of a run, and its spread: quantiles of every recorded step of every rank
    (the merged step-time histogram, which ``traceml compare`` reads too), in ms. This is the one
    number the summary, its verdicts, ``compare`` and the report call "the median step"; means
    (which the verdicts' shares of time are built from) are always called means."""
    n = int(merged_step.get("zero", 0)) + sum(merged_step.get("counts") or [])
    p50, p90, p99 = merged_quantiles(merged_step, (0.5, 0.9, 0.99))
    # (``steps`` here counts the histogram; the summary replaces it with the exact record count)
    return {"median_ms": ms(p50), "p90_ms": ms(p90), "p99_ms": ms(p99), "steps": n}


def merged_quantiles(merged: dict[str, Any], qs: Sequence[float]) -> list[Optional[float]]:
    return quantiles_of(merged["lo"], merged["counts"], merged["zero"], qs)


def merged_series(ranks: Sequence[RankData]) -> dict[str, Any]:
    """Step time per series bucket over all ranks: mean and worst, at the coarsest rank width."""
    width, tot_sum, tot_cnt, tot_max = step_across([r.series for r in ranks])
    return {
        "steps_per_bucket": width,
        "mean_ms": [ms(t / c) if c else None for t, c in zip(tot_sum, tot_cnt)],
        "max_ms": [ms(m) if m >= 0 else None for m in tot_max],
    }
