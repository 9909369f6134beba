"""Verdicts: why is this run slow? Pure functions of the per-rank summary (no I/O, no state).

Each detector returns ``None`` or ``{kind, severity, why, next_step, culprit, evidence}``; the
first of the sorted list is the primary verdict. All numbers it compares against live in
:mod:`.thresholds`. Means are "steady" means (first :data:`WARMUP_STEPS` steps left out).

How a straggler is found under DDP: every rank's *step* time is the same (all ranks wait for the
slowest in the gradient all-reduce), so step time cannot name the culprit. A rank's *own* time
can: ``step - comm + outside`` where communication is measured (the wait is its own phase, so
backward is compute), else ``step - backward + outside`` (the wait hides inside backward). The
slow rank spends longer in its own work while the others spend that time waiting. Without
synchronisation (independent ranks) own and step time agree anyway.

Advice fits the device the run used (``ctx.device``: ``cuda``, ``cpu`` or ``unknown``, see
summary._device): no bf16, torch.compile or "batch per GPU" on a CPU run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from . import thresholds as T
from .model import RankSummary, VerdictContext
from .stats import median

KINDS = ("hang", "run_failed", "no_steps", "straggler", "input_bound", "communication_bound",
         "memory_creep", "low_gpu_util", "compute_bound", "no_clear_bottleneck")
#: a secondary verdict is dropped when the primary (or another verdict found) says the opposite:
#: "the time goes into the model's own work" cannot stand beside "ranks wait for one rank",
#: "ranks wait for data", "ranks wait for the network" or "the GPUs are idle" (where communication
#: is not measured, backward includes the all-reduce wait, so a waiting rank looks compute-bound)
CONTRADICTS: dict[str, tuple[str, ...]] = {
    "compute_bound": ("straggler", "input_bound", "communication_bound", "low_gpu_util"),
}
SEVERITIES = ("critical", "warning", "info")
OWN_PHASES = ("input", "forward", "optimizer", "h2d", "outside")
_PHASE_WORDS = {"input": "waiting for input", "forward": "forward", "optimizer": "the optimizer step",
                "h2d": "host-to-device copies", "outside": "code outside trace_step",
                "backward": "backward", "comm": "waiting for communication"}

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


def _m(r: RankSummary, phase: str) -> Optional[float]:
    """Steady mean (ms) of a phase for one rank; ``outside`` included; None when not measured."""
    return r.steady_ms(phase)


def _culprit(r: RankSummary) -> dict[str, Any]:
    return r.culprit()


def _where(r: RankSummary) -> str:
    return r.name


def _severity(frac: float, abs_ms: float, warn: float, crit: float, floor: float,
              crit_floor: Optional[float] = None) -> Optional[str]:
    if frac >= crit and abs_ms >= (crit_floor if crit_floor is not None else floor):
        return "critical"
    if frac >= warn and abs_ms >= floor:
        return "warning"
    return None


def _verdict(kind: str, severity: str, why: str, next_step: str, culprit: Optional[dict[str, Any]],
             **evidence: Any) -> Verdict:
    return {"kind": kind, "severity": severity, "why": why, "next_step": next_step,
            "culprit": culprit, "evidence": evidence}


def _gpu(ctx: VerdictContext) -> bool:
    return ctx.device == "cuda"


def _cpu(ctx: VerdictContext) -> bool:
    return ctx.device == "cpu"


def _comm_measured(live: Sequence[RankSummary]) -> bool:
    return all(_m(r, "comm") is not None for r in live)


def _iteration(r: RankSummary) -> Optional[float]:
    """Wall time per step of one rank: the traced step plus the time between steps."""
    step = _m(r, "step")
    if not step:
        return None
    return step + max(0.0, _m(r, "outside") or 0.0)


def _input_wait(r: RankSummary) -> Optional[tuple[float, float, str]]:
    """(wait ms, of how many ms, how it was measured) for one rank.

    With a DataLoader (or ``wrap_dataloader``) the fetch is timed and credited to the step:
    ``("fetch")`` against the step. Without one, input is *not measured*; the time between traced
    steps, which nothing else explains, is then read as the input wait (``"between"``) against
    the whole iteration (step + between): a ``get_batch()`` before each step shows up there."""
    step = _m(r, "step")
    if not step:
        return None
    inp = _m(r, "input")
    if inp is not None:
        return inp, step, "fetch"
    between = _m(r, "outside")
    if between is None:
        return None
    return max(0.0, between), step + max(0.0, between), "between"


def input_bound(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    waits = [w for w in (_input_wait(r) for r in live) if w is not None]
    if not waits:
        return None
    between = sum(1 for w in waits if w[2] == "between") > len(waits) / 2
    waits = [w for w in waits if (w[2] == "between") == between]
    frac = median([i / s for i, s, _ in waits])
    wait = median([i for i, _, _ in waits])
    of = median([s for _, s, _ in waits])
    assert frac is not None and wait is not None and of is not None
    sev = _severity(frac, wait, T.INPUT_FRACTION_WARN, T.INPUT_FRACTION_CRIT, T.INPUT_FLOOR_MS,
                    T.INPUT_CRIT_FLOOR_MS)
    if sev is None:
        return None
    if between:
        return _verdict(
            "input_bound", sev,
            f"input is not measured (no DataLoader or wrap_dataloader), and the median rank spends "
            f"{wait:.1f} ms between steps for each {of:.1f} ms of wall clock per step ({frac:.0%}): "
            "time between steps, e.g. fetching the next batch, counted as input wait because "
            "nothing else explains it",
            "if that is data loading, move it into a DataLoader with num_workers"
            + (" and pin_memory" if _gpu(ctx) else "") + ", "
            "or prefetch the next batch in a background thread; wrap the batch source with "
            "traceml.wrap_dataloader(...) to measure the fetch itself; if it is logging, "
            "evaluation or checkpointing, do it less often",
            None, source="between_steps", input_fraction=round(frac, 4), input_ms=round(wait, 4),
            iteration_ms=round(of, 4))
    if _gpu(ctx):
        nxt = ("feed the GPUs faster: raise DataLoader num_workers, set pin_memory=True and "
               "persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    else:
        nxt = ("load batches faster: raise DataLoader num_workers (the node's spare cores permitting), "
               "set persistent_workers=True, or move per-sample preprocessing out of __getitem__")
    return _verdict(
        "input_bound", sev,
        f"the median rank waits for the next batch {frac:.0%} of its step time ({wait:.1f} ms of "
        f"{of:.1f} ms per step on average)",
        nxt, None, source="fetch", input_fraction=round(frac, 4), input_ms=round(wait, 4),
        step_ms=round(of, 4))


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
        # the baseline is the median of the *other* ranks (with two ranks, the median of both
        # would sit half-way to the straggler and halve its excess)
        mid = median([fn(r) for r in live if r is not worst])
        assert mid is not None
        excess = fn(worst) - mid
        frac = excess / step_med
        sev = _severity(frac, excess, T.STRAGGLER_EXCESS_WARN, T.STRAGGLER_EXCESS_CRIT,
                        T.STRAGGLER_FLOOR_MS)
        if sev is None:
            continue
        phases = OWN_PHASES + (("backward",) if metric == "step" or comm_measured else ())
        diffs = []
        for ph in phases:
            mine = _m(worst, ph)
            others = [v for v in (_m(r, ph) for r in live if r is not worst) if v is not None]
            if mine is not None and others:
                diffs.append((mine - (median(others) or 0.0), ph))
        phase = max(diffs)[1] if diffs else "step"
        if phase == "input":
            nxt = (f"rank {worst.rank}'s data loading is slower: check its data shard and "
                   "DataLoader workers, and the CPU and disk of its node")
        elif phase == "outside":
            nxt = (f"rank {worst.rank} does extra work between steps (logging, evaluation or "
                   "checkpointing on that rank only?): move it off the training loop or spread it "
                   "over all ranks")
        elif _gpu(ctx):
            nxt = (f"rank {worst.rank} computes slower: check its GPU's clocks and temperature "
                   "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE) and what else runs on its node")
        else:
            nxt = (f"rank {worst.rank} computes slower: check what else runs on its node (top, "
                   "other jobs sharing its cores) and how many threads each rank uses "
                   "(OMP_NUM_THREADS, torch.get_num_threads())")
        why = (f"{_where(worst)} takes {excess:.1f} ms more per step than the other ranks' median "
               f"({frac:.0%} of the median step, {step_med:.1f} ms), mostly in "
               f"{_PHASE_WORDS.get(phase, phase)}"
               + ("; the other ranks wait for it" if metric == "own" else ""))
        return _verdict("straggler", sev, why, nxt, _culprit(worst), metric=metric,
                        excess_ms=round(excess, 4), excess_fraction=round(frac, 4),
                        median_step_ms=round(step_med, 4), phase=phase)
    return None


def memory_creep(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    creeping = []
    for r in live:
        tr = r.mem_peak.trend if r.mem_peak else None
        if not tr or not tr.rising or tr.early_bytes <= 0:
            continue
        rel = tr.growth_bytes / tr.early_bytes
        if rel >= T.MEM_CREEP_GROWTH_WARN and tr.growth_bytes >= T.MEM_CREEP_FLOOR_BYTES:
            creeping.append((rel, r, tr))
    if not creeping:
        return None
    rel, worst, tr = max(creeping, key=lambda x: x[0])
    sev = "critical" if rel >= T.MEM_CREEP_GROWTH_CRIT else "warning"
    mib = 1024 * 1024
    return _verdict(
        "memory_creep", sev,
        f"peak memory of {_where(worst)} rose from {tr.early_bytes / mib:.0f} MiB to "
        f"{tr.late_bytes / mib:.0f} MiB (+{rel:.0%}) over the run and kept rising; "
        f"{len(creeping)} of {len(live)} ranks show it",
        "look for tensors kept across steps (a loss summed without .item() or .detach(), growing "
        "lists or caches); torch.cuda.memory._record_memory_history() shows who holds memory",
        _culprit(worst), growth_fraction=round(rel, 4), growth_bytes=tr.growth_bytes,
        ranks_affected=len(creeping))


def low_gpu_util(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    gpus = [g for g in ctx.gpus if g.samples >= T.GPU_MIN_SAMPLES and g.util_pct_mean is not None]
    if not gpus:
        return None
    overall = sum(g.util_pct_mean or 0.0 for g in gpus) / len(gpus)
    if overall >= T.GPU_UTIL_WARN_PCT:
        return None
    sev = "critical" if overall < T.GPU_UTIL_CRIT_PCT else "warning"
    low = min(gpus, key=lambda g: g.util_pct_mean or 0.0)
    if "input_bound" in ctx.found:
        nxt = "see the input verdict: the GPUs are waiting for data"
    elif "communication_bound" in ctx.found:
        nxt = "see the communication verdict: the GPUs are waiting for the network"
    else:
        nxt = ("the GPUs wait on the host: look at time outside the model phases, raise the batch "
               "size per GPU, or cut kernel-launch overhead with torch.compile / CUDA graphs")
    return _verdict(
        "low_gpu_util", sev,
        f"the {len(gpus)} GPU(s) were busy {overall:.0f}% of the time on average (lowest: GPU "
        f"{low.index} on node {low.node}, {low.util_pct_mean or 0.0:.0f}%)",
        nxt, None, gpu_util_pct=round(overall, 2))


def communication_bound(live: Sequence[RankSummary], ctx: VerdictContext) -> Optional[Verdict]:
    """Exposed communication dominates the step, judged on the rank that waits least (see
    thresholds.COMM_FRACTION_WARN), with the bandwidth achieved and, if the probe named one,
    the slow node."""
    rows = [(c / s, c, s, r) for c, s, r in ((_m(r, "comm"), _m(r, "step"), r) for r in live)
            if c is not None and s]
    if len(rows) < 2:
        return None
    frac, wait, step, least = min(rows, key=lambda x: x[0])
    sev = _severity(frac, wait, T.COMM_FRACTION_WARN, T.COMM_FRACTION_CRIT, T.COMM_FLOOR_MS,
                    T.COMM_CRIT_FLOOR_MS)
    if sev is None:
        return None
    comm = ctx.communication
    med_wait = median([c for _, c, _, _ in rows]) or 0.0

    def med(key: str) -> Optional[float]:
        return comm.median(key) if comm else None

    busbw, algbw, nbytes, overlap = med("busbw_gbps"), med("algbw_gbps"), med("bytes_per_step"), \
        med("overlap_fraction")
    calls = med("calls_per_step")
    per_call = nbytes / calls if nbytes is not None and calls else None
    small = per_call is not None and per_call < T.COMM_SMALL_BYTES
    multi = (ctx.nnodes or 1) > 1
    why = (f"every rank waits for communication after its own compute: at least {wait:.1f} ms of "
           f"its {step:.1f} ms step ({frac:.0%}; median rank {med_wait:.1f} ms)")
    if busbw is not None and algbw is not None:
        why += (f"; {_mb(nbytes)} per step in {calls:g} collective(s) at {busbw:.3g} GB/s bus "
                f"bandwidth ({algbw:.3g} GB/s algorithm)")
        if small:
            why += " - small messages, so latency rather than bandwidth sets their time"
    probe = (comm.probe if comm else None) or {}
    slow, link = probe.get("slow_node"), probe.get("slow_link")
    advice = []
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
    compress = "bf16_compress_hook" if _gpu(ctx) else "fp16_compress_hook"
    if small:
        advice.append(f"the collectives are small ({_mb(per_call)} each): call them less often - "
                      "accumulate gradients over k micro-batches under DDP's no_sync() (one "
                      "all-reduce per k)")
        cpu_busy = ctx.cpu_busy_pct
        if _cpu(ctx) and cpu_busy is not None and cpu_busy >= T.COMM_CPU_BUSY_PCT:
            advice.append(f"the CPUs were {cpu_busy:.0f}% busy, so gloo's threads also wait for a "
                          "core: fewer ranks or threads per node (OMP_NUM_THREADS) leave them one")
    else:
        if multi and _gpu(ctx):
            advice.append("check that NCCL uses InfiniBand/RoCE rather than TCP sockets "
                          "(NCCL_DEBUG=INFO logs NET/IB, not NET/Socket) and the fast interface "
                          "(NCCL_SOCKET_IFNAME, NCCL_IB_HCA)")
        elif multi and _cpu(ctx):
            advice.append("gloo sends over TCP: point GLOO_SOCKET_IFNAME at the fastest interface "
                          "between the nodes")
        elif multi:
            advice.append("make sure the collectives use the fastest interface between the nodes "
                          "(NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; InfiniBand for NCCL)")
        elif _gpu(ctx):
            advice.append("on one node NCCL should use NVLink/PCIe peer-to-peer: check that "
                          "NCCL_P2P_DISABLE and NCCL_SHM_DISABLE are unset (NCCL_DEBUG=INFO names "
                          "the transport)")
        if overlap is not None and overlap < T.COMM_LOW_OVERLAP:
            advice.append(f"only {overlap:.0%} of the communication overlaps with compute: a smaller "
                          "DDP bucket_cap_mb starts the all-reduce earlier in backward")
        advice.append("send less, less often: accumulate gradients over k micro-batches under "
                      f"DDP's no_sync() (one all-reduce per k), or compress them ({compress} as a "
                      "DDP comm hook)")
    return _verdict(
        "communication_bound", sev, why, "; ".join(advice),
        ({"rank": None, "node": slow["node"], "host": slow.get("host")} if slow else None),
        comm_fraction=round(frac, 4), comm_ms=round(wait, 4), comm_median_ms=round(med_wait, 4),
        step_ms=round(step, 4), least_waiting_rank=least.rank, busbw_gbps=busbw,
        algbw_gbps=algbw, bytes_per_step=nbytes, calls_per_step=calls, overlap_fraction=overlap,
        small_messages=small, slow_node=slow["node"] if slow else None)


def _mb(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes / 1e6:.3g} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.3g} kB"


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
    on_gpu = f"; GPUs {util:.0f}% busy" if util is not None else ""
    if _comm_measured(live):
        note = "; communication excluded: it is its own phase"
    elif (ctx.world or 1) > 1:
        note = "; backward includes the gradient all-reduce: communication was not measured"
    else:
        note = ""
    if _gpu(ctx):
        nxt = ("speed-ups now come from the model itself: bf16 autocast, a larger batch per GPU, "
               "torch.compile or a fused optimizer; torch.profiler shows the heaviest kernels")
    elif _cpu(ctx):
        nxt = ("the CPU does the math: give each rank the cores it can use (OMP_NUM_THREADS / "
               "torch.set_num_threads = cores per rank, no more ranks than cores); torch.profiler "
               "shows the heaviest operations")
    else:
        nxt = "speed-ups now come from the model itself; torch.profiler shows the heaviest operations"
    return _verdict(
        "compute_bound", "info",
        f"forward, backward and optimizer take {frac:.0%} of the wall clock per step (median step "
        f"{step:.1f} ms{note}){on_gpu}",
        nxt, None, compute_fraction=round(frac, 4))


DETECTORS: tuple[Callable[[Sequence[RankSummary], VerdictContext], Optional[Verdict]], ...] = (
    straggler, input_bound, communication_bound, memory_creep, low_gpu_util, compute_bound)


def _breakdown(live: Sequence[RankSummary]) -> str:
    """Each phase's share of the wall clock per step (median over ranks of mean / iteration)."""
    parts = []
    for ph in ("input", "forward", "backward", "optimizer", "comm", "outside"):
        shares = [v / w for v, w in ((_m(r, ph), _iteration(r)) for r in live) if v is not None and w]
        if shares:
            parts.append(f"{'between steps' if ph == 'outside' else ph} {100.0 * (median(shares) or 0.0):.0f}%")
        elif ph == "input":
            parts.append("input not measured")
    return ", ".join(parts)


def judge(ranks: Sequence[RankSummary], ctx: VerdictContext) -> list[Verdict]:
    """All verdicts for a run, primary first, from the summary's ranks and what else is known of
    the run (:class:`~.model.VerdictContext`: device, median step, GPUs, communication, ...). A
    verdict that contradicts another one found (:data:`CONTRADICTS`) is dropped."""
    if ctx.no_steps:
        from .steps import TWO_LINES

        return [_verdict(
            "no_steps", "warning", ctx.no_steps,
            f"add two lines to the script: `{TWO_LINES[0]}` at the top and `{TWO_LINES[1].split('  ')[0]}` "
            "around the body of each training step (docs: quickstart)", None)]
    live = [r for r in ranks if r.phases.get("step") and r.steady_steps >= T.MIN_STEPS]
    if not live:
        most = max((r.steady_steps for r in ranks), default=0)
        unit = ("optimizer steps" if ctx.step_source not in (None, "trace_step")
                else "steps inside trace_step")
        return [_verdict(
            "no_clear_bottleneck", "info",
            f"too few steps to judge: at most {most} steady steps per rank (need {T.MIN_STEPS} "
            f"after {T.WARMUP_STEPS} warm-up steps)",
            f"run at least {T.MIN_STEPS + T.WARMUP_STEPS} {unit}", None)]
    ctx = replace(ctx, found=dict(ctx.found))
    found: list[Verdict] = []
    for detect in DETECTORS:
        v = detect(live, ctx)
        if v is not None:
            found.append(v)
            ctx.found[v["kind"]] = v
    found = [v for v in found if not set(CONTRADICTS.get(v["kind"], ())) & set(ctx.found)]
    if not found:
        found.append(_verdict(
            "no_clear_bottleneck", "info",
            "no single phase dominates the wall clock per step (" + _breakdown(live) + ")",
            "profile a few steps with torch.profiler to see inside the phases", None))
    found.sort(key=lambda v: (SEVERITIES.index(v["severity"]), KINDS.index(v["kind"])))
    return found
