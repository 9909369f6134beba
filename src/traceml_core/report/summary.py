"""Build ``final_summary.json`` (``schema_version`` 1) from typed run data, by small pure steps.

The input is :class:`~traceml_core.rundata.RunData`, from the live aggregator
(``aggregator/adapter.py``) or from a checkpoint (the one codec, ``traceml_core/codec.py``); the
output is the typed :class:`~.document.Summary`, written only at the file, whose shape is
documented in ``docs/summary-schema.md``. :func:`build_summary` is a pipeline, each step a pure
function of the run data and what the steps before it made:

    ranks -> topology -> timing -> communication -> status -> verdicts -> telemetry

``ranks`` (every rank of the world as a :class:`~.model.RankSummary`, with its ending),
``topology`` (nodes, who joined when), ``timing`` (phases across ranks, the merged step-time
histogram, the device, the nodes' system evidence), ``communication`` (the ranks' collectives
side by side), ``status`` (how the run ended and why: ``report/status.py``, the failure headline,
a hang), ``verdicts`` (why it was slow: ``report/rules/``, after the ending's headline),
``telemetry`` (every record accounted for). A new section (the goodput ledger, say) is one more
step reading :class:`RunData` and, where it needs them, the steps' results. Cost is proportional
to ranks x (phases x sketch buckets + series buckets), never to steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .goodput.account import Context, account
from .goodput.advice import assemble
from .goodput.ledger import AttemptLedger, Ledger
from ..codec import decode
from ..rundata import LaunchEnd, LaunchLifecycle, NodeData, OomReport, PhaseData, RankData, RunData
from ..wire.protocol import CPU_THREADS_EVENT as THREADS_EVENT, DURATION_COLUMNS
from . import status as S
from .failure import diagnose, did_not_start, failure_began
from .hang import verdict as hang_verdict
from .document import (Across, CompareSection, HangSection, NodeLifecycle, RunSection, StepSeries, StepTime, Summary,
                       SystemNode, SystemSection, Telemetry, Timeline, TopoNode, Topology, Verdict, document)
from .pauses import between_steps
from .runcontext import build_context
from .model import (Communication, CommSummary, CpuThreads, ExitRecord, GpuSummary, MemPeak, PhaseSummary,
                    RankSummary, RankTelemetry, Spread, VerdictContext)
from .stats import merge_sketches, merged_series, median, ms, phase_quantiles, step_time
from .steps import no_steps_reason, steps_block
from .thresholds import WARMUP_STEPS
from .timeline import build_timeline
from .trend import memory_trend
from .rules.graph import beside_failure
from .verdicts import judge, no_phase
from .windows import memory_points, run_windows

SCHEMA_VERSION = 1
QUANTILES = (0.1, 0.5, 0.9, 0.99)


def phase_name(column: str) -> str:
    return column[:-3] if column.endswith("_ns") else column


def iso(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    lt = time.localtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f".{int((ts % 1) * 1000):03d}" + time.strftime("%z", lt)


def build_summary(data: RunData, *, files: Optional[dict[str, Any]] = None,
                  rebuilt: Optional[dict[str, Any]] = None, provisional: bool = False,
                  now: Optional[float] = None,
                  previous: Optional[Sequence[AttemptLedger]] = None) -> dict[str, Any]:
    """``final_summary.json``'s document: :func:`build_document`, written as the file holds it."""
    return document(build_document(data, files=files, rebuilt=rebuilt, provisional=provisional, now=now,
                                   previous=previous))


def build_document(data: RunData, *, files: Optional[dict[str, Any]] = None,
                   rebuilt: Optional[dict[str, Any]] = None, provisional: bool = False,
                   now: Optional[float] = None,
                   previous: Optional[Sequence[AttemptLedger]] = None) -> Summary:
    """The final summary. ``rebuilt``: ``{"checkpoint": path, "taken_at": ts}`` when it comes
    from a checkpoint instead of the live aggregator; ``provisional``: written on SIGTERM before
    the launcher reported the exit (a later write replaces it); ``previous``: the run's earlier
    attempts' ledger rows (goodput/attempts.py), in order."""
    s, finish = data.settings, data.finish
    ended = (finish.at if finish else None) or (rebuilt or {}).get("taken_at") or (
        time.time() if now is None else now)
    rows = rank_rows(data, provisional=provisional, ended=ended)
    timing = timing_of(data, rows.ranks)
    communication = communication_of(rows.ranks, s.world_size, data.probe)
    end = ending(data, rows, provisional)
    steps = steps_block(data.ranks, rows.ranks)
    # what a rank measured across the run's failure covers the stall it caused (report/failure.py)
    threads_by_rank = cpu_threads_of(data.ranks, before=failure_began(rows.ranks))
    verdicts = verdicts_of(rows.ranks, end, VerdictContext(
        gpus=timing.gpus, gpu_util_pct=timing.gpu_util_pct,
        median_step_ms=timing.step_time.median_ms, step_source=steps.source,
        no_steps=no_steps_reason(steps, sum(1 for r in rows.ranks if r.status != "never_joined"),
                                 s.world_size, end.status),
        run_status=end.status,
        device=timing.device, communication=communication, world=s.world_size, nnodes=s.nnodes,
        cpu_busy_pct=timing.cpu_busy_pct, windows=run_windows(data.ranks),
        cpu_threads=threads_by_rank,
        declared={r.rank: r.facts.work for r in data.ranks if r.facts.work is not None}))
    try:
        ledger: Optional[Ledger] = goodput_of(data, rows.ranks, end, ended, timing.device, previous or (), rebuilt)
        ledger_note = ""
    except Exception as exc:  # noqa: BLE001 - the ledger must never cost the run's summary
        ledger, ledger_note = None, f"the goodput ledger could not be built ({type(exc).__name__}: {exc})"
    topology = topology_of(data, rows.ranks)
    context = build_context([n.hostname for n in topology.nodes], sum(len(n.gpus) for n in timing.system_nodes),
                            threads_by_rank, {r.rank: r.node for r in rows.ranks},
                            {n.node: n.cpu_pct_mean for n in timing.system_nodes})
    return Summary(
        schema_version=SCHEMA_VERSION, provisional=provisional, rebuilt=rebuilt,
        run=RunSection(
            name=s.run_name, job_id=s.job_id, mode=s.mode, script=s.script or None,
            script_args=s.script_args, started_at=iso(s.started_at), ended_at=iso(ended),
            duration_s=round(max(0.0, ended - s.started_at), 3), status=end.status,
            exit_code=finish.exit_code if finish else None, reason=end.reason,
            finish_reported_by=finish.source if finish else None),
        topology=topology, steps=steps, context=context,
        verdict=verdicts[0], other_verdicts=verdicts[1:],
        phases=[phase_name(c) for c in DURATION_COLUMNS] + ["nophase", "outside"], warmup_steps=WARMUP_STEPS,
        step_time=timing.step_time, across_ranks=timing.across_ranks, device=timing.device,
        communication=communication, ranks=rows.ranks, rank_endings=S.endings(rows.ranks),
        system=SystemSection(timing.system_nodes, timing.gpu_util_pct),
        telemetry=telemetry_of(data, rows.ranks, rebuilt),
        compare=CompareSection(timing.sketches, StepSeries(**merged_series(data.ranks))),
        timeline=_global_steps(build_timeline(data, rows.ranks, verdicts[0]), ledger),
        files=files or {}, hang=end.hang, hangs=list(data.hangs), goodput=ledger,
        notes=[n for n in (data.run_dir_note, S.after_training_note(finish, rows.ranks),
                           _restart_note(data), _refused_note(data), ledger_note) if n])


def _global_steps(timeline: Optional[Timeline], ledger: Optional[Ledger]) -> Optional[Timeline]:
    """The timeline against the run's global steps: a resumed attempt begins where the ledger
    says (its current attempt's first position), so its charts and exports continue the run's
    steps instead of starting from 0 again."""
    current = ledger.current if ledger is not None else None
    first = current.progress.first_position if current is not None else None
    if timeline is not None and first:
        timeline.step_offset = int(first)
    return timeline


# --- ranks ---------------------------------------------------------------------------------------
@dataclass
class RankRows:
    """Every rank of the world (joined or not, in rank order), and what torchrun and the nodes'
    cgroups reported about them."""

    ranks: list[RankSummary]
    #: torchrun's failed-worker records by global rank
    exits: dict[int, ExitRecord]
    #: each node's OOM report by node (None: its cgroup was not readable)
    oom_by_node: dict[int, Optional[OomReport]]


def rank_rows(data: RunData, *, provisional: bool, ended: float) -> RankRows:
    """The ranks step: each rank's row, its ending decided by ``report/status.py``."""
    s, finish = data.settings, data.finish
    nodes = data.node_by_id()
    failed_nodes = set(finish.failed_nodes if finish else [])
    exits, oom = worker_reports(finish, nodes)
    by_rank = data.rank_by_id()
    ranks: list[RankSummary] = []
    for rank in range(max([s.world_size] + [k + 1 for k in by_rank])):
        r = by_rank.get(rank)
        ex = exits.get(rank)
        if r is None:
            row = _never_joined(rank, rank // s.nproc_per_node if s.nproc_per_node else 0, ex)
        else:
            node = nodes.get(r.node) if r.node is not None else None
            row = _rank(r, S.rank_status(r, finish, node, failed_nodes, provisional, ex), ex, ended)
        if not row.host and 0 <= (row.node or 0) < s.nnodes:  # a rank that never said its host
            row.host = node_host(data, nodes, row.node or 0)
        ranks.append(row)
    return RankRows(ranks, exits, oom)


def node_host(data: RunData, nodes: dict[int, NodeData], node: int) -> str:
    """A node's host name: as it said when it joined, else as the launcher knew it."""
    ni = nodes.get(node)
    hostnames = data.settings.hostnames
    return (ni.host if ni else "") or (hostnames[node] if node < len(hostnames) else "")


def worker_reports(finish: Optional[LaunchEnd], nodes: dict[int, NodeData]
                   ) -> tuple[dict[int, ExitRecord], dict[int, Optional[OomReport]]]:
    """torchrun's failed-worker rows by global rank, and each node's OOM report by node (node 0's
    come with the launcher's finish, the others' with their node launcher's goodbye)."""
    workers: dict[int, ExitRecord] = {}
    oom: dict[int, Optional[OomReport]] = {}
    reports: list[tuple[int, Any]] = [(0, finish)] + [(n, ni.bye) for n, ni in nodes.items() if n != 0]
    for node, rep in reports:
        if rep is None:
            continue
        for w in rep.workers:
            # Python's error of a worker that failed comes with torchrun's record of it
            workers[w.rank] = ExitRecord(exitcode=w.exitcode, signal=w.signal,
                                         message=w.message or None, traceback=w.traceback or None,
                                         stderr=w.stderr or None)
        if rep.oom is not None:
            oom[node] = rep.oom
    return workers, oom


def _phase(ph: PhaseData) -> Optional[PhaseSummary]:
    if ph.count <= 0:
        return None
    p10, p50, p90, p99 = phase_quantiles(ph, QUANTILES)
    return PhaseSummary(count=ph.count, mean_ms=ms(ph.mean_ns), steady_mean_ms=ms(ph.steady_mean_ns),
                        p50_ms=ms(p50), p90_ms=ms(p90), p99_ms=ms(p99), max_ms=ms(ph.max),
                        p10_ms=ms(p10))


def _comm(r: RankData, phases: dict[str, Optional[PhaseSummary]]) -> Optional[CommSummary]:
    """A rank's communication per steady step (see docs/summary-schema.md), or None if not measured.

    Bandwidths are nccl-tests': ``algbw = S / t`` and ``busbw = S * factor / t``, with ``S`` the
    bytes and ``t`` the time collectives were in flight, summed over the steady steps."""
    busy, nbytes = r.totals("comm_busy_ns"), r.totals("comm_bytes")
    bus, calls = r.totals("comm_bus_bytes"), r.totals("comm_calls")
    exposed = phases.get("comm")
    if not exposed or busy is None or not busy.count or nbytes is None or bus is None or calls is None:
        return None
    busy_ns, n = busy.steady()
    step = phases.get("step")
    step_ms = step.steady_mean_ms if step else None
    xms = exposed.steady_mean_ms
    assert xms is not None
    return CommSummary(
        steps=busy.count, exposed_ms=xms,
        exposed_fraction=round(xms / step_ms, 4) if step_ms else None,
        busy_ms=ms(busy_ns / n),
        overlap_fraction=(round(max(0.0, 1.0 - xms * 1e6 / (busy_ns / n)), 4) if busy_ns > 0 else None),
        bytes_per_step=int(nbytes.steady()[0] / n),
        calls_per_step=round(calls.steady()[0] / n, 2),
        algbw_gbps=round(nbytes.steady()[0] / busy_ns, 4) if busy_ns > 0 else None,
        busbw_gbps=round(bus.steady()[0] / busy_ns, 4) if busy_ns > 0 else None)


def _failed_at(r: RankData, status: str) -> Optional[float]:
    """When a failed rank's failure was seen (epoch seconds): its exception's own time stamp,
    else its goodbye's arrival, else when its connection closed."""
    if status in S.OK_ENDINGS:
        return None
    for e in reversed(r.events):
        if e.kind == "exception" and isinstance(e.ts, (int, float)):
            return float(e.ts)
    if r.bye is not None and r.bye.at is not None:
        return float(r.bye.at)
    return r.closed_at


def _unsent_bound(r: RankData, ended: float) -> Optional[int]:
    """Records a rank may have produced that nobody could count (beyond ``expected``).

    0 after its ``bye``: the total it says there is exact. Without one (killed, or its node's
    launcher died), what its relay computed when the connection closed: what the rank last said
    it held unsent (its open batch and queue) plus its step rate over the time since that report.
    When even the relay's link was gone, the same from node 0's view: its last report plus its
    step rate until the run ended (an upper estimate: a rank rarely outlives its launcher long).
    None when nothing bounds it (no step ever arrived)."""
    if r.bye:
        return 0
    if r.open_bound is not None:
        return int(r.open_bound)
    first, last, n = r.first_t_end, r.last_t_end, r.received
    seen = r.last_seen
    if not n or first is None or last is None or seen is None:
        return None
    rate = (n - 1) / ((last - first) / 1e9) if last > first and n > 1 else 0.0
    return int(r.last_open or 0) + math.ceil(rate * max(0.0, ended - seen))


def _rank(r: RankData, status: str, exit_: Optional[ExitRecord], ended: float) -> RankSummary:
    phases = {phase_name(c): _phase(r.phase(c)) for c in DURATION_COLUMNS}
    mem = r.mem
    # a rank's relay reports how far its seq went, so records it had to drop at the end count too
    expected = r.expected
    bye = r.bye
    errors = [e.text for e in r.events if e.kind in ("exception", "error")]
    return RankSummary(
        rank=r.rank, node=r.node, host=r.host, local_rank=r.local_rank,
        status=status, error=(bye.error if bye else None) or (errors[-1] if errors else None),
        steps=r.received, steady_steps=r.phase("step_ns").steady_count, last_step=r.last_step,
        steps_produced=bye.steps if bye else None, fail_step=bye.fail_step if bye else None,
        fail_in_step=bool(bye and bye.fail_in_step),
        failed_at=_failed_at(r, status),
        ended_at=(r.bye.at if r.bye is not None and r.bye.at is not None else r.closed_at), exit=exit_,
        phases=phases,
        outside_ms=ms(r.outside.mean_ns), between=between_steps(r.outside, _jitter(phases.get("step"))),
        comm=_comm(r, phases),
        mem_peak=(_mem_peak(r) if mem.count else None),
        telemetry=RankTelemetry(
            received=r.received, expected=expected, lost=max(0, expected - r.received),
            unsent_max=_unsent_bound(r, ended),
            gaps=r.gaps, duplicates=r.duplicates, client_dropped=r.client_dropped,
            relay_dropped=r.relay_dropped, rejected=r.rejected,
            reconnects=max(0, r.connections - 1), sketched=r.sketched),
        events=r.event_count,
        last_events=r.events[-3:],
    )


def _jitter(step: Optional[PhaseSummary]) -> float:
    """The spread of a rank's steps (p90 - p50, ms): the scheduling jitter its gaps between steps
    see too (report/pauses.py)."""
    if step is None or step.p90_ms is None or step.p50_ms is None:
        return 0.0
    return max(0.0, step.p90_ms - step.p50_ms)


def _mem_peak(r: RankData) -> MemPeak:
    """The rank's memory peak and its trend over the run (report/trend.py), or why there is none."""
    trend, why = memory_trend(memory_points(r))
    return MemPeak(max_bytes=r.mem.max, mean_bytes=int(r.mem.sum / r.mem.count), trend=trend,
                   trend_why=why)


def cpu_threads_of(ranks: Sequence[RankData], before: Optional[float] = None) -> dict[int, CpuThreads]:
    """Each rank's last ``cpu_threads`` event (sdk/threads.py): its threads, its cores and its
    wait for a core; with ``before``, its last event taken before then (one taken at the rank's
    shutdown after the run failed spans the failure: the figures per step and per second then
    include the time the failure stalled, so only the earlier event's threads and cores count)."""
    out: dict[int, CpuThreads] = {}
    for r in ranks:
        for e in reversed(r.events):
            if before is not None and isinstance(e.ts, (int, float)) and e.ts >= before:
                continue
            if e.kind == THREADS_EVENT:
                fact = CpuThreads.of_event(e.text)
                if fact is not None:
                    out[r.rank] = fact
                break
    return out


def _never_joined(rank: int, node: int, exit_: Optional[ExitRecord] = None) -> RankSummary:
    # its error: what torchrun's record of it says (Python's error of a worker that failed before
    # TraceML started in it), if anything
    return RankSummary(rank=rank, node=node, host="", local_rank=None, status="never_joined",
                       error=exit_.message if exit_ else None, exit=exit_,
                       phases={phase_name(c): None for c in DURATION_COLUMNS})


# --- topology ------------------------------------------------------------------------------------
def _lifecycle(lc: Optional[LaunchLifecycle]) -> Optional[NodeLifecycle]:
    """A node's launch lifecycle with local ISO times."""
    if lc is None:
        return None
    return NodeLifecycle({p: iso(at) for p, at in lc.phases.items()}, iso(lc.first_step),
                         iso(lc.allocation_start), lc.restarts)


def topology_of(data: RunData, ranks: Sequence[RankSummary]) -> Topology:
    """The topology step: the world's shape, and per node who joined when and how it left."""
    s, finish = data.settings, data.finish
    nodes = data.node_by_id()
    failed_nodes = set(finish.failed_nodes if finish else [])
    by_node: dict[Any, list[int]] = {}
    for r in ranks:  # once, not once per node: the summary's work stays linear in nodes + ranks
        by_node.setdefault(r.node, []).append(r.rank)
    rows = []
    for node in range(s.nnodes):
        ni = nodes.get(node) or NodeData(node)
        joined_at = ni.joined_at
        delay = None if joined_at is None else round(max(0.0, joined_at - s.started_at), 3)
        rows.append(TopoNode(
            node=node, hostname=node_host(data, nodes, node) or None, joined=joined_at is not None,
            joined_at=iso(joined_at), join_delay_s=delay,
            late=bool(delay is not None and delay > s.late_after_s),
            left_early=ni.left_at is not None or node in failed_nodes,
            exit_code=ni.bye.exit_code if ni.bye else None, ranks=by_node.get(node, []),
            lifecycle=_lifecycle(ni.lifecycle)))
    return Topology(nnodes=s.nnodes, nproc_per_node=s.nproc_per_node, world_size=s.world_size,
                    master_addr=s.master_addr or None, nodes_joined=sum(1 for n in rows if n.joined),
                    nodes=rows)


# --- timing --------------------------------------------------------------------------------------
@dataclass
class Timing:
    """The timing step's result: where the time went, across ranks and over all steps."""

    #: every rank's phase histograms merged, by phase (what ``traceml compare`` reads)
    sketches: dict[str, Any]
    #: the run's one median step and its spread (``step_time``)
    step_time: StepTime
    across_ranks: dict[str, Optional[Across]]
    device: str
    system_nodes: list[SystemNode]
    gpus: list[GpuSummary]
    gpu_util_pct: Optional[float]
    #: the busiest node's mean CPU use
    cpu_busy_pct: Optional[float]


def timing_of(data: RunData, ranks: Sequence[RankSummary]) -> Timing:
    sketches = {phase_name(c): merge_sketches(r.phase(c).sketch for r in data.ranks)
                for c in DURATION_COLUMNS}
    steps = StepTime(**step_time(sketches["step"]))
    steps.steps = sum(r.phase("step_ns").count for r in data.ranks)  # exact, not sketched
    nodes, gpus, util = system_of(data)
    cpu = [n.cpu_pct_mean for n in nodes if n.cpu_pct_mean is not None]
    return Timing(sketches=sketches, step_time=steps,
                  across_ranks=across_ranks([r for r in ranks if r.status != "never_joined"]),
                  device=device_of(ranks, gpus), system_nodes=nodes, gpus=gpus, gpu_util_pct=util,
                  cpu_busy_pct=max(cpu) if cpu else None)


def across_ranks(ranks: Sequence[RankSummary]) -> dict[str, Optional[Across]]:
    """Per phase, the ranks' steady means side by side: the median, the worst and the skew."""
    out: dict[str, Optional[Across]] = {}
    for c in DURATION_COLUMNS + ("nophase", "outside"):
        name = phase_name(c)
        vals = [(v, r.rank, r.node) for r in ranks
                for v in ((no_phase(r.steady_ms("step"), r.steady_ms) if name == "nophase" else r.steady_ms(name)),)
                if v is not None]
        if not vals:
            out[name] = None
            continue
        mid = median([v for v, _, _ in vals])
        worst = max(vals)
        out[name] = Across(ranks=len(vals), median_ms=round(mid, 4) if mid is not None else None,
                           worst_rank=worst[1], worst_node=worst[2], worst_ms=worst[0],
                           skew=round(worst[0] / mid, 3) if mid else None)
    return out


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 2)


def system_of(data: RunData) -> tuple[list[SystemNode], list[GpuSummary], Optional[float]]:
    """(the nodes' rows, every GPU with its node, the mean of the GPUs' mean utilisation)."""
    nodes = []
    gpus_flat: list[GpuSummary] = []
    for ns in data.system:
        gpus: list[GpuSummary] = []
        for g in ns.gpus:
            gs = GpuSummary(node=ns.node, index=g.index, samples=g.util_pct.n,
                            util_pct_mean=_round(g.util_pct.mean), util_pct_max=g.util_pct.max,
                            mem_used_max=g.mem_used.max, mem_total=g.mem_total.max,
                            temp_c_max=g.temp_c.max, power_w_mean=_round(g.power_w.mean),
                            power_w_max=g.power_w.max)
            gpus.append(gs)
            gpus_flat.append(gs)
        nodes.append(SystemNode(node=ns.node, host=ns.host, samples=ns.samples,
                                cpu_pct_mean=_round(ns.cpu_pct.mean), cpu_pct_max=ns.cpu_pct.max,
                                ram_used_max=ns.ram_used.max, ram_total=ns.ram_total.max, gpus=gpus))
    utils = [g.util_pct_mean for g in gpus_flat if g.util_pct_mean is not None]
    return nodes, gpus_flat, (round(sum(utils) / len(utils), 2) if utils else None)


def device_of(ranks: Sequence[RankSummary], gpus: Sequence[GpuSummary]) -> str:
    """What the ranks computed on, as far as was measured: ``cuda`` when their phases were timed
    with CUDA events (the SDK does so for a model on a GPU; ``h2d`` is measured only then) or the
    nodes' GPUs were busy; ``cpu`` when no rank used CUDA timing and no node reported a GPU;
    ``unknown`` otherwise (GPUs present but idle, e.g. a script that never passed its model to
    trace_step). Advice is chosen by it: no GPU advice on a CPU run."""
    if any((r.phases.get("h2d") and r.phases["h2d"].count) for r in ranks):
        return "cuda"
    if any((g.util_pct_mean or 0) > 5 for g in gpus):
        return "cuda"
    if not gpus and any(r.phases.get("step") for r in ranks):
        return "cpu"
    return "unknown"


# --- communication -------------------------------------------------------------------------------
def communication_of(ranks: Sequence[RankSummary], world: int, probe: Optional[dict[str, Any]]) -> Communication:
    """The communication step: the ranks' figures side by side (median, least, most), and the
    link probe's measurement between the nodes."""
    measured = [(r.comm, r.rank) for r in ranks if r.comm]

    def spread(key: str) -> Optional[Spread]:
        vals = [(getattr(c, key), rank) for c, rank in measured if getattr(c, key) is not None]
        if not vals:
            return None
        lo, hi = min(vals), max(vals)
        return Spread(median=round(median([v for v, _ in vals]) or 0.0, 4), min=lo[0],
                      min_rank=lo[1], max=hi[0], max_rank=hi[1])

    why: Optional[str] = None
    if not measured:
        why = ("a single process: nothing to communicate" if world <= 1 else
               "no rank measured it (no process group in the traced steps, or a DDP model TraceML "
               "could not time: see the ranks' logs)")
    return Communication(measured=bool(measured), ranks_measured=len(measured), not_measured_why=why,
                         probe=probe, **{k: spread(k) for k in CommSummary.FIGURES})


# --- status ----------------------------------------------------------------------------------------
@dataclass
class Ending:
    """The status step's result: how the run ended and why."""

    status: str
    reason: str
    #: the verdict that heads the summary because of how the run ended (a failure, a hang)
    headline: Optional[Verdict]
    #: the headline is all there is to say: the run never reached its first step
    alone: bool
    #: a stall that resolved (a warning shown after the primary verdict)
    stall: Optional[Verdict]
    #: the last hang report as the summary shows it (``hang``)
    hang: Optional[HangSection]


def ending(data: RunData, rows: RankRows, provisional: bool) -> Ending:
    """The status step: the run's status (``report/status.py``), then why it ended so: the hang
    it ended in, else the failure's first rank (``report/failure.py``, which marks each failed
    rank's role; a run no rank of which reached a step did not start), else the launcher's
    reason."""
    finish, ranks = data.finish, rows.ranks
    nodes = S.node_failures(data.node_by_id(), finish, data.settings.hostnames)
    stopped_at = finish.torchrun.stopped_at if finish is not None and finish.torchrun is not None else None
    status = S.run_status(finish, ranks, provisional,
                          S.failed_before_interrupt(data.node_by_id(), rows.exits, ranks, nodes, stopped_at))
    hang, ended_hung = last_hang(data)
    reason = finish.reason if finish else ""
    alone = False
    if ended_hung:  # the run ended while hung: where every rank was stuck is the headline
        found: Optional[dict[str, Any]] = hang_verdict(data.hangs[-1], ended_hung=True)
        short = "hung: " + data.hangs[-1].finding
    else:
        found = diagnose(ranks, rows.oom_by_node, status, nodes)
        never = did_not_start(ranks, found) if found is not None else None
        if never is not None:  # no rank trained: nothing about steps or performance
            found, alone = never, True
            if never["evidence"].get("cause") == "never_joined" and finish is not None and finish.reason \
                    and not finish.interrupted:  # no rank said why; the launcher did (agent.port_taken)
                found["why"] = f"no rank reached its first step: {finish.reason}"
                found["next_step"] = "nothing was trained: the reason above says what to do"
        short = found.pop("reason") if found is not None else ""
    if short:
        reason = f"{short}; {reason}" if reason else short
    elif status == "failed" and not reason:
        reason = S.failed_run_reason(finish, ranks)
    stall = hang_verdict(data.hangs[-1], ended_hung=False) if hang is not None and not ended_hung else None
    return Ending(status, reason, decode(Verdict, found) if found is not None else None, alone,
                  decode(Verdict, stall) if stall is not None else None, hang)


def last_hang(data: RunData) -> tuple[Optional[HangSection], bool]:
    """The last hang report (as the summary shows it), and whether the run ended still hung (no
    step record arrived after it). Earlier reports stay in ``hangs``."""
    if not data.hangs:
        return None, False
    last = data.hangs[-1]
    resumed = data.records > last.records_at
    return HangSection(last, resumed), not resumed


def _refused_note(data: RunData) -> str:
    """Values the wire refused as not measurements (wire/frames.measured), if any."""
    n = data.counters.get("values_refused")
    if not n:
        return ""
    return (f"{n:,} value(s) sent by the ranks or nodes were not measurements (NaN, infinite, or past "
            "their field's physical bound, see docs/wire-protocol.md) and are left out as not measured")


def _restart_note(data: RunData) -> str:
    n = data.resumed
    if not n:
        return ""
    return (f"node 0's aggregator died during the run and was restarted {n} time(s) from its last "
            "checkpoint; records it had received after that checkpoint are counted as lost "
            "(telemetry.records_lost), the rest is in these statistics")


# --- verdicts --------------------------------------------------------------------------------------
def verdicts_of(ranks: Sequence[RankSummary], end: Ending, ctx: VerdictContext) -> list[Verdict]:
    """The verdicts step: the ending's headline first (failures first), then why the run was
    slow (``report/rules/``), a resolved stall right after the primary verdict."""
    found = [decode(Verdict, v) for v in judge(ranks, ctx)]
    if end.headline is not None:
        perf = [v for v in found if v.kind != "no_clear_bottleneck"] or found
        for v in perf:  # the failure is what to fix: the steps before it are information
            v.severity = beside_failure(v.kind, v.severity)
        found = [end.headline] + ([] if end.alone else perf)
    if end.stall is not None:
        found = found[:1] + [end.stall] + found[1:]
    return found


# --- goodput -------------------------------------------------------------------------------------
def goodput_of(data: RunData, ranks: Sequence[RankSummary], end: Ending, ended: float, device: str,
               previous: Sequence[AttemptLedger], rebuilt: Optional[dict[str, Any]]) -> Ledger:
    """The goodput step: this attempt's allocation divided among the ledger's buckets
    (goodput/account.py), after the run's earlier attempts, with the advice."""
    ctx = Context(rows=ranks, status=end.status, reason=end.reason, ended=ended, device=device,
                  ended_hung=bool(end.hang is not None and not end.hang.resumed), rebuilt=bool(rebuilt),
                  unsent={r.rank: _unsent_bound(r, ended) for r in data.ranks})
    current = account(data, ctx, attempt=len(previous), previous=previous)
    return assemble(current, previous, data, device)


# --- telemetry -------------------------------------------------------------------------------------
def telemetry_of(data: RunData, ranks: Sequence[RankSummary], rebuilt: Optional[dict[str, Any]]) -> Telemetry:
    """The telemetry step: every record of every rank accounted for, or the bound of what may
    be missing."""
    joined = [r for r in ranks if r.status != "never_joined"]
    tel = [r.telemetry for r in joined]
    received = sum(t.received for t in tel)
    expected = sum(t.expected or 0 for t in tel)
    return Telemetry(
        records_received=received, records_expected=expected,
        records_lost=max(0, expected - received),
        gaps=sum(t.gaps for t in tel), duplicates=sum(t.duplicates for t in tel),
        client_dropped=sum(t.client_dropped for t in tel),
        relay_dropped=sum(t.relay_dropped for t in tel),
        # bounds of what nobody could count (ranks without a goodbye; see _unsent_bound):
        # None when one of them cannot be bounded
        records_unsent_max=(None if any(t.unsent_max is None for t in tel)
                            else sum(t.unsent_max or 0 for t in tel)),
        ranks_without_goodbye=sum(1 for t in tel if t.unsent_max != 0),
        # complete: every record of every rank is accounted for, exactly. A summary rebuilt
        # from a mid-run checkpoint cannot know what came after it; a rank without a goodbye
        # may have produced records nobody saw
        complete=(expected == received and len(joined) == len(ranks)
                  and all(t.unsent_max == 0 for t in tel)
                  and not (rebuilt and not rebuilt.get("final_checkpoint"))),
        sketched_fraction=round(sum(t.sketched for t in tel) / received, 4) if received else None,
        aggregator_restarts=data.resumed, wire=dict(data.counters))
