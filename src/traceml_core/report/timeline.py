"""The run over time: per rank, per step bucket; per node, per time bucket (the summary's ``timeline``).

Built from the aggregator's bounded series (:mod:`traceml_core.statistics.series`: at most
:data:`~traceml_core.statistics.series.BUCKETS` buckets per rank, and per node over time), so its
size never grows with the run's length. Every rank is regrouped to the coarsest rank's bucket
width, so bucket ``i`` covers the same steps (record indices ``[i*W, (i+1)*W)``) on every rank.

Its size is bounded in ranks too: up to :data:`RANK_LINES` ranks each get their own series; a
larger run keeps :data:`FEATURED_RANKS` of them (the verdict's culprit, the ranks whose own time
is highest and lowest, ranks that did not end cleanly, rank 0) and, over all ranks, the minimum,
median and maximum per bucket of the step time and the own time (``envelope``). So the summary
holds at most ``64 x 12 x 256`` numbers of series however large and long the run.

A rank's *own* time per bucket is :func:`~.verdicts.own_time` of the bucket's means: its step
minus the phases in which it waits for the others, plus the time outside ``trace_step``. Under
DDP every rank's step time is the same (the slowest sets the pace), so the straggler shows in
its own time, never in its step time.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..statistics.series import BUCKETS, OUTSIDE, regroup, series_phases, series_values
from ..rundata import RankData, RunData, SystemData
from .document import Envelope, GpuSeries, NodeSeries, RankSeries, Timeline, Verdict
from .model import RankSummary
from .status import OK_ENDINGS
from .verdicts import WAIT_PHASES, own_time
from .windows import means, phase_col

#: ranks drawn one by one in the summary/report; beyond that, a selection plus the envelope
RANK_LINES = 64
#: ranks kept one by one when the run has more than RANK_LINES
FEATURED_RANKS = 16
NS_PER_MS = 1e6


def _means(sums: list, cnts: list, n: int) -> list[Optional[float]]:
    return means(sums, cnts, n, digits=4)


def rank_series(r: RankData, width: int, n: int, started_at: float) -> RankSeries:
    """One rank's series at bucket width ``width`` (a multiple of its own), ``n`` buckets long."""
    s = r.series
    f = max(1, width // max(1, int(s["width"])))
    scnt = regroup(series_values(s, "step_cnt"), f, "sum")
    step = _means(regroup(series_values(s, "step_sum"), f, "sum"), scnt, n)
    smax = [None if m < 0 else round(m / NS_PER_MS, 4)
            for m in regroup(series_values(s, "step_max"), f, "max")]
    mem = [None if m < 0 else m for m in regroup(series_values(s, "mem_max"), f, "max")]
    t_end = [None if t < 0 else round(t / 1e9 - started_at, 3)
             for t in regroup(series_values(s, "t_end"), f, "max")]
    phases: dict[str, list[Optional[float]]] = {}
    for col in series_phases(s):
        cnt = regroup(series_values(s, "phase_cnt", col), f, "sum")
        if any(cnt):
            phases[phase_col(col)] = _means(regroup(series_values(s, "phase_sum", col), f, "sum"),
                                             cnt, n)
    own = []
    for i, st in enumerate(step):
        v = own_time(st, lambda p: phases[p][i] if p in phases else None)
        own.append(None if v is None else round(v, 4))
    pad = [None] * max(0, n - len(smax))
    return RankSeries(rank=r.rank, node=r.node, host=r.host or "", step_ms=step,
                      step_max_ms=smax + pad, own_ms=own, phases_ms=phases,
                      mem_max_bytes=mem + pad if any(m is not None for m in mem) else None,
                      t_s=t_end + pad)


def _step_and_own(r: RankData, width: int, n: int) -> tuple[list, list]:
    """Mean step and own time per bucket (ms, unrounded), from the step, wait phases and outside
    sums alone: what the envelope of a large run needs."""
    s = r.series
    f = max(1, width // max(1, int(s["width"])))

    def means(key: str, phase: Optional[str] = None) -> list[Optional[float]]:
        cnt = regroup(series_values(s, key.replace("sum", "cnt"), phase), f, "sum")
        tot = regroup(series_values(s, key, phase), f, "sum")
        out = [t / c / NS_PER_MS if c else None for t, c in zip(tot, cnt)]
        return out + [None] * (n - len(out))

    step = means("step_sum")
    cols = {p: means("phase_sum", c) for p, c in (("outside", OUTSIDE), *((w, w + "_ns") for w in WAIT_PHASES))}
    own = [None if st is None else own_time(st, lambda p: cols[p][i] if p in cols else None)
           for i, st in enumerate(step)]
    return step, own


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _featured(ranks: list[RankData], summary_ranks: Sequence[RankSummary],
              verdict: Optional[Verdict], own_mean: dict[int, Optional[float]]) -> list[int]:
    """The ranks worth a line of their own in a large run, most interesting first."""
    picked: list[int] = []

    def take(rank: Optional[int]) -> None:
        if rank is not None and rank in own_mean and rank not in picked:
            picked.append(rank)

    take(((verdict.culprit if verdict else None) or {}).get("rank"))
    for r in summary_ranks:
        if r.status not in OK_ENDINGS and r.status != "never_joined":
            take(r.rank)
    by_own = sorted((v, k) for k, v in own_mean.items() if v is not None)
    for _v, k in reversed(by_own[-6:]):
        take(k)
    for _v, k in by_own[:3]:
        take(k)
    take(0)
    for r in ranks:  # fill up in rank order
        if len(picked) >= FEATURED_RANKS:
            break
        take(r.rank)
    return picked[:FEATURED_RANKS]


def _envelope(series: list[list[Optional[float]]], n: int) -> dict[str, list[Optional[float]]]:
    """Per bucket, the least, median and most of the ranks' values."""
    lo, mid, hi = [], [], []
    for i in range(n):
        col = sorted(v[i] for v in series if v[i] is not None)
        if not col:
            lo.append(None), mid.append(None), hi.append(None)
            continue
        k = len(col)
        lo.append(col[0])
        hi.append(col[-1])
        mid.append(col[k // 2] if k % 2 else round((col[k // 2 - 1] + col[k // 2]) / 2, 4))
    return {"min": lo, "median": mid, "max": hi}


def _node(ns: SystemData, started_at: float) -> Optional[NodeSeries]:
    ot = ns.over_time
    u = ot.used
    if not u or ot.t0 is None:
        return None
    w = ot.width_s
    mean, mx = ot.mean, ot.max
    gpus = [GpuSeries(index=g.index, util_pct=mean.get(f"gpu{g.index}.util_pct"),
                      mem_used_bytes=mx.get(f"gpu{g.index}.mem_used"), mem_total_bytes=g.mem_total.max)
            for g in ns.gpus]
    return NodeSeries(node=ns.node, host=ns.host or "", seconds_per_bucket=w,
                      t_s=[round(ot.t0 + (i + 0.5) * w - started_at, 2) for i in range(u)],
                      cpu_pct=mean.get("cpu_pct"), ram_used_bytes=mx.get("ram_used"),
                      ram_total_bytes=ns.ram_total.max, gpus=gpus)


def build_timeline(data: RunData, summary_ranks: Sequence[RankSummary],
                   verdict: Optional[Verdict], *, rank_lines: int = RANK_LINES) -> Timeline:
    """The ``timeline`` section from the run's typed data."""
    started = float(data.settings.started_at)
    ranks = [r for r in data.ranks if r.series.get("used")]
    width = max((int(r.series["width"]) for r in ranks), default=1)
    n = max((-(-int(r.series["used"]) * int(r.series["width"]) // width) for r in ranks),
            default=0)
    envelope = None
    total = len(ranks)
    if len(ranks) > rank_lines:
        # a large run: the step and own time of every rank for the envelope (the cheap part),
        # every series only for the ranks drawn one by one
        light = {r.rank: _step_and_own(r, width, n) for r in ranks}
        own_mean = {k: _mean(v[1]) for k, v in light.items()}
        keep = set(_featured(ranks, summary_ranks, verdict, own_mean))
        envelope = Envelope(ranks=len(light), step_ms=_envelope([v[0] for v in light.values()], n),
                            own_ms=_envelope([v[1] for v in light.values()], n))
        ranks = [r for r in ranks if r.rank in keep]
    per = {r.rank: rank_series(r, width, n, started) for r in ranks}
    shown = sorted(per)
    phases = []
    for v in per.values():
        for p in v.phases_ms:
            if p not in phases:
                phases.append(p)
    order = [p for p in ("input", "forward", "backward", "optimizer", "h2d", OUTSIDE) if p in phases]
    nodes = [x for x in (_node(ns, started) for ns in data.system) if x is not None]
    return Timeline(steps_per_bucket=width, buckets=n, bucket_limit=BUCKETS, rank_limit=rank_lines,
                    ranks_total=total, ranks_shown="all" if envelope is None else "selected",
                    phases=order + [p for p in phases if p not in order],
                    ranks=[per[k] for k in shown], envelope=envelope, nodes=nodes)


__all__ = ["build_timeline", "rank_series", "RANK_LINES", "FEATURED_RANKS"]
