"""The slowest rank and what its excess is made of: the one analysis the straggler, work-imbalance
and CPU-contention rules share (each reads it; none reads another's finding).

Under DDP every rank's *step* time is the same (all ranks wait for the slowest in the gradient
all-reduce), so step time cannot name the culprit. A rank's *own* time can: ``step - comm +
outside`` where communication is measured, else ``step - backward + outside`` (the wait hides in
backward). The slowest rank's **excess** is its own time over the median of the *other* ranks
(with two ranks, the median of both would sit half-way and halve it). Without synchronisation
(independent ranks) own and step time agree anyway; the step metric is tried second.

What is judged (:attr:`Slowest.judged`) is the excess the rank shows *through* the run, beyond its
noise: the least of the mean excess, the excess in at least half of the run's stretches of
steps, and the mean less two standard errors of the stretches' scatter about their trend
(thresholds: STRAGGLER_PERSISTENT_QUANTILE, STRAGGLER_CONFIDENCE_SE); one long pause is taken out
first (:func:`one_pause`). Then what the excess is made of, each measured:

* **more work**: the rank's batches (samples, elements) against the others' (sdk/work
  measurement, or the script's ``declare_work``), and its training thread's CPU time per step;
* **a wait for a core**: its run-queue wait per step beyond what its own CPU time would cost at
  the other ranks' wait per CPU second (a rank that computes more waits more, at the same rate:
  that wait is part of its work);
* **where**: the phases that hold the excess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .. import thresholds as T
from ..model import CpuThreads, RankSummary
from ..stats import median
from .base import IN, OWN_PHASES, Run, iteration, mean_ms, own, own_time, quantile, severity

#: what the slowest rank's excess is made of (:func:`assess`)
WORK, CPU_WORK, CONTENTION, SLOW_CORE, WAIT = "work", "cpu_work", "contention", "slow_core", "wait"
#: the parts of a sampled step's CPU time compared between ranks (``rest``: the iteration's CPU
#: time outside the three: input made in the rank's process, no phase, between steps)
PARTS = ("forward", "backward", "optimizer", "rest")


@dataclass
class Work:
    """The slowest rank's work per step against the other ranks' median: its batches (measured
    or declared), its training thread's CPU time, its wait for a core per CPU second."""

    #: ``samples``, ``elements``, ``tokens`` (measured), ``declared samples``, ``declared
    #: tokens``; None where no batch was measured on every rank
    basis: Optional[str] = None
    mine: Optional[float] = None
    theirs: Optional[float] = None
    #: the samples per step beside an ``elements``/``tokens`` basis (the same batch, longer rows)
    samples: Optional[float] = None
    #: the training thread's CPU time per step (ms), its and the others' median
    cpu: Optional[float] = None
    cpu_theirs: Optional[float] = None
    #: its extra CPU time per phase (ms per sampled step) over the others' median
    phase_cpu: dict[str, float] = field(default_factory=dict)
    #: its wait for a core per ms of CPU, and the others' median
    rate: Optional[float] = None
    rate_theirs: Optional[float] = None
    #: whether another rank ran on its node (then a slower CPU is not why it uses more CPU time)
    shares_node: bool = False
    #: its CPU time per part of a sampled step over the others' median (parts of at least a tenth
    #: of their step's CPU time), and whether its extra CPU time is spread alike over them (its
    #: core ran slower) or not (work of its own where it grew); None: not measured
    part_ratios: dict[str, float] = field(default_factory=dict)
    uniform: Optional[bool] = None
    #: its time per step off the CPU and not waiting for a core nor for the other ranks (a sleep,
    #: storage, a device, a lock: wall clock less communication, CPU time and run-queue wait), and
    #: the others' median (ms; None where not measured)
    blocked: Optional[float] = None
    blocked_theirs: Optional[float] = None

    @property
    def blocked_excess(self) -> Optional[float]:
        if self.blocked is None or self.blocked_theirs is None:
            return None
        return self.blocked - self.blocked_theirs

    @property
    def ratio(self) -> Optional[float]:
        return self.mine / self.theirs if self.mine is not None and self.theirs else None

    @property
    def cpu_ratio(self) -> Optional[float]:
        return self.cpu / self.cpu_theirs if self.cpu is not None and self.cpu_theirs else None

    @property
    def cpu_excess(self) -> Optional[float]:
        return self.cpu - self.cpu_theirs if self.cpu is not None and self.cpu_theirs is not None else None

    @property
    def cpu_wall(self) -> Optional[float]:
        """The wall time its extra CPU time takes on this CPU (ms per step): the CPU time, and the
        wait for a core that comes with it at the other ranks' wait per CPU second (on a CPU
        shared with others every ms of work waits about that long too)."""
        extra = self.cpu_excess
        if extra is None:
            return None
        return extra * (1.0 + (self.rate_theirs or 0.0))


@dataclass
class Slowest:
    """The slowest rank by one metric, its excess and what it is made of."""

    rank: RankSummary
    others: list[RankSummary]
    #: ``own`` or ``step``
    metric: str
    #: mean excess (ms per step), after a one-off pause was taken out
    excess: float
    #: what is judged: the least of the mean, persistent and lower-bound excess
    judged: float
    persistent: Optional[float]
    lower: Optional[float]
    windows: int
    slower: Optional[float]
    #: one pause taken out of the excess (ms), or None
    pause: Optional[float]
    #: the extra wait for a core beyond its own CPU time at the others' rate (ms per step), or
    #: None where not measured on every rank
    starved: Optional[float]
    #: its cgroup's CPU quota's part of its wait (ms per step)
    quota: float
    #: excess per phase over the others' median (ms per step)
    deltas: dict[str, float] = field(default_factory=dict)
    #: its work against the others' (:func:`work_of`)
    work: Work = field(default_factory=Work)
    #: what the excess is made of: WORK, CPU_WORK, CONTENTION or WAIT (:func:`assess`)
    cause: str = WAIT
    #: the excess its cause is judged on (ms per step): the judged excess, less a wait for a core
    #: beyond its share where that is not the cause
    weighed: float = 0.0

    @property
    def phase(self) -> str:
        return max(self.deltas, key=lambda p: self.deltas[p]) if self.deltas else "step"

    @property
    def phase_share(self) -> float:
        return self.deltas.get(self.phase, 0.0) / self.excess if self.excess > 0 else 0.0



def persistent_excess(run: Run, worst: RankSummary, others: Sequence[RankSummary],
                      metric: str) -> tuple[Optional[float], Optional[float], int, Optional[float]]:
    """(the excess the worst rank shows in at least half of the run's stretches of steps, the
    lower confidence bound of its mean excess over them, the stretches judged, the share of
    stretches in which it is slower): its excess per window of steady steps over the other
    ranks' median, windows joined into stretches of at least ``STRAGGLER_STRETCH_STEPS`` steps
    (one step's scheduling noise on a busy machine is tens of milliseconds; a stretch's mean is
    steadier)."""
    ctx = run.ctx
    ww = ctx.windows.get(worst.rank)
    ow = [ctx.windows[r.rank] for r in others if r.rank in ctx.windows]
    if ww is None or not ow:
        return None, None, 0, None

    def value(w: Any, i: int) -> Optional[float]:
        step = w.step_ms[i] if i < len(w.step_ms) else None
        if metric == "step":
            return step
        return own_time(step, lambda p: w.phase(p, i))

    per = max(1, -(-T.STRAGGLER_STRETCH_STEPS // max(1, ww.width)))  # windows per stretch
    diffs: list[float] = []
    acc, steps = 0.0, 0
    for i in range(len(ww)):
        if not ww.steady(i):
            continue
        mine = value(ww, i)
        theirs = [v for v in (value(w, i) for w in ow if i < len(w) and w.steady(i)) if v is not None]
        if mine is None or not theirs:
            continue
        n = ww.steps[i]
        acc += (mine - (median(theirs) or 0.0)) * n
        steps += n
        if steps >= per * ww.width:
            diffs.append(acc / steps)
            acc, steps = 0.0, 0
    if steps >= ww.width * per / 2:  # a last stretch of at least half the length counts
        diffs.append(acc / steps)
    if len(diffs) < T.STRAGGLER_MIN_WINDOWS:
        return None, None, len(diffs), None
    return (quantile(diffs, T.STRAGGLER_PERSISTENT_QUANTILE), lower_bound(diffs), len(diffs),
            sum(1 for d in diffs if d > 0) / len(diffs))


def lower_bound(diffs: Sequence[float]) -> float:
    """The lower confidence bound of a rank's mean excess over its stretches of steps: the mean
    less ``STRAGGLER_CONFIDENCE_SE`` standard errors, the noise taken as the robust scatter of
    the stretches about their own trend (a Theil-Sen line over the run: a rank whose excess grows,
    as with memory that it scans, is not noisy, it is trending). Two ranks of a machine shared with
    other jobs differ from stretch to stretch by tens of milliseconds either way: an excess that
    noise can explain is not judged a straggler."""
    from ..trend import theil_sen

    n = len(diffs)
    fit = theil_sen([float(i) for i in range(n)], list(diffs))
    slope, icpt = fit if fit is not None else (0.0, median(diffs) or 0.0)
    resid = [d - (icpt + slope * i) for i, d in enumerate(diffs)]
    mid = median(resid) or 0.0
    spread = 1.4826 * (median([abs(r - mid) for r in resid]) or 0.0)
    return sum(diffs) / n - T.STRAGGLER_CONFIDENCE_SE * spread / n ** 0.5


def quota_wait(f: CpuThreads) -> float:
    """The part of a rank's wait for a core (ms per step) that its cgroup's CPU quota caused: a
    throttled thread stays runnable, so the run queue counts it, but the limit is the task's own
    (its node's, its allocation's), not other processes': it stays in the rank's own time. At most
    the time the cgroup was throttled (a cgroup-wide counter, for all its threads and CPUs), at
    most the wait."""
    if f.wait_ms is None or not f.throttled_ms:
        return 0.0
    return min(f.wait_ms, f.throttled_ms)


def queue_wait(f: CpuThreads) -> float:
    """A rank's wait for a core (ms per step) less what its own CPU quota caused: other processes'."""
    return (f.wait_ms or 0.0) - quota_wait(f)


def starved(run: Run, worst: RankSummary, others: Sequence[RankSummary]) -> Optional[float]:
    """How much longer per step ``worst`` waited for a CPU core than its own CPU time explains
    (ms; None when not measured on every rank). On a shared CPU every rank waits in proportion to
    the CPU time it asks for; at the other ranks' rate (their median wait per ms on a CPU), the
    wait beyond what its own CPU time would have cost is the rank being starved more than the
    others (another process on its cores), not work of its own: that part of its excess is
    taken out. A rank that does more work waits more too, but at the same rate: none of that is
    taken out."""
    facts = {r.rank: run.cpu(r.rank) for r in [worst, *others]}
    if any(f is None or f.wait_ms is None or f.run_ms is None for f in facts.values()):
        return None
    rates = [queue_wait(f) / f.run_ms for r in others for f in [facts[r.rank]] if f is not None and f.run_ms]
    if not rates:
        return None
    mine = facts[worst.rank]
    assert mine is not None and mine.wait_ms is not None and mine.run_ms is not None
    return queue_wait(mine) - mine.run_ms * (median(rates) or 0.0)


def _max(r: RankSummary, phase: str) -> Optional[float]:
    ph = r.phases.get(phase)
    return ph.max_ms if ph else None


def one_pause(worst: RankSummary, live: Sequence[RankSummary], metric: str) -> Optional[float]:
    """A pause is not a straggler: the length (ms) of one long step that accounts for part of
    ``worst``'s excess, or None. A rank stopped once (SIGSTOP, a debugger, a save on that rank
    only) makes every other rank wait once, for the whole pause, in the step's synchronisation
    (``comm``, else ``backward``: the wait :func:`own_time` takes out), while its own wait there
    stays short; so the others' longest wait exceeds the rank's own by the pause. A rank slower
    at every step makes the others wait a little at every step (their longest wait is about one
    step's excess), and a slow first step on every rank (compilation) is long for the rank too,
    so neither looks like a pause. For the ``step`` metric the pause is the rank's own longest
    step beyond the others'. The caller takes the pause out of the rank's excess and judges the
    rest (report/thresholds.py: PAUSE_MIN_STEPS)."""
    others = [r for r in live if r is not worst]
    if metric == "own":
        def wait_max(r: RankSummary) -> Optional[float]:
            return _max(r, "comm") if r.phases.get("comm") else _max(r, "backward")
        theirs = [v for v in map(wait_max, others) if v is not None]
        mine = wait_max(worst)
        pause = (median(theirs) or 0.0) - mine if theirs and mine is not None else 0.0
    else:
        theirs = [v for v in (_max(r, "step") for r in others) if v is not None]
        mine = _max(worst, "step")
        pause = mine - (median(theirs) or 0.0) if theirs and mine is not None else 0.0
    step = median([v for v in (mean_ms(r, "step") for r in live) if v is not None]) or 0.0
    return pause if step > 0 and pause >= T.PAUSE_MIN_STEPS * step else None


def _batch(run: Run, worst: RankSummary, others: Sequence[RankSummary]) -> tuple[Optional[str], Optional[float], Optional[float], Optional[float]]:
    """(basis, its work per step, the others' median, its samples) from what every rank declared
    (``declare_work``: it overrides what was measured), else from the batches measured on sampled
    steps: samples where they differ, else elements (tokens for integer ids: longer sequences)."""
    ranks = [worst, *others]
    decl = [run.ctx.declared.get(r.rank) for r in ranks]
    for key, basis in (("tokens_per_step", "declared tokens"), ("samples_per_step", "declared samples")):
        vals = [getattr(d, key, None) for d in decl]
        if all(v for v in vals):
            return basis, vals[0], median(vals[1:]), None
    works = [f.work if f is not None else None for f in (run.cpu(r.rank) for r in ranks)]
    if any(w is None or not w.samples for w in works):
        return None, None, None, None
    samples = [w.samples for w in works if w is not None]
    theirs = median(samples[1:]) or 0.0
    if theirs and samples[0] / theirs >= T.WORK_RATIO_MIN:
        return "samples", samples[0], theirs, samples[0]
    elems = [w.tokens or w.elements for w in works if w is not None]
    if all(elems):
        basis = "tokens" if all(w.tokens for w in works if w is not None) else "elements"
        return basis, elems[0], median(elems[1:]), samples[0]
    return "samples", samples[0], theirs, samples[0]


def most_work(run: Run) -> Optional[tuple[RankSummary, float]]:
    """The rank whose batches (measured or declared) are biggest against the other ranks'
    median, and that ratio, where it is at least WORK_RATIO_MIN; None otherwise."""
    live = run.live
    best = None
    for r in live:
        others = [o for o in live if o is not r]
        basis, mine, theirs, _ = _batch(run, r, others)
        if basis is None or mine is None or not theirs:
            continue
        ratio = mine / theirs
        if ratio >= T.WORK_RATIO_MIN and (best is None or ratio > best[1]):
            best = (r, ratio)
    return best


def work_of(run: Run, worst: RankSummary, others: Sequence[RankSummary]) -> Work:
    """The slowest rank's work per step against the others' median (see :class:`Work`)."""
    basis, mine, theirs, samples = _batch(run, worst, others)
    w = Work(basis=basis, mine=mine, theirs=theirs, samples=samples,
             shares_node=any(r.node == worst.node for r in others))
    facts = [run.cpu(r.rank) for r in [worst, *others]]
    me = facts[0]
    if me is not None and me.run_ms is not None:
        theirs_cpu = [f.run_ms for f in facts[1:] if f is not None and f.run_ms is not None]
        if len(theirs_cpu) == len(others):
            w.cpu, w.cpu_theirs = me.run_ms, median(theirs_cpu)
        rates = [queue_wait(f) / f.run_ms for f in facts[1:] if f is not None and f.wait_ms is not None and f.run_ms]
        if me.wait_ms is not None and me.run_ms and len(rates) == len(others):
            w.rate, w.rate_theirs = queue_wait(me) / me.run_ms, median(rates)
    if me is not None and me.work is not None:
        for p in ("forward", "backward", "optimizer"):
            mine_p = me.work.phase_cpu(p)
            theirs_p = [f.work.phase_cpu(p) for f in facts[1:] if f is not None and f.work is not None]
            theirs_p = [v for v in theirs_p if v is not None]
            if mine_p is not None and theirs_p:
                w.phase_cpu[p] = round(mine_p - (median(theirs_p) or 0.0), 2)
    _uniformity(w, [f.work if f is not None else None for f in facts])
    mine_b, theirs_b = blocked(run, worst), [blocked(run, r) for r in others]
    if mine_b is not None and all(b is not None for b in theirs_b):
        w.blocked, w.blocked_theirs = mine_b, median([b for b in theirs_b if b is not None])
    return w


def blocked(run: Run, r: RankSummary) -> Optional[float]:
    """A rank's time per steady step off the CPU and not waiting for a core nor for the other
    ranks: its wall clock per step (step and between steps) less its measured communication, its
    training thread's CPU time and its wait for a core (ms; None where one is not measured). A
    rank that sleeps, reads storage, waits for its device or a lock has it; one that computes more
    or waits for a core does not."""
    f = run.cpu(r.rank)
    it, comm = iteration(r), mean_ms(r, "comm")
    if f is None or f.run_ms is None or f.wait_ms is None or it is None or comm is None:
        return None
    return it - comm - f.run_ms - f.wait_ms


def _parts(work: Any) -> Optional[dict[str, float]]:
    if work is None or work.cpu_ms is None:
        return None
    out = {p: work.phase_cpu(p) or 0.0 for p in PARTS[:3]}
    out["rest"] = max(0.0, work.cpu_ms - sum(out.values()))
    return out


def _uniformity(w: Work, works: Sequence[Any]) -> None:
    """Whether the slowest rank's extra CPU time per sampled step is spread alike over the parts
    of its step (forward, backward, the optimizer, the rest): a core that runs slower makes the
    same work take longer everywhere; work of its own adds CPU time where it is."""
    mine, theirs = _parts(works[0]), [_parts(x) for x in works[1:]]
    if mine is None or not theirs or any(t is None for t in theirs):
        return
    total_me = sum(mine.values())
    total_them = median([sum(t.values()) for t in theirs if t is not None]) or 0.0
    if total_them <= 0 or total_me <= total_them:
        return
    ratios = {}
    for p in PARTS:
        th = median([t[p] for t in theirs if t is not None]) or 0.0
        if th >= 0.1 * total_them:
            ratios[p] = round(mine[p] / th, 3)
    if not ratios:
        return
    w.part_ratios = ratios
    grew = total_me / total_them - 1.0
    w.uniform = min(ratios.values()) - 1.0 >= T.CPU_UNIFORM * grew


def _cause(run: Run, s: Slowest) -> tuple[str, float]:
    """What the excess is made of, and the excess that cause is judged on:

    * WORK: its batches are bigger (measured or declared), by enough to account for at least
      half of the excess (its others' own time scaled by the ratio);
    * WAIT, measured: at least half of the excess is time off the CPU and not waiting for a core
      (:func:`blocked`): a sleep, storage, its device, a lock;
    * CONTENTION: its wait for a core beyond what its own CPU time costs at the others' rate
      (:func:`starved`) is taken out of the excess, and no straggler's excess is left;
    * CPU_WORK or SLOW_CORE: for the same batch its training thread used more CPU time per step,
      enough (with the wait for a core that comes with it at the others' rate) for at least half of
      what is left and 10 % more, beside a rank of its own node (CPU runs): spread alike over its
      step's parts, its core ran slower (SLOW_CORE: another process on the same physical core, a
      lower clock); where it grew in one part, it is work of its own (CPU_WORK);
    * WAIT: none of these: it waits, off the CPU (a slower device, storage, a lock, a sleep), or
      (alone on its node, or its parts not measured) it computes slower or more, which cannot be
      told apart."""
    w, judged, step = s.work, s.judged, run.median_step
    own_others = median([own(r) for r in s.others]) or 0.0
    ratio = w.ratio
    if ratio is not None and ratio >= T.WORK_RATIO_MIN and (ratio - 1.0) * own_others >= T.WORK_EXPLAINS * judged:
        return WORK, judged
    off = w.blocked_excess
    if off is not None and off >= T.CAUSE_SHARE * judged:
        # it spends the excess off the CPU, not waiting for a core: it waits (for its device,
        # storage, a lock, a sleep), whatever its CPU time (a thread that sleeps wakes to cold
        # caches and waits for a core at each wake-up on a busy CPU)
        return WAIT, judged
    rest = judged - max(0.0, s.starved or 0.0)
    if severity(rest / step, rest, T.STRAGGLER_EXCESS_WARN, T.STRAGGLER_EXCESS_CRIT, T.STRAGGLER_FLOOR_MS) is None:
        return CONTENTION, judged
    extra, cratio = w.cpu_wall, w.cpu_ratio
    if (run.ctx.device == "cpu" and w.shares_node and extra is not None and cratio is not None
            and extra >= T.CAUSE_SHARE * rest and cratio >= T.WORK_CPU_RATIO_MIN):
        if w.uniform is True:
            return SLOW_CORE, judged
        if w.uniform is False:
            return CPU_WORK, rest
    return WAIT, rest


def assess(run: Run) -> tuple[Optional[Slowest], Optional[str]]:
    """The slowest rank whose excess is worth a verdict, with its severity (its ``cause`` says
    which), by own time, then by step time; (None, None) when no rank's is. ``info`` where the
    run had too few stretches of steps to check that the excess lasts through it (a timed excess;
    a batch size is counted). A rank whose excess only a wait for a core beyond its share made is
    returned with cause CONTENTION (or SLOW_CORE, its core ran slower) and no severity when no
    other is worth one."""
    key = "slowest.assess"
    if key in run.cache:
        return run.cache[key]
    step = run.median_step
    out: tuple[Optional[Slowest], Optional[str]] = (None, None)
    if step > 0:
        excused = None
        # the step metric only where the ranks' wait for each other is not measured: where it
        # is, a rank's longest step is the one that waited (for a rank late from between steps)
        for metric in (("own",) if run.comm_measured() else ("own", "step")):
            s = by_metric(run, metric)
            if s is None:
                break
            s.cause, s.weighed = _cause(run, s)
            if s.cause in (CONTENTION, SLOW_CORE):
                if excused is None and severity(s.judged / step, s.judged, T.STRAGGLER_EXCESS_WARN,
                                                T.STRAGGLER_EXCESS_CRIT, T.STRAGGLER_FLOOR_MS):
                    excused = s
                continue
            sev = severity(s.weighed / step, s.weighed, T.STRAGGLER_EXCESS_WARN, T.STRAGGLER_EXCESS_CRIT,
                           T.STRAGGLER_FLOOR_MS)
            if sev is not None:
                if s.persistent is None and s.cause != WORK:
                    # too few stretches of steps to tell it from the run's noise: a description,
                    # not a warning (bigger batches are counted, not timed: they need no check)
                    sev = "info"
                out = (s, sev)
                break
        if out[0] is None and excused is not None:
            out = (excused, None)
    run.cache[key] = out
    return out


def by_metric(run: Run, metric: str) -> Optional[Slowest]:
    """The slowest rank by ``metric`` (``own`` or ``step``) and its excess, or None with fewer
    than two ranks."""
    live = run.live
    if len(live) < 2:
        return None
    fn = own if metric == "own" else (lambda r: mean_ms(r, "step") or 0.0)
    return of_rank(run, max(live, key=fn), metric)


def of_rank(run: Run, worst: RankSummary, metric: str = "own") -> Slowest:
    """One rank's excess by ``metric`` over the other ranks' median, and what it is made of (the
    slowest rank's, for :func:`by_metric`; the rank with the biggest batches, for an imbalance
    that does not slow it yet)."""
    live = run.live
    fn = own if metric == "own" else (lambda r: mean_ms(r, "step") or 0.0)
    others = [r for r in live if r is not worst]
    mid = median([fn(r) for r in others])
    assert mid is not None
    excess = fn(worst) - mid
    pause = one_pause(worst, live, metric)
    if pause and worst.steady_steps:  # a pause is not a straggler: judge the rest
        excess = max(0.0, excess - pause / worst.steady_steps)
    persistent, lower, windows, slower = persistent_excess(run, worst, others, metric)
    judged = excess if persistent is None or lower is None else min(excess, persistent, lower)
    fact = run.cpu(worst.rank)
    phases = OWN_PHASES + (("backward",) if metric == "step" or run.comm_measured() else ())
    deltas: dict[str, float] = {}
    for ph in phases:
        mine = mean_ms(worst, ph)
        theirs = [v for v in (mean_ms(r, ph) for r in others) if v is not None]
        if mine is not None and theirs:
            deltas[ph] = round(mine - (median(theirs) or 0.0), 2)
    return Slowest(rank=worst, others=others, metric=metric, excess=excess, judged=judged,
                   persistent=persistent, lower=lower, windows=windows, slower=slower, pause=pause,
                   starved=starved(run, worst, others), quota=quota_wait(fact) if fact is not None else 0.0,
                   deltas=deltas, work=work_of(run, worst, others), weighed=judged)


def where_in_step(deltas: dict[str, float], phase: Optional[str], share: float, excess_ms: float) -> str:
    """Where the slowest rank's excess lies, as a clause: "mostly in backward (+3.1 ms)" when one
    phase holds most of it, else the phases holding a real part of it; "" when not measured.
    One wording for every rule that names a slower rank (a straggler, a work imbalance)."""
    if phase not in deltas:
        return ""
    if share >= T.ATTRIBUTION_MOSTLY:
        return f", mostly {IN.get(phase, phase)} (+{deltas[phase]:.1f} ms)"
    big = [p for p in sorted(deltas, key=lambda p: -deltas[p])
           if deltas[p] >= T.ATTRIBUTION_LIST * excess_ms] or [phase]
    return ", spread over " + ", ".join(f"{IN.get(p, p)} (+{deltas[p]:.1f} ms)" for p in big)
