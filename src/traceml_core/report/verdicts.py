"""Verdicts: why is this run slow? Pure functions of the per-rank summary (no I/O, no state).

Each detector decides from the run's figures and returns ``None`` or a verdict ``{kind, severity,
why, next_step, culprit, evidence}``; the first of the sorted list is the primary verdict. All
numbers it compares against live in :mod:`.thresholds`. Means are "steady" means (first
:data:`WARMUP_STEPS` steps left out).

**Evidence backs every claim.** A detector puts every figure its sentences use into
``evidence`` (rounded as stored), and the sentences are written from the evidence alone by
:data:`SAY` (one function per kind): ``say(kind, evidence)`` re-derives ``why`` and
``next_step`` from ``final_summary.json``, and the tests do exactly that.

How a straggler is found under DDP: every rank's *step* time is the same (all ranks wait for the
slowest in the gradient all-reduce), so step time cannot name the culprit. A rank's *own* time
can: ``step - comm + outside`` where communication is measured (the wait is its own phase, so
backward is compute), else ``step - backward + outside`` (the wait hides inside backward). The
slow rank spends longer in its own work while the others spend that time waiting. Without
synchronisation (independent ranks) own and step time agree anyway. The excess judged is the one
the rank shows through the run (in 3 of every 4 windows of steps, report/windows.py), so a stall
or another process taking its core for a while is not a straggler; the excess is attributed to
the phases that hold it, *no phase* (time inside the step outside every measured phase) and the
time between steps included.

A cause ranks above its consequence (:data:`CAUSES`): a rank whose memory creeps and that is
also the straggler is reported as memory creep first, the straggler after it, saying so.

Advice fits the device the run used (``ctx.device``: ``cuda``, ``cpu`` or ``unknown``, see
summary._device): no bf16, torch.compile or "batch per GPU" on a CPU run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from . import cpubinding
from . import thresholds as T
from .model import CpuThreads, RankSummary, VerdictContext
from .stats import median

KINDS = ("hang", "did_not_start", "run_failed", "no_steps", "straggler", "input_bound", "periodic_work",
         "communication_bound", "memory_creep", "cpu_oversubscribed", "low_gpu_util", "cpu_contention",
         "compute_bound", "no_clear_bottleneck")
#: a secondary verdict is dropped when the primary (or another verdict found) says the opposite:
#: "the time goes into the model's own work" cannot stand beside "ranks wait for one rank",
#: "ranks wait for data", "ranks wait for the network", "the ranks pause between steps" or "the
#: GPUs are idle" (where communication is not measured, backward includes the all-reduce wait,
#: so a waiting rank looks compute-bound)
CONTRADICTS: dict[str, tuple[str, ...]] = {
    "compute_bound": ("straggler", "input_bound", "communication_bound", "low_gpu_util", "periodic_work"),
}
#: effect -> the causes that, found where the effect is (the same rank; for a node-wide cause,
#: the effect's rank on that node or a run-wide effect), explain it: the cause is listed first
#: and the effect says so. A rank whose memory grows is slowed by it (allocation, a scan of a
#: growing cache, swapping); ranks that ask for more threads than their node has cores slow each
#: other down at random, and starve gloo's communication threads; in a run that waits for data,
#: the rank whose DataLoader is slowest is the straggler, in its input
CAUSES: dict[str, tuple[str, ...]] = {"straggler": ("memory_creep", "cpu_oversubscribed", "input_bound"),
                                      "communication_bound": ("cpu_oversubscribed",),
                                      "compute_bound": ("cpu_oversubscribed",),
                                      "cpu_contention": ("cpu_oversubscribed",)}
#: a straggler comes from its node's oversubscription when at least this share of its excess was
#: its extra wait for a core (measured: sdk/threads.py)
CAUSE_SHARE = 0.5
#: ...or, where each rank computes with more than one torch thread, when its excess is in the
#: phases torch runs on those threads: only the main thread's wait for a core is measured, and
#: an operator split over threads that wait for a core takes longer on the main thread without
#: it waiting at all (2 ranks x 4 threads on 2 cores: a rank falls behind in forward, its main
#: thread waiting no more than the others')
INTRA_OP_PHASES = ("forward", "backward", "optimizer")
SEVERITIES = ("critical", "warning", "info")
#: the phases a rank's own time is made of, besides backward (own work where communication is
#: measured): ``nophase`` is inside the traced step but outside every measured phase, ``outside``
#: is between steps
OWN_PHASES = ("input", "forward", "optimizer", "h2d", "nophase", "outside")
#: the measured phases inside a traced step
IN_STEP = ("input", "forward", "backward", "optimizer", "h2d", "comm")
_IN = {"input": "waiting for input", "forward": "in forward", "backward": "in backward",
       "optimizer": "in the optimizer step", "h2d": "in host-to-device copies",
       "nophase": "in no phase (inside trace_step, outside forward, backward and the optimizer)",
       "outside": "between steps (outside trace_step)", "comm": "waiting for communication",
       "step": "the step"}

Verdict = dict[str, Any]
#: the phases :func:`own_time` may take out of a step as the wait for the other ranks: the
#: measured communication, else (not measured) backward, where DDP's all-reduce then hides
WAIT_PHASES = ("comm", "backward")


def own_time(step: Optional[float], phase_ms: Callable[[str], Optional[float]]) -> Optional[float]:
    """A rank's own time per step: ``step - wait + outside``, where the wait for the others is the
    measured communication (``comm``) or, where that was not measured, ``backward`` (DDP's
    gradient all-reduce hides inside it). The straggler verdict and the report's per-rank charts
    both use it."""
    if step is None:
        return None
    wait = phase_ms("comm")
    if wait is None:
        wait = phase_ms("backward")
    return step - (wait or 0.0) + (phase_ms("outside") or 0.0)


def no_phase(step: Optional[float], phase_ms: Callable[[str], Optional[float]]) -> Optional[float]:
    """Time inside the traced step that no measured phase holds (a phase of its own: "no
    phase"): ``step`` less input, forward, backward, optimizer, host-to-device copies and
    communication, where measured; never below zero (timer granularity)."""
    if step is None:
        return None
    return max(0.0, step - sum(v for v in (phase_ms(p) for p in IN_STEP) if v is not None))


def _m(r: RankSummary, phase: str) -> Optional[float]:
    """Steady mean (ms) of a phase for one rank; ``outside`` and ``nophase`` included; None when
    not measured."""
    if phase == "nophase":
        return no_phase(r.steady_ms("step"), r.steady_ms)
    return r.steady_ms(phase)


def _r(v: Optional[float], digits: int = 2) -> Optional[float]:
    return None if v is None else round(v, digits)


def _severity(frac: float, abs_ms: float, warn: float, crit: float, floor: float,
              crit_floor: Optional[float] = None) -> Optional[str]:
    if frac >= crit and abs_ms >= (crit_floor if crit_floor is not None else floor):
        return "critical"
    if frac >= warn and abs_ms >= floor:
        return "warning"
    return None


def _verdict(kind: str, severity: str, culprit: Optional[dict[str, Any]], **evidence: Any) -> Verdict:
    """A verdict whose sentences are written from its evidence alone (:func:`say`)."""
    why, nxt = say(kind, evidence)
    return {"kind": kind, "severity": severity, "why": why, "next_step": nxt,
            "culprit": culprit, "evidence": evidence}


def _comm_measured(live: Sequence[RankSummary]) -> bool:
    return all(_m(r, "comm") is not None for r in live)


def _iteration(r: RankSummary) -> Optional[float]:
    """Wall time per step of one rank: the traced step plus the time between steps."""
    step = _m(r, "step")
    if not step:
        return None
    return step + max(0.0, _m(r, "outside") or 0.0)


def _quantile(values: Sequence[float], q: float) -> float:
    vals = sorted(values)
    pos = q * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


# --- input -----------------------------------------------------------------------------------------
def _input_wait(r: RankSummary, uniform_between: Optional[float]) -> Optional[tuple[float, float, str]]:
    """(wait ms, of how many ms, how it was measured) for one rank.

    With a DataLoader (or ``wrap_dataloader``) the fetch is timed and credited to the step:
    ``("fetch")`` against the step. Without one, input is *not measured*; the time between traced
    steps, which nothing else explains, is then read as the input wait (``"between"``) against
    the whole iteration (step + between): a ``get_batch()`` before each step shows up there. When
    periodic work was found between steps, only the part of that time spread over every step
    (``uniform_between``) can be input."""
    step = _m(r, "step")
    if not step:
        return None
    inp = _m(r, "input")
    if inp is not None:
        return inp, step, "fetch"
    between = _m(r, "outside")
    if between is None:
        return None
    between = max(0.0, between)
    if uniform_between is not None:
        return min(between, uniform_between), step + between, "between"
    return between, step + between, "between"


def input_bound(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    periodic = ctx.found.get("periodic_work")
    uniform = periodic["evidence"]["uniform_ms"] if periodic else None
    measured = [(r.rank, w) for r, w in ((r, _input_wait(r, uniform)) for r in live) if w is not None]
    if not measured:
        return None
    between = sum(1 for _, w in measured if w[2] == "between") > len(measured) / 2
    measured = [(rank, w) for rank, w in measured if (w[2] == "between") == between]
    # Where the fetch is measured, judged on the rank that waits most: under DDP the ranks wait
    # for each other, so a run whose loaders are too slow is paced by the slowest of them at each
    # step; that rank waits for its batches while the others, whose loaders prefetched meanwhile,
    # wait for it in the all-reduce (their own fetch is instant). Its wait is the run's wait for
    # data (a straggler in its input follows, explained). Where only the time between steps is
    # seen, judged on the rank that spends least there: the others' extra time between steps
    # may be work of their own, not input (a straggler between steps).
    pick = max if not between else min
    rank, (wait, of, _) = pick(measured, key=lambda m: m[1][0] / m[1][1])
    frac = wait / of
    sev = _severity(frac, wait, T.INPUT_FRACTION_WARN, T.INPUT_FRACTION_CRIT, T.INPUT_FLOOR_MS,
                    T.INPUT_CRIT_FLOOR_MS)
    if sev is None:
        return None
    # the CPU's part (report/cpubinding.py): the pacing rank's DataLoader workers against its CPUs
    # (every rank's where it did not say)
    pacing = ctx.cpu_threads.get(rank)
    cpu = None if between else cpubinding.evidence([pacing] if pacing is not None else
                                                    [ctx.cpu_threads.get(r.rank) for r in live])
    return _verdict("input_bound", sev, None, source="between_steps" if between else "fetch",
                    input_fraction=round(frac, 4), input_ms=round(wait, 4), of_ms=round(of, 4),
                    periodic_excluded=bool(between and periodic), device=ctx.device,
                    pacing_rank=None if between else rank, ranks=len(measured), cpu=cpu)


def _say_input_bound(ev: dict[str, Any]) -> tuple[str, str]:
    gpu = ev["device"] == "cuda"
    if ev["source"] == "between_steps":
        why = (f"input is not measured (no DataLoader or wrap_dataloader), and every rank spends at least "
               f"{ev['input_ms']:.1f} ms between steps for each {ev['of_ms']:.1f} ms of wall clock per step "
               f"({ev['input_fraction']:.0%})")
        why += ("; of the time between steps, only the part spread over every step, not the periodic "
                "pauses (see the periodic-work verdict)," if ev["periodic_excluded"] else ":")
        why += (" time between steps, e.g. fetching the next batch, counted as input wait because "
                "nothing else explains it")
        nxt = ("if that is data loading, move it into a DataLoader with num_workers"
               + (" and pin_memory" if gpu else "") + ", "
               "or prefetch the next batch in a background thread; wrap the batch source with "
               "traceml.wrap_dataloader(...) to measure the fetch itself; if it is logging, "
               "evaluation or checkpointing, do it less often")
        return why, nxt
    if gpu:
        nxt = ("feed the GPUs faster: raise DataLoader num_workers, set pin_memory=True and "
               "persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    else:
        nxt = ("load batches faster: raise DataLoader num_workers (the node's spare cores permitting), "
               "set persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    one = (f"waits for its next batch {ev['input_fraction']:.0%} of its step time ({ev['input_ms']:.1f} ms of "
           f"{ev['of_ms']:.1f} ms per step on average)")
    if ev["ranks"] == 1:
        why = f"rank {ev['pacing_rank']} {one}"
    else:
        why = (f"the run waits for data: rank {ev['pacing_rank']}, whose DataLoader sets the pace, {one}; the "
               "other ranks wait for it")
    if ev.get("cpu"):  # what the CPU says of it, and the fix that fits (report/cpubinding.py)
        cpu_why, nxt = cpubinding.say(ev["cpu"])
        why += f"; {cpu_why}"
    return why, nxt


# --- periodic work between steps -------------------------------------------------------------------
def periodic_work(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    """Time between steps that comes in pauses (an evaluation, a checkpoint, logging every k
    steps), from each rank's distribution of steady gaps between steps (report/pauses.py): the
    pauses' time above the typical gap holds at least PERIODIC_BURST_SHARE of all the time between
    steps, there are at least PERIODIC_MIN_BURSTS of them and they are a minority of the gaps.
    Judged on the median rank (all ranks pause for an evaluation; a pause of one rank alone makes
    the others wait in communication, not between steps)."""
    seen = sorted(((r.between.pause_excess_ms / r.between.gaps, r.between) for r in live
                   if r.between is not None and r.between.gaps), key=lambda pb: pb[0])
    if not seen:
        return None
    per_step, b = seen[(len(seen) - 1) // 2]
    if (b.gaps < T.PERIODIC_MIN_GAPS or b.pauses < T.PERIODIC_MIN_BURSTS
            or b.pause_share < T.PERIODIC_BURST_SHARE or b.pauses > b.gaps / 2):
        return None
    iters = [it for it in (_iteration(r) for r in live) if it]
    iteration = median(iters) or 0.0
    frac = per_step / iteration if iteration else 0.0
    sev = _severity(frac, per_step, T.PERIODIC_FRACTION_WARN, T.PERIODIC_FRACTION_CRIT,
                    T.PERIODIC_FLOOR_MS, T.PERIODIC_CRIT_FLOOR_MS)
    if sev is None:
        return None
    return _verdict("periodic_work", sev, None, bursts=b.pauses, steps=b.gaps,
                    period_steps=round(b.gaps / b.pauses, 1), burst_ms=round(b.pause_excess_ms / b.pauses, 1),
                    per_step_ms=round(per_step, 4), iteration_ms=round(iteration, 4),
                    fraction=round(frac, 4), uniform_ms=b.uniform_ms, typical_ms=b.typical_ms,
                    pause_share=b.pause_share, ranks=len(seen), device=ctx.device)


def _say_periodic_work(ev: dict[str, Any]) -> tuple[str, str]:
    return ((f"every ~{ev['period_steps']:.0f} steps the ranks spend about {ev['burst_ms']:.0f} ms between "
             f"steps ({ev['bursts']} pauses in {ev['steps']} steps; {ev['per_step_ms']:.1f} ms per step on "
             f"average, {ev['fraction']:.0%} of the wall clock): periodic work outside the training "
             "step, such as evaluation, checkpointing or logging every k steps"),
            "make the periodic work cheaper or rarer: evaluate or checkpoint every more steps, on a "
            "smaller evaluation set, or save checkpoints asynchronously (torch.distributed.checkpoint's "
            "async_save, or a background thread writing a copy of the state)")


# --- straggler -------------------------------------------------------------------------------------
def _persistent_excess(worst: RankSummary, others: Sequence[RankSummary], metric: str,
                       ctx: VerdictContext) -> tuple[Optional[float], Optional[float], int, Optional[float]]:
    """(the excess the worst rank shows in at least half of the run's stretches of steps, the
    lower confidence bound of its mean excess over them, the stretches judged, the share of
    stretches in which it is slower): its excess per window of
    steady steps over the other ranks' median, windows joined into stretches of at least
    ``STRAGGLER_STRETCH_STEPS`` steps (one step's scheduling noise on a busy machine is tens of
    milliseconds; a stretch's mean is steadier)."""
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
    return (_quantile(diffs, T.STRAGGLER_PERSISTENT_QUANTILE), _lower_bound(diffs), len(diffs),
            sum(1 for d in diffs if d > 0) / len(diffs))


def _lower_bound(diffs: Sequence[float]) -> float:
    """The lower confidence bound of a rank's mean excess over its stretches of steps: the mean
    less ``STRAGGLER_CONFIDENCE_SE`` standard errors, the noise taken as the robust scatter of
    the stretches about their own trend (a Theil-Sen line over the run: a rank whose excess grows,
    as with memory that it scans, is not noisy, it is trending). Two ranks of a machine shared with
    other jobs differ from stretch to stretch by tens of milliseconds either way: an excess that
    noise can explain is not judged a straggler."""
    from .trend import theil_sen

    n = len(diffs)
    fit = theil_sen([float(i) for i in range(n)], list(diffs))
    slope, icpt = fit if fit is not None else (0.0, median(diffs) or 0.0)
    resid = [d - (icpt + slope * i) for i, d in enumerate(diffs)]
    mid = median(resid) or 0.0
    spread = 1.4826 * (median([abs(r - mid) for r in resid]) or 0.0)
    return sum(diffs) / n - T.STRAGGLER_CONFIDENCE_SE * spread / n ** 0.5


def _starved(worst: RankSummary, others: Sequence[RankSummary], ctx: VerdictContext) -> Optional[float]:
    """How much longer per step ``worst`` waited for a CPU core than its own CPU time explains
    (ms; None when not measured on every rank). On a shared CPU every rank waits in proportion to
    the CPU time it asks for; at the other ranks' rate (their median wait per ms on a CPU), the
    wait beyond what its own CPU time would have cost is the rank being starved more than the
    others (another process on its cores), not work of its own: that part of its excess is
    taken out. A rank that does more work waits more too, but at the same rate: none of that is
    taken out."""
    facts = {r.rank: ctx.cpu_threads.get(r.rank) for r in [worst, *others]}
    if any(f is None or f.wait_ms is None or f.run_ms is None for f in facts.values()):
        return None
    rates = [_queue_wait(f) / f.run_ms for r in others for f in [facts[r.rank]] if f.run_ms]  # type: ignore[union-attr, operator, arg-type]
    if not rates:
        return None
    mine = facts[worst.rank]
    assert mine is not None and mine.wait_ms is not None and mine.run_ms is not None
    return _queue_wait(mine) - mine.run_ms * (median(rates) or 0.0)


def _quota_wait(f: CpuThreads) -> float:
    """The part of a rank's wait for a core (ms per step) that its cgroup's CPU quota caused: a
    throttled thread stays runnable, so the run queue counts it, but the limit is the task's own
    (its node's, its allocation's), not other processes': it stays in the rank's own time. At most
    the time the cgroup was throttled (a cgroup-wide counter, for all its threads and CPUs), at
    most the wait."""
    if f.wait_ms is None or not f.throttled_ms:
        return 0.0
    return min(f.wait_ms, f.throttled_ms)


def _queue_wait(f: CpuThreads) -> float:
    """A rank's wait for a core (ms per step) less what its own CPU quota caused: other processes'."""
    return (f.wait_ms or 0.0) - _quota_wait(f)


def straggler(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    if len(live) < 2:
        return None
    step_med = ctx.median_step_ms or median([_m(r, "step") or 0.0 for r in live]) or 0.0
    if step_med <= 0:
        return None

    # where communication is measured, backward is compute (the wait is its own phase)
    comm_measured = _comm_measured(live)

    def own(r: RankSummary) -> float:
        return own_time(_m(r, "step") or 0.0, lambda p: _m(r, p)) or 0.0

    for metric, fn in (("own", own), ("step", lambda r: _m(r, "step") or 0.0)):
        worst = max(live, key=fn)
        others = [r for r in live if r is not worst]
        # the baseline is the median of the *other* ranks (with two ranks, the median of both
        # would sit half-way to the straggler and halve its excess)
        mid = median([fn(r) for r in others])
        assert mid is not None
        excess = fn(worst) - mid
        pause = one_pause(worst, live, metric)
        if pause and worst.steady_steps:  # a pause is not a straggler: judge the rest
            excess = max(0.0, excess - pause / worst.steady_steps)
        persistent, lower, windows, slower = _persistent_excess(worst, others, metric, ctx)
        judged = excess if persistent is None or lower is None else min(excess, persistent, lower)
        cpu_wait = _starved(worst, others, ctx)
        own_work = judged - max(0.0, cpu_wait or 0.0)
        fact = ctx.cpu_threads.get(worst.rank)
        quota = _quota_wait(fact) if fact is not None else 0.0
        sev = _severity(own_work / step_med, own_work, T.STRAGGLER_EXCESS_WARN, T.STRAGGLER_EXCESS_CRIT,
                        T.STRAGGLER_FLOOR_MS)
        if sev is None:
            if cpu_wait is not None and _severity(judged / step_med, judged, T.STRAGGLER_EXCESS_WARN,
                                                  T.STRAGGLER_EXCESS_CRIT, T.STRAGGLER_FLOOR_MS):
                ctx.excused["straggler"] = {"rank": worst.rank, "excess_ms": round(excess, 2),
                                            "cpu_wait_ms": round(cpu_wait, 2)}
            continue
        phases = OWN_PHASES + (("backward",) if metric == "step" or comm_measured else ())
        deltas: dict[str, float] = {}
        for ph in phases:
            mine = _m(worst, ph)
            theirs = [v for v in (_m(r, ph) for r in others) if v is not None]
            if mine is not None and theirs:
                deltas[ph] = round(mine - (median(theirs) or 0.0), 2)
        phase = max(deltas, key=lambda p: deltas[p]) if deltas else "step"
        share = deltas.get(phase, 0.0) / excess if excess > 0 else 0.0
        return _verdict("straggler", sev, worst.culprit(), rank=worst.rank, who=worst.name,
                        metric=metric, excess_ms=round(excess, 2),
                        excess_fraction=round(excess / step_med, 4), median_step_ms=round(step_med, 2),
                        persistent_ms=_r(persistent), lower_ms=_r(lower), windows=windows,
                        windows_needed=T.STRAGGLER_MIN_WINDOWS, slower_windows=_r(slower, 4),
                        phase=phase, phase_ms=deltas, phase_share=round(share, 4),
                        cpu_wait_ms=_r(cpu_wait), quota_wait_ms=round(quota, 2) if quota else None,
                        pause_ms=round(pause, 1) if pause else None, explained_by=None, device=ctx.device)
    return None


def _say_straggler(ev: dict[str, Any]) -> tuple[str, str]:
    r = ev["rank"]
    why = (f"{ev['who']} takes {ev['excess_ms']:.1f} ms more per step than the other ranks' median "
           f"({ev['excess_fraction']:.0%} of the median step, {ev['median_step_ms']:.1f} ms)")
    if ev["persistent_ms"] is not None:
        why += (f", {ev['persistent_ms']:.1f} ms or more in at least half of the run's "
                f"{ev['windows']} stretches of steps and at least {ev['lower_ms']:.1f} ms on average "
                "beyond their noise")
    else:
        why += (f" (whether through the whole run was not checked: {ev['windows']} stretches of steps, "
                f"{ev['windows_needed']} needed)")
    if ev["cpu_wait_ms"] is not None and ev["cpu_wait_ms"] >= 0.05:
        why += f", {ev['cpu_wait_ms']:.1f} ms of it waiting for a CPU core longer than the others"
    quota = ev.get("quota_wait_ms")
    if quota is not None and quota >= 0.05:
        why += f"; its cgroup's CPU quota held it back {quota:.1f} ms per step (throttled)"
    deltas, phase = ev["phase_ms"], ev["phase"]
    if phase in deltas and ev["phase_share"] >= T.ATTRIBUTION_MOSTLY:
        why += f", mostly {_IN.get(phase, phase)} (+{deltas[phase]:.1f} ms)"
    elif phase in deltas:
        big = [p for p in sorted(deltas, key=lambda p: -deltas[p])
               if deltas[p] >= T.ATTRIBUTION_LIST * ev["excess_ms"]] or [phase]
        why += ", spread over " + ", ".join(f"{_IN.get(p, p)} (+{deltas[p]:.1f} ms)" for p in big)
    if ev["metric"] == "own":
        why += "; the other ranks wait for it"
    if ev.get("pause_ms"):
        why += f" (not counting one pause of {ev['pause_ms'] / 1000:.1f} s)"
    if ev["explained_by"] == "memory_creep":
        why += "; its memory also keeps growing (see the memory verdict), which may be what slows it"
    elif ev["explained_by"] == "cpu_oversubscribed":
        why += "; its node's ranks ask for more threads than it has cores (see the CPU verdict), which may be what slows it"
    elif ev["explained_by"] == "input_bound":
        why += "; the run waits for data (see the input verdict), and this rank's DataLoader sets the pace"
    if phase == "input":
        nxt = (f"rank {r}'s data loading is slower: check its data shard and DataLoader workers, "
               "and the CPU and disk of its node")
    elif phase == "outside":
        nxt = (f"rank {r} does extra work between steps (logging, evaluation or checkpointing on "
               "that rank only, or a slower fetch of its batches?): move it off the training loop or "
               "spread it over all ranks")
    elif phase == "nophase":
        nxt = (f"rank {r} does extra work inside its step but outside forward, backward and the "
               "optimizer (metrics, logging, a .cpu()/.item() copy, allocating or scanning memory): "
               "profile that part of its step (torch.profiler) and move it out of the loop or to every "
               "k-th step")
    elif quota is not None and quota >= 0.5 * ev["excess_ms"]:
        nxt = (f"rank {r}'s CPU is capped by its cgroup's CPU quota (cpu.max, or cpu.cfs_quota_us): ask "
               "the scheduler for more CPUs for its task, or leave its node out of the next job")
    elif ev["device"] == "cuda":
        nxt = (f"rank {r} computes slower: check its GPU's clocks and temperature "
               "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE) and what else runs on its node")
    else:
        nxt = (f"rank {r} computes slower: check what else runs on its node (top, other jobs sharing "
               "its cores) and how many threads each rank uses (OMP_NUM_THREADS, "
               "torch.get_num_threads())")
    if ev["explained_by"] == "memory_creep":
        nxt = f"first find what keeps memory on rank {r} (see the memory verdict); then " + nxt
    elif ev["explained_by"] == "cpu_oversubscribed":
        nxt = "first give the ranks no more threads than cores (see the CPU verdict); then " + nxt
    elif ev["explained_by"] == "input_bound":
        nxt = "first load batches faster on every rank (see the input verdict); then " + nxt
    return why, nxt


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
    step = median([v for v in (_m(r, "step") for r in live) if v is not None]) or 0.0
    return pause if step > 0 and pause >= T.PAUSE_MIN_STEPS * step else None


# --- memory --------------------------------------------------------------------------------------
def memory_creep(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    creeping = []
    for r in live:
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
    return _verdict("memory_creep", sev, worst.culprit(), rank=worst.rank, who=worst.name,
                    growth_fraction=round(rel, 4), growth_bytes=tr.growth_bytes,
                    start_bytes=tr.start_bytes, end_bytes=tr.end_bytes, steps=tr.steps,
                    slope_bytes_per_step=tr.slope_bytes_per_step, windows=tr.windows,
                    min_detectable_bytes=tr.min_detectable_bytes, ranks_affected=len(creeping),
                    ranks=len(live), device=ctx.device)


def _say_memory_creep(ev: dict[str, Any]) -> tuple[str, str]:
    mib = 1024 * 1024
    why = (f"peak memory of {ev['who']} grew by {ev['growth_bytes'] / mib:.0f} MiB "
           f"({ev['start_bytes'] / mib:.0f} -> {ev['end_bytes'] / mib:.0f} MiB, +{ev['growth_fraction']:.0%}) "
           f"over {ev['steps']} steps, {ev['slope_bytes_per_step'] / 1024:.0f} KiB per step, and was still "
           f"rising at the end; {ev['ranks_affected']} of {ev['ranks']} ranks show it")
    if ev["device"] == "cuda":
        tool = "torch.cuda.memory._record_memory_history() shows who holds GPU memory"
    else:
        tool = "tracemalloc (or gc.get_objects() counts of tensors between steps) shows who holds it"
    return why, ("look for tensors kept across steps (a loss summed without .item() or .detach(), "
                 f"growing lists or caches); {tool}")


# --- CPU threads ------------------------------------------------------------------------------------
def cpu_oversubscribed(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    """A CPU run whose ranks on one node compute with more threads, together, than the cores
    they may run on (each rank's torch intra-op threads and its cores: sdk/threads.py). Threads
    then wait for a core, OpenMP's spinning threads slow each other down, and a rank or gloo's
    communication threads fall behind at random: slower steps, stragglers that change from run to
    run, long all-reduce waits."""
    if ctx.device != "cpu" or not ctx.cpu_threads:
        return None
    by_node: dict[Any, list[tuple[RankSummary, Any]]] = {}
    for r in live:
        fact = ctx.cpu_threads.get(r.rank)
        if fact is not None:
            by_node.setdefault(r.node, []).append((r, fact))
    worst = None
    for node, rows in by_node.items():
        cores = frozenset().union(*(f.cpus for _, f in rows))
        threads = sum(f.threads for _, f in rows)
        ratio = threads / max(1, len(cores))
        if ratio > T.CPU_OVERSUBSCRIBED and (worst is None or ratio > worst[0]):
            worst = (ratio, node, rows, threads, len(cores))
    if worst is None:
        return None
    ratio, node, rows, threads, cores = worst
    per = sorted({f.threads for _, f in rows})
    sev = "critical" if ratio >= T.CPU_OVERSUBSCRIBED_CRIT else "warning"
    host = rows[0][0].host
    return _verdict("cpu_oversubscribed", sev, {"rank": None, "node": node, "host": host or None},
                    node=node, host=host or None, ranks=len(rows), threads=threads,
                    threads_per_rank=per, cores=cores, ratio=round(ratio, 2),
                    fair_threads=max(1, cores // len(rows)))


def _say_cpu_oversubscribed(ev: dict[str, Any]) -> tuple[str, str]:
    host = f", {ev['host']}" if ev["host"] else ""
    each = (f"{ev['threads_per_rank'][0]} torch threads each" if len(ev["threads_per_rank"]) == 1
            else "torch threads " + "/".join(map(str, ev["threads_per_rank"])))
    return ((f"the {ev['ranks']} rank(s) on node {ev['node']}{host} compute with {each}, {ev['threads']} in "
             f"all, on {ev['cores']} usable core(s) ({ev['ratio']:.1f} threads per core): threads wait for a "
             "core and slow each other down, so steps are slower and vary, and ranks fall behind at random"),
            f"give each rank at most {ev['fair_threads']} thread(s) (torch.set_num_threads({ev['fair_threads']}) "
            "or OMP_NUM_THREADS, which torchrun sets to 1 unless you set it), or run fewer ranks per node")


def cpu_contention(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    """Information: the ranks' training threads were runnable but waited for a core (the
    scheduler's run queue, sdk/threads.py) a tenth of the wall clock or more, or a rank's excess
    over the others was its wait for a core (so it was not called a straggler). The step times
    then include that wait; it comes from outside the job's own work (other processes on the
    node), or from its own threads when the CPU verdict says the ranks ask for too many."""
    facts = [ctx.cpu_threads.get(r.rank) for r in live]
    if not facts or any(f is None or f.wait_ms is None for f in facts):
        return None
    # a wait its own cgroup's CPU quota caused is not other processes' (the straggler says it)
    waits = [(_queue_wait(f), r.rank) for f, r in zip(facts, live) if f is not None]
    wait = median([w for w, _ in waits]) or 0.0
    iteration = median([it for it in (_iteration(r) for r in live) if it]) or 0.0
    frac = wait / iteration if iteration else 0.0
    ex = ctx.excused.get("straggler")
    if frac < T.CPU_CONTENTION_NOTE and ex is None:
        return None
    most = max(waits)
    return _verdict("cpu_contention", "info", None, wait_ms=round(wait, 2), fraction=round(frac, 4),
                    iteration_ms=round(iteration, 2), max_wait_ms=round(most[0], 2), max_rank=most[1],
                    excused_rank=ex["rank"] if ex else None,
                    excused_excess_ms=ex["excess_ms"] if ex else None,
                    excused_wait_ms=ex["cpu_wait_ms"] if ex else None,
                    own_threads="cpu_oversubscribed" in ctx.found, explained_by=None)


def _say_cpu_contention(ev: dict[str, Any]) -> tuple[str, str]:
    who = ("more threads than cores (see the CPU verdict)" if ev["own_threads"]
           else "other processes on the node")
    why = (f"the ranks' training threads waited for a CPU core {ev['wait_ms']:.1f} ms per step (median rank, "
           f"{ev['fraction']:.0%} of the wall clock per step; most: rank {ev['max_rank']}, "
           f"{ev['max_wait_ms']:.1f} ms): runnable, but {who} held the cores")
    if ev["excused_rank"] is not None:
        why += (f"; rank {ev['excused_rank']} is {ev['excused_excess_ms']:.1f} ms per step slower than the "
                f"others, {ev['excused_wait_ms']:.1f} ms of it waiting for a core longer than the others, so "
                "it is not called a straggler")
    if ev["own_threads"]:
        return why, "give the ranks no more threads than cores (see the CPU verdict)"
    return why, ("the step times include that wait: measure on a node the job has to itself, or ask "
                 "the scheduler for whole cores (Slurm: --exclusive, or --cpus-per-task with "
                 "--cpu-bind=cores)")


# --- GPUs ------------------------------------------------------------------------------------------
def low_gpu_util(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    gpus = [g for g in ctx.gpus if g.samples >= T.GPU_MIN_SAMPLES and g.util_pct_mean is not None]
    if not gpus:
        return None
    overall = sum(g.util_pct_mean or 0.0 for g in gpus) / len(gpus)
    if overall >= T.GPU_UTIL_WARN_PCT:
        return None
    sev = "critical" if overall < T.GPU_UTIL_CRIT_PCT else "warning"
    low = min(gpus, key=lambda g: g.util_pct_mean or 0.0)
    see = next((k for k in ("input_bound", "communication_bound") if k in ctx.found), None)
    return _verdict("low_gpu_util", sev, None, gpu_util_pct=round(overall, 2), gpus=len(gpus),
                    lowest_gpu=low.index, lowest_node=low.node,
                    lowest_pct=round(low.util_pct_mean or 0.0, 2), see=see)


def _say_low_gpu_util(ev: dict[str, Any]) -> tuple[str, str]:
    if ev["see"] == "input_bound":
        nxt = "see the input verdict: the GPUs are waiting for data"
    elif ev["see"] == "communication_bound":
        nxt = "see the communication verdict: the GPUs are waiting for the network"
    else:
        nxt = ("the GPUs wait on the host: look at time outside the model phases, raise the batch "
               "size per GPU, or cut kernel-launch overhead with torch.compile / CUDA graphs")
    return (f"the {ev['gpus']} GPU(s) were busy {ev['gpu_util_pct']:.0f}% of the time on average (lowest: "
            f"GPU {ev['lowest_gpu']} on node {ev['lowest_node']}, {ev['lowest_pct']:.0f}%)"), nxt


# --- communication ---------------------------------------------------------------------------------
def communication_bound(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    """Exposed communication dominates the step even for the rank that arrives last: judged on
    each rank's 10th percentile of its wait, the least over ranks (thresholds.COMM_WAIT_QUANTILE),
    with the bandwidth achieved and, if the probe named one, the slow node."""
    rows = []
    for r in live:
        ph, step = r.phases.get("comm"), _m(r, "step")
        if ph is None or not step:
            continue
        low = ph.p10_ms if ph.p10_ms is not None else ph.steady_mean_ms
        if low is not None:
            rows.append((low / step, low, step, r))
    if len(rows) < 2:
        return None
    frac, wait, step, least = min(rows, key=lambda x: x[0])
    sev = _severity(frac, wait, T.COMM_FRACTION_WARN, T.COMM_FRACTION_CRIT, T.COMM_FLOOR_MS,
                    T.COMM_CRIT_FLOOR_MS)
    if sev is None:
        return None
    comm = ctx.communication
    mean_wait = median([_m(r, "comm") or 0.0 for _, _, _, r in rows]) or 0.0

    def med(key: str) -> Optional[float]:
        return comm.median(key) if comm else None

    nbytes, calls = med("bytes_per_step"), med("calls_per_step")
    per_call = nbytes / calls if nbytes is not None and calls else None
    probe = (comm.probe if comm else None) or {}
    slow = probe.get("slow_node")
    return _verdict(
        "communication_bound", sev,
        ({"rank": None, "node": slow["node"], "host": slow.get("host")} if slow else None),
        comm_fraction=round(frac, 4), comm_ms=round(wait, 4), comm_quantile=T.COMM_WAIT_QUANTILE,
        comm_median_ms=round(mean_wait, 4), step_ms=round(step, 4), least_waiting_rank=least.rank,
        busbw_gbps=med("busbw_gbps"), algbw_gbps=med("algbw_gbps"), bytes_per_step=nbytes,
        calls_per_step=calls, bytes_per_call=per_call, overlap_fraction=med("overlap_fraction"),
        small_messages=per_call is not None and per_call < T.COMM_SMALL_BYTES,
        slow_node=slow["node"] if slow else None, probe_slow=slow or None,
        probe_link=probe.get("slow_link") or None, nnodes=ctx.nnodes or 1,
        cpu_busy_pct=_r(ctx.cpu_busy_pct, 1), device=ctx.device, explained_by=None)


def _mb(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes / 1e6:.3g} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.3g} kB"


def _say_communication_bound(ev: dict[str, Any]) -> tuple[str, str]:
    gpu, cpu = ev["device"] == "cuda", ev["device"] == "cpu"
    busbw, algbw, small = ev["busbw_gbps"], ev["algbw_gbps"], ev["small_messages"]
    why = (f"every rank waits for communication after its own compute, even the last to arrive: at "
           f"least {ev['comm_ms']:.1f} ms of its {ev['step_ms']:.1f} ms step in 9 of 10 steps "
           f"({ev['comm_fraction']:.0%}; mean wait of the median rank {ev['comm_median_ms']:.1f} ms)")
    if busbw is not None and algbw is not None:
        why += (f"; {_mb(ev['bytes_per_step'])} per step in {ev['calls_per_step']:g} collective(s) at "
                f"{busbw:.3g} GB/s bus bandwidth ({algbw:.3g} GB/s algorithm)")
        if small:
            why += " - small messages, so latency rather than bandwidth sets their time"
    slow, link = ev["probe_slow"], ev["probe_link"]
    advice = []
    if ev.get("explained_by") == "cpu_oversubscribed":
        why += "; the ranks ask for more threads than their node has cores (see the CPU verdict), so gloo's threads wait for a core too"
        advice.append("first give the ranks no more threads than cores (see the CPU verdict)")
    if slow:
        verb = "sending" if slow.get("direction") == "send" else "receiving"
        why += (f"; the link probe measured node {slow['node']} ({slow.get('host') or '?'}) {verb} at "
                f"{slow['gbps']:.3g} GB/s against {slow['others_gbps']:.3g} GB/s for the other nodes")
        advice.append(f"fix node {slow['node']} ({slow.get('host') or '?'})'s link first: check its NIC "
                      "speed and errors (ethtool, ip -s link) and that its traffic takes the fast "
                      "interface")
    elif link:
        why += (f"; the link probe measured node {link['src']} ({link.get('src_host') or '?'}) -> node "
                f"{link['dst']} ({link.get('dst_host') or '?'}) at {link['gbps']:.3g} GB/s, "
                f"{link['others_gbps']:.3g} GB/s the other way")
        advice.append(f"check the link between node {link['src']} and node {link['dst']} first (either "
                      "end: NIC speed and errors with ethtool / ip -s link, the interface its traffic "
                      "takes)")
    compress = "bf16_compress_hook" if gpu else "fp16_compress_hook"
    multi = ev["nnodes"] > 1
    if small:
        advice.append(f"the collectives are small ({_mb(ev['bytes_per_call'])} each): call them less "
                      "often - accumulate gradients over k micro-batches under DDP's no_sync() (one "
                      "all-reduce per k)")
        busy = ev["cpu_busy_pct"]
        if cpu and busy is not None and busy >= T.COMM_CPU_BUSY_PCT:
            advice.append(f"the CPUs were {busy:.0f}% busy, so gloo's threads also wait for a "
                          "core: fewer ranks or threads per node (OMP_NUM_THREADS) leave them one")
    else:
        if multi and gpu:
            advice.append("check that NCCL uses InfiniBand/RoCE rather than TCP sockets "
                          "(NCCL_DEBUG=INFO logs NET/IB, not NET/Socket) and the fast interface "
                          "(NCCL_SOCKET_IFNAME, NCCL_IB_HCA)")
        elif multi and cpu:
            advice.append("gloo sends over TCP: point GLOO_SOCKET_IFNAME at the fastest interface "
                          "between the nodes")
        elif multi:
            advice.append("make sure the collectives use the fastest interface between the nodes "
                          "(NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; InfiniBand for NCCL)")
        elif gpu:
            advice.append("on one node NCCL should use NVLink/PCIe peer-to-peer: check that "
                          "NCCL_P2P_DISABLE and NCCL_SHM_DISABLE are unset (NCCL_DEBUG=INFO names "
                          "the transport)")
        overlap = ev["overlap_fraction"]
        if overlap is not None and overlap < T.COMM_LOW_OVERLAP:
            advice.append(f"only {overlap:.0%} of the communication overlaps with compute: a smaller "
                          "DDP bucket_cap_mb starts the all-reduce earlier in backward")
        advice.append("send less, less often: accumulate gradients over k micro-batches under "
                      f"DDP's no_sync() (one all-reduce per k), or compress them ({compress} as a "
                      "DDP comm hook)")
    return why, "; ".join(advice)


# --- compute / nothing -----------------------------------------------------------------------------
def compute_bound(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    fracs = []
    for r in live:
        wall = _iteration(r)  # the time between steps counts: a step that is mostly model work
        if not wall:          # is not compute-bound when most of the wall clock is elsewhere
            continue
        comp = sum(v for v in (_m(r, p) for p in ("forward", "backward", "optimizer", "h2d"))
                   if v is not None)
        fracs.append(comp / wall)
    frac = median(fracs)
    if frac is None or frac < T.COMPUTE_FRACTION:
        return None
    util = ctx.gpu_util_pct
    if util is not None and util < T.COMPUTE_GPU_UTIL_PCT:
        return None
    step = ctx.median_step_ms or median([_m(r, "step") or 0.0 for r in live]) or 0.0
    comm = "measured" if _comm_measured(live) else "in_backward" if (ctx.world or 1) > 1 else "none"
    return _verdict("compute_bound", "info", None, compute_fraction=round(frac, 4),
                    median_step_ms=round(step, 2), gpu_util_pct=_r(util, 1), comm=comm,
                    device=ctx.device, explained_by=None)


def _say_compute_bound(ev: dict[str, Any]) -> tuple[str, str]:
    note = {"measured": "; communication excluded: it is its own phase",
            "in_backward": "; backward includes the gradient all-reduce: communication was not measured",
            "none": ""}[ev["comm"]]
    util = ev["gpu_util_pct"]
    on_gpu = f"; GPUs {util:.0f}% busy" if util is not None else ""
    if ev["device"] == "cuda":
        nxt = ("speed-ups now come from the model itself: bf16 autocast, a larger batch per GPU, "
               "torch.compile or a fused optimizer; torch.profiler shows the heaviest kernels")
    elif ev["device"] == "cpu":
        nxt = ("the CPU does the math: give each rank the cores it can use (OMP_NUM_THREADS / "
               "torch.set_num_threads = cores per rank, no more ranks than cores); torch.profiler "
               "shows the heaviest operations")
    else:
        nxt = "speed-ups now come from the model itself; torch.profiler shows the heaviest operations"
    return (f"forward, backward and optimizer take {ev['compute_fraction']:.0%} of the wall clock per "
            f"step (median step {ev['median_step_ms']:.1f} ms{note}){on_gpu}"), nxt


#: the phases of the "no single phase dominates" breakdown, in order, with their words
_BREAKDOWN = (("input", "input"), ("forward", "forward"), ("backward", "backward"),
              ("optimizer", "optimizer"), ("comm", "comm"), ("nophase", "no phase"),
              ("outside", "between steps"))


def _breakdown(live: Sequence[RankSummary]) -> dict[str, Optional[float]]:
    """Each phase's share of the wall clock per step, % (median over ranks of mean / iteration);
    None for input when it is not measured."""
    out: dict[str, Optional[float]] = {}
    for ph, _ in _BREAKDOWN:
        shares = [v / w for v, w in ((_m(r, ph), _iteration(r)) for r in live) if v is not None and w]
        if shares:
            out[ph] = round(100.0 * (median(shares) or 0.0), 1)
        elif ph == "input":
            out[ph] = None
    return out


def _say_no_clear_bottleneck(ev: dict[str, Any]) -> tuple[str, str]:
    if ev.get("too_few_steps"):
        return (f"too few steps to judge: at most {ev['most']} steady steps per rank (need "
                f"{ev['min_steps']} after {ev['warmup']} warm-up steps)",
                f"run at least {ev['min_steps'] + ev['warmup']} {ev['unit']}")
    parts = []
    for ph, words in _BREAKDOWN:
        if ph not in ev["shares"]:
            continue
        v = ev["shares"][ph]
        parts.append("input not measured" if v is None else f"{words} {v:.0f}%")
    return ("no single phase dominates the wall clock per step (" + ", ".join(parts) + ")",
            "profile a few steps with torch.profiler to see inside the phases")


def _say_no_steps(ev: dict[str, Any]) -> tuple[str, str]:
    from .steps import TWO_LINES

    if ev.get("run_status") in ("interrupted", "failed"):
        return (ev["reason"],
                "the ranks' logs say how far each got; a job stopped this early (scancel, a time "
                "limit shorter than the start-up) ends before training: give it the time to reach "
                "its first steps")
    return (ev["reason"],
            f"add two lines to the script: `{TWO_LINES[0]}` at the top and `{TWO_LINES[1].split('  ')[0]}` "
            "around the body of each training step (docs: quickstart)")


#: the sentences of each kind, written from its evidence alone
SAY: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "input_bound": _say_input_bound, "periodic_work": _say_periodic_work,
    "straggler": _say_straggler, "memory_creep": _say_memory_creep,
    "low_gpu_util": _say_low_gpu_util, "communication_bound": _say_communication_bound,
    "compute_bound": _say_compute_bound, "no_clear_bottleneck": _say_no_clear_bottleneck,
    "cpu_oversubscribed": _say_cpu_oversubscribed, "cpu_contention": _say_cpu_contention,
    "no_steps": _say_no_steps,
}


def say(kind: str, evidence: dict[str, Any]) -> tuple[str, str]:
    """``(why, next_step)`` of a verdict, from its evidence alone (also from
    ``final_summary.json``: re-derive a verdict's sentences to check them)."""
    return SAY[kind](evidence)


DETECTORS: tuple[Callable[[Sequence[RankSummary], VerdictContext], Optional[Verdict]], ...] = (
    straggler, periodic_work, input_bound, communication_bound, memory_creep, cpu_oversubscribed,
    cpu_contention, low_gpu_util, compute_bound)


def _explains(cause: Verdict, effect: Verdict, node_of: dict[int, Any]) -> bool:
    """Whether ``cause`` is found where ``effect`` is: the same rank, or (a node-wide cause) the
    effect's rank on the cause's node, or an effect of the whole run."""
    if cause["kind"] not in CAUSES.get(effect["kind"], ()):
        return False
    if cause["kind"] == "input_bound":
        # the run waits for data, and the straggler is the rank whose DataLoader paces it (its
        # excess is its measured wait for batches): the input pipeline is the cause. (Time between
        # steps on one rank is not linked: it may be work of that rank's own, not input.)
        return cause["evidence"]["source"] == "fetch" and effect["evidence"].get("phase") == "input"
    if cause["kind"] == "cpu_oversubscribed" and effect["kind"] == "straggler":
        # only a straggler whose excess is mostly its wait for a core (measured) comes from it,
        # or, with several threads per rank, one whose excess is where they compute (not measured)
        ev = effect["evidence"]
        waited = ev.get("cpu_wait_ms") is not None and ev["cpu_wait_ms"] >= CAUSE_SHARE * ev["excess_ms"]
        threaded = (max(cause["evidence"].get("threads_per_rank") or [1]) > 1
                    and ev.get("phase") in INTRA_OP_PHASES)
        if not (waited or threaded):
            return False
    c, e = cause.get("culprit") or {}, effect.get("culprit") or {}
    if c.get("rank") is not None:
        return c["rank"] == e.get("rank")
    if e.get("rank") is not None:
        return node_of.get(e["rank"]) == c.get("node")
    return True


def _order(found: list[Verdict], node_of: dict[int, Any]) -> list[Verdict]:
    """Sorted by severity, then kind; a cause found where its effect is (:data:`CAUSES`) comes
    right before it, and the effect says so (``evidence.explained_by``)."""
    found.sort(key=lambda v: (SEVERITIES.index(v["severity"]), KINDS.index(v["kind"])))
    for effect in [v for v in found if v["kind"] in CAUSES]:
        cause = next((c for c in found if c is not effect and _explains(c, effect, node_of)), None)
        if cause is None:
            continue
        effect["evidence"]["explained_by"] = cause["kind"]
        effect["why"], effect["next_step"] = say(effect["kind"], effect["evidence"])
        if found.index(cause) > found.index(effect):
            found.remove(cause)
            found.insert(found.index(effect), cause)
    return found


def judge(ranks: Sequence[RankSummary], ctx: VerdictContext) -> list[Verdict]:
    """All verdicts for a run, primary first, from the summary's ranks and what else is known of
    the run (:class:`~.model.VerdictContext`: device, median step, GPUs, communication, windows
    of steps, ...). A verdict that contradicts another one found (:data:`CONTRADICTS`) is
    dropped; a cause comes before its consequence (:data:`CAUSES`)."""
    if ctx.no_steps:
        return [_verdict("no_steps", "warning", None, reason=ctx.no_steps, run_status=ctx.run_status)]
    live = [r for r in ranks if r.phases.get("step") and r.steady_steps >= T.MIN_STEPS]
    if not live:
        most = max((r.steady_steps for r in ranks), default=0)
        unit = ("optimizer steps" if ctx.step_source not in (None, "trace_step")
                else "steps inside trace_step")
        return [_verdict("no_clear_bottleneck", "info", None, too_few_steps=True, most=most,
                         min_steps=T.MIN_STEPS, warmup=T.WARMUP_STEPS, unit=unit)]
    ctx = replace(ctx, found=dict(ctx.found), excused=dict(ctx.excused))
    found: list[Verdict] = []
    for detect in DETECTORS:
        v = detect(live, ctx)
        if v is not None:
            found.append(v)
            ctx.found[v["kind"]] = v
    found = [v for v in found if not set(CONTRADICTS.get(v["kind"], ())) & set(ctx.found)]
    if not found:
        found.append(_verdict("no_clear_bottleneck", "info", None, shares=_breakdown(live)))
    return _order(found, {r.rank: r.node for r in live})
