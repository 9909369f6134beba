"""Build ``final_summary.json`` (``schema_version`` 1) from typed run data.

The input is :class:`~traceml_core.rundata.RunData`, from the live aggregator
(``aggregator/adapter.py``) or from a checkpoint (``RunData.from_checkpoint``); the shape of the
output is documented in ``docs/summary-schema.md``. Cost is proportional to ranks x (phases x
sketch buckets + series buckets), never to steps.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional, Sequence

from ..rundata import Finish, NodeData, OomReport, PhaseData, RankData, RunData
from ..wire.protocol import CPU_THREADS_EVENT as THREADS_EVENT, DURATION_COLUMNS
from .failure import diagnose, did_not_start, failed_by_itself
from .hang import verdict as hang_verdict
from .model import (Communication, CommSummary, CpuThreads, ExitRecord, GpuSummary, MemPeak, PhaseSummary,
                    RankSummary, RankTelemetry, Spread, VerdictContext)
from .stats import merge_sketches, merged_series, median, ms, phase_quantiles, step_time
from .trend import memory_trend
from .windows import memory_points, run_windows
from .steps import no_steps_reason, steps_block
from .thresholds import WARMUP_STEPS
from .timeline import build_timeline
from .verdicts import judge, no_phase

SCHEMA_VERSION = 1
QUANTILES = (0.1, 0.5, 0.9, 0.99)
#: how each rank ended; "never_joined" is summary-only (the rank never completed a hello)
RANK_ENDINGS = ("clean", "error", "crashed", "vanished", "interrupted", "running", "never_joined")


def phase_name(column: str) -> str:
    return column[:-3] if column.endswith("_ns") else column


def iso(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    lt = time.localtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f".{int((ts % 1) * 1000):03d}" + time.strftime("%z", lt)


def _phase(ph: PhaseData) -> Optional[PhaseSummary]:
    if ph.count <= 0:
        return None
    p10, p50, p90, p99 = phase_quantiles(ph, QUANTILES)
    return PhaseSummary(count=ph.count, mean_ms=ms(ph.mean_ns), steady_mean_ms=ms(ph.steady_mean_ns),
                        p50_ms=ms(p50), p90_ms=ms(p90), p99_ms=ms(p99), max_ms=ms(ph.max),
                        p10_ms=ms(p10))


def _rank_status(r: RankData, finish: Optional[Finish], nodes: dict[int, NodeData],
                 failed_nodes: set[int], provisional: bool, exit_: Optional[ExitRecord] = None) -> str:
    """How a rank ended: its own bye wins; then torchrun's record of it (a worker torchrun saw die
    by a signal or a failing exit crashed, on any node: its node's launcher passes the record on);
    else what the launcher reported decides."""
    if r.bye:
        return r.bye.status
    if _failed_by_itself(exit_):
        return "crashed"
    node = r.node
    ni = nodes.get(node) if node is not None else None
    if node in failed_nodes or (ni is not None and ni.left_at is not None):
        return "vanished"
    if finish is None:
        # provisional (SIGTERM, launcher still to report): still connected = still running;
        # otherwise (rebuilt, or all ranks gone) we cannot know more than "vanished"
        return "running" if provisional and r.connected else "vanished"
    if finish.interrupted:
        return "interrupted"
    code = finish.exit_code
    if code is not None and code != 0:
        return "crashed"
    return "vanished"


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
    if status in ("clean", "running"):
        return None
    for e in reversed(r.events):
        if e.kind == "exception" and isinstance(e.ts, (int, float)):
            return float(e.ts)
    if r.bye is not None and r.bye.at is not None:
        return float(r.bye.at)
    return r.closed_at


def _worker_reports(finish: Optional[Finish], nodes: dict[int, NodeData]
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
                                         message=w.message or None, traceback=w.traceback or None)
        if rep.has_oom:
            oom[node] = rep.oom
    return workers, oom


def _restart_note(data: RunData) -> str:
    n = data.resumed
    if not n:
        return ""
    return (f"node 0's aggregator died during the run and was restarted {n} time(s) from its last "
            "checkpoint; records it had received after that checkpoint are counted as lost "
            "(telemetry.records_lost), the rest is in these statistics")


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


def _rank(r: RankData, status: str, exit_: Optional[ExitRecord] = None,
          ended: Optional[float] = None) -> RankSummary:
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
        failed_at=_failed_at(r, status), exit=exit_,
        phases=phases,
        outside_ms=ms(r.outside.mean_ns),
        comm=_comm(r, phases),
        mem_peak=(_mem_peak(r) if mem.count else None),
        telemetry=RankTelemetry(
            received=r.received, expected=expected, lost=max(0, expected - r.received),
            unsent_max=_unsent_bound(r, ended if ended is not None else time.time()),
            gaps=r.gaps, duplicates=r.duplicates, client_dropped=r.client_dropped,
            relay_dropped=r.relay_dropped, rejected=r.rejected,
            reconnects=max(0, r.connections - 1), sketched=r.sketched),
        events=r.event_count,
        last_events=r.events[-3:],
    )


def _cpu_threads(ranks: Sequence[RankData]) -> dict[int, CpuThreads]:
    """Each rank's last ``cpu_threads`` event (sdk/threads.py): its threads and cores."""
    out: dict[int, CpuThreads] = {}
    for r in ranks:
        for e in reversed(r.events):
            if e.kind == THREADS_EVENT:
                fact = CpuThreads.from_event_text(e.text)
                if fact is not None:
                    out[r.rank] = fact
                break
    return out


def _mem_peak(r: RankData) -> MemPeak:
    """The rank's memory peak and its trend over the run (report/trend.py), or why there is none."""
    trend, why = memory_trend(memory_points(r))
    return MemPeak(max_bytes=r.mem.max, mean_bytes=int(r.mem.sum / r.mem.count), trend=trend,
                   trend_why=why)


def _never_joined(rank: int, node: int, exit_: Optional[ExitRecord] = None) -> RankSummary:
    # its error: what torchrun's record of it says (Python's error of a worker that failed before
    # TraceML started in it), if anything
    return RankSummary(rank=rank, node=node, host="", local_rank=None, status="never_joined",
                       error=exit_.message if exit_ else None, exit=exit_,
                       phases={phase_name(c): None for c in DURATION_COLUMNS})


def _across(ranks: Sequence[RankSummary]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in DURATION_COLUMNS + ("nophase", "outside"):
        name = phase_name(c)
        vals = []
        for r in ranks:
            v = no_phase(r.steady_ms("step"), r.steady_ms) if name == "nophase" else r.steady_ms(name)
            if v is not None:
                vals.append((v, r.rank, r.node))
        if not vals:
            out[name] = None
            continue
        mid = median([v for v, _, _ in vals])
        worst = max(vals)
        out[name] = {"ranks": len(vals), "median_ms": round(mid, 4) if mid is not None else None,
                     "worst_rank": worst[1], "worst_node": worst[2], "worst_ms": worst[0],
                     "skew": round(worst[0] / mid, 3) if mid else None}
    return out


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 2)


def _system(data: RunData) -> tuple[list[dict[str, Any]], list[GpuSummary], Optional[float]]:
    """(the nodes' rows, every GPU with its node, the mean of the GPUs' mean utilisation)."""
    nodes = []
    gpus_flat: list[GpuSummary] = []
    for ns in data.system:
        gpus = []
        for g in ns.gpus:
            gs = GpuSummary(node=ns.node, index=g.index, samples=g.util_pct.n,
                            util_pct_mean=_round(g.util_pct.mean), util_pct_max=g.util_pct.max,
                            mem_used_max=g.mem_used.max, mem_total=g.mem_total.max,
                            temp_c_max=g.temp_c.max, power_w_mean=_round(g.power_w.mean),
                            power_w_max=g.power_w.max)
            gpus.append(gs.to_json())
            gpus_flat.append(gs)
        nodes.append({"node": ns.node, "host": ns.host, "samples": ns.samples,
                      "cpu_pct_mean": _round(ns.cpu_pct.mean),
                      "cpu_pct_max": ns.cpu_pct.max, "ram_used_max": ns.ram_used.max,
                      "ram_total": ns.ram_total.max, "gpus": gpus})
    utils = [g.util_pct_mean for g in gpus_flat if g.util_pct_mean is not None]
    return nodes, gpus_flat, (round(sum(utils) / len(utils), 2) if utils else None)


def _device(ranks: Sequence[RankSummary], gpus: Sequence[GpuSummary]) -> str:
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


def _communication(ranks: Sequence[RankSummary], world: int, probe: Optional[dict[str, Any]]) -> Communication:
    """Run-level communication: the ranks' figures side by side (median, least, most)."""
    measured = [(r.comm, r.rank) for r in ranks if r.comm]

    def spread(key: str) -> Optional[Spread]:
        vals = [(getattr(c, key), rank) for c, rank in measured if getattr(c, key) is not None]
        if not vals:
            return None
        lo, hi = min(vals), max(vals)
        return Spread(median=round(median([v for v, _ in vals]) or 0.0, 4), min=lo[0],
                      min_rank=lo[1], max=hi[0], max_rank=hi[1])

    if not measured:
        why: Optional[str] = (
            "a single process: nothing to communicate" if world <= 1 else
            "no rank measured it (no process group in the traced steps, or a DDP model TraceML "
            "could not time: see the ranks' logs)")
    else:
        why = None
    return Communication(measured=bool(measured), ranks_measured=len(measured), not_measured_why=why,
                         spreads={k: spread(k) for k in CommSummary.FIGURES}, probe=probe)


#: signals that stop a run from outside (Ctrl-C, scancel, the time limit): a worker they ended did
#: not fail by itself
INTERRUPTS = ("SIGTERM", "SIGINT", "SIGHUP")


def _failed_by_itself(exit_: Optional[ExitRecord]) -> bool:
    """torchrun's record of a worker says it failed on its own (a signal other than an interrupt,
    or a failing exit code)."""
    if not exit_:
        return False
    if exit_.signal:
        return exit_.signal not in INTERRUPTS
    return exit_.exitcode not in (None, 0)


def _failed_before_interrupt(nodes: dict[int, NodeData], exits: dict[int, ExitRecord],
                             ranks: Sequence[RankSummary]) -> bool:
    """Whether the run had failed on its own before node 0's launcher was interrupted: torchrun
    recorded a failed worker (it records none when a SIGTERM stopped it), another node's
    launcher ended in error rather than interrupted, or a rank raised an exception of its own
    (the task layout has no torchrun, and a node's report there is its local rank 0's only).
    Then the SIGTERM was a consequence (srun --kill-on-bad-exit stopping the step after that
    rank failed), not the cause."""
    if any(_failed_by_itself(e) for e in exits.values()):
        return True
    if any(n != 0 and ni.bye is not None and ni.bye.status == "error" for n, ni in nodes.items()):
        return True
    return any(failed_by_itself(r) for r in ranks)


def _run_status(finish: Optional[Finish], ranks: Sequence[RankSummary], provisional: bool,
                failed_first: bool = False) -> str:
    if finish is None:
        if provisional:
            return "running"
        statuses = {r.status for r in ranks}
        if statuses == {"clean"}:
            return "completed"
        return "failed" if statuses & {"error", "crashed"} else "unknown"
    if finish.interrupted:
        return "failed" if failed_first else "interrupted"
    code = finish.exit_code
    if code is None:
        statuses = {r.status for r in ranks}
        if statuses == {"clean"}:
            return "completed"
        return "failed" if statuses & {"error", "crashed"} else "unknown"
    return "completed" if code == 0 else "failed"


def build_summary(data: RunData, *, files: Optional[dict[str, Any]] = None,
                  rebuilt: Optional[dict[str, Any]] = None, provisional: bool = False,
                  now: Optional[float] = None) -> dict[str, Any]:
    """The final summary dict. ``rebuilt``: ``{"checkpoint": path, "taken_at": ts}`` when it comes
    from a checkpoint instead of the live aggregator; ``provisional``: written on SIGTERM before
    the launcher reported the exit (a later write replaces it)."""
    now = time.time() if now is None else now
    s = data.settings
    finish = data.finish
    nnodes, nproc = s.nnodes, s.nproc_per_node
    world = nnodes * nproc
    nodes_data = data.node_by_id()
    failed_nodes = set(finish.failed_nodes if finish else [])
    by_rank = data.rank_by_id()
    exits, oom_by_node = _worker_reports(finish, nodes_data)
    run_end = (finish.at if finish else None) or (rebuilt or {}).get("taken_at") or now
    ranks: list[RankSummary] = []
    for rank in range(max([world] + [k + 1 for k in by_rank])):
        r = by_rank.get(rank)
        if r is None:
            ranks.append(_never_joined(rank, rank // nproc if nproc else 0, exits.get(rank)))
        else:
            ranks.append(_rank(r, _rank_status(r, finish, nodes_data, failed_nodes, provisional,
                                               exits.get(rank)),
                               exits.get(rank), run_end))

    hostnames = list(s.hostnames)
    by_node: dict[Any, list[int]] = {}
    for rs in ranks:  # once, not once per node: the summary's work stays linear in nodes + ranks
        by_node.setdefault(rs.node, []).append(rs.rank)
    topo_nodes = []
    for node in range(nnodes):
        ni = nodes_data.get(node) or NodeData(node)
        host = ni.host or (hostnames[node] if node < len(hostnames) else "")
        joined_at = ni.joined_at
        delay = None if joined_at is None else round(max(0.0, joined_at - s.started_at), 3)
        topo_nodes.append({
            "node": node, "hostname": host or None, "joined": joined_at is not None,
            "joined_at": iso(joined_at), "join_delay_s": delay,
            "late": bool(delay is not None and delay > s.late_after_s),
            "left_early": ni.left_at is not None or node in failed_nodes,
            "exit_code": ni.bye.exit_code if ni.bye else None,
            "ranks": by_node.get(node, []),
        })
    for rs in ranks:  # fill hostnames of ranks that never joined from the topology
        if not rs.host and 0 <= (rs.node or 0) < nnodes:
            rs.host = topo_nodes[rs.node or 0]["hostname"] or ""

    sys_nodes, gpus, gpu_util = _system(data)
    live_ranks = data.ranks
    sketches = {phase_name(c): merge_sketches(r.phase(c).sketch for r in live_ranks)
                for c in DURATION_COLUMNS}
    steps = step_time(sketches["step"])
    steps["steps"] = sum(r.phase("step_ns").count for r in live_ranks)  # exact, not sketched
    device = _device(ranks, gpus)
    communication = _communication(ranks, world, data.probe)
    cpu = [n["cpu_pct_mean"] for n in sys_nodes if n["cpu_pct_mean"] is not None]
    run_status = _run_status(finish, ranks, provisional, _failed_before_interrupt(nodes_data, exits, ranks))
    step_src = steps_block(live_ranks, ranks)
    joined_n = sum(1 for r in ranks if r.status != "never_joined")
    verdicts = judge(ranks, VerdictContext(
        gpus=gpus, gpu_util_pct=gpu_util, median_step_ms=steps["median_ms"],
        step_source=step_src["source"],
        no_steps=no_steps_reason(step_src, joined_n, world, run_status),
        device=device, communication=communication, world=world, nnodes=nnodes,
        cpu_busy_pct=max(cpu) if cpu else None, windows=run_windows(live_ranks),
        cpu_threads=_cpu_threads(live_ranks)))
    hang_report, ended_hung = _last_hang(data)
    failure = None if ended_hung else diagnose(ranks, oom_by_node, run_status)
    reason = finish.reason if finish else ""
    perf = [v for v in verdicts if v["kind"] != "no_clear_bottleneck"] or verdicts
    never_started = did_not_start(ranks, failure) if failure is not None else None
    if never_started is not None:  # no rank trained: nothing about steps or performance
        failure, perf = never_started, []
    if ended_hung:  # the run ended while hung: where every rank was stuck is the headline
        assert hang_report is not None
        verdicts = [hang_verdict(data.hangs[-1], ended_hung=True)] + perf
        short = "hung: " + hang_report["finding"]
        reason = f"{short}; {reason}" if reason else short
    elif failure is not None:  # failures first: the primary verdict is the failure
        verdicts = [failure] + perf
        short = failure.pop("reason")
        reason = f"{short}; {reason}" if reason else short
    elif run_status == "failed" and not reason:
        reason = _after_training_reason(finish, ranks) or "the launcher reported a failing exit code"
    if hang_report is not None and not ended_hung:  # a stall that resolved: worth a look
        verdicts = verdicts[:1] + [hang_verdict(data.hangs[-1], ended_hung=False)] + verdicts[1:]
    endings = {k: 0 for k in RANK_ENDINGS}
    for rs in ranks:
        endings[rs.status] = endings.get(rs.status, 0) + 1

    joined = [r for r in ranks if r.status != "never_joined"]
    tel = [r.telemetry for r in joined]
    received = sum(t.received for t in tel)
    expected = sum(t.expected or 0 for t in tel)
    started = s.started_at
    ended = (finish.at if finish else None) or (rebuilt or {}).get("taken_at") or now
    return {
        "schema_version": SCHEMA_VERSION,
        "provisional": provisional,
        "rebuilt": rebuilt,
        "run": {
            "name": s.run_name, "job_id": s.job_id, "mode": s.mode,
            "script": s.script or None, "script_args": s.script_args,
            "started_at": iso(started), "ended_at": iso(ended),
            "duration_s": round(max(0.0, ended - started), 3),
            "status": run_status,
            "exit_code": finish.exit_code if finish else None,
            "reason": reason,
            "finish_reported_by": finish.source if finish else None,
        },
        "topology": {"nnodes": nnodes, "nproc_per_node": nproc, "world_size": world,
                     "master_addr": s.master_addr or None,
                     "nodes_joined": sum(1 for n in topo_nodes if n["joined"]), "nodes": topo_nodes},
        "steps": step_src,
        "verdict": verdicts[0],
        "other_verdicts": verdicts[1:],
        "phases": [phase_name(c) for c in DURATION_COLUMNS] + ["nophase", "outside"],
        "warmup_steps": WARMUP_STEPS,
        "step_time": steps,
        "across_ranks": _across(joined),
        "device": device,
        "communication": communication.to_json(),
        "ranks": [r.to_json() for r in ranks],
        "rank_endings": {k: v for k, v in endings.items() if v},
        "system": {"nodes": sys_nodes, "gpu_util_pct_mean": gpu_util},
        "telemetry": {
            "records_received": received, "records_expected": expected,
            "records_lost": max(0, expected - received),
            "gaps": sum(t.gaps for t in tel), "duplicates": sum(t.duplicates for t in tel),
            "client_dropped": sum(t.client_dropped for t in tel),
            "relay_dropped": sum(t.relay_dropped for t in tel),
            # bounds of what nobody could count (ranks without a goodbye; see _unsent_bound):
            # None when one of them cannot be bounded
            "records_unsent_max": (None if any(t.unsent_max is None for t in tel)
                                   else sum(t.unsent_max or 0 for t in tel)),
            "ranks_without_goodbye": sum(1 for t in tel if t.unsent_max != 0),
            # complete: every record of every rank is accounted for, exactly. A summary rebuilt
            # from a mid-run checkpoint cannot know what came after it; a rank without a goodbye
            # may have produced records nobody saw
            "complete": (expected == received and endings.get("never_joined", 0) == 0
                         and all(t.unsent_max == 0 for t in tel)
                         and not (rebuilt and not rebuilt.get("final_checkpoint"))),
            "sketched_fraction": round(sum(t.sketched for t in tel) / received, 4) if received else None,
            "aggregator_restarts": data.resumed,
            "wire": dict(data.counters),
        },
        "compare": {
            "sketches": sketches,
            "step_series": merged_series(live_ranks),
        },
        "timeline": build_timeline(data, ranks, verdicts[0]),
        "files": files or {},
        "hang": hang_report,
        "hangs": [h.to_checkpoint() for h in data.hangs],
        "notes": [n for n in (data.run_dir_note, _after_training_note(finish, ranks),
                              _restart_note(data), _refused_note(data)) if n],
    }


def _refused_note(data: RunData) -> str:
    """Values the wire refused as not measurements (wire/frames.measured), if any."""
    n = data.counters.get("values_refused")
    if not n:
        return ""
    return (f"{n:,} value(s) sent by the ranks or nodes were not measurements (NaN, infinite, or past "
            "their field's physical bound, see docs/wire-protocol.md) and are left out as not measured")


def _last_hang(data: RunData) -> tuple[Optional[dict[str, Any]], bool]:
    """The last hang report (as the summary shows it), and whether the run ended still hung (no
    step record arrived after it). Earlier reports stay in ``hangs``."""
    if not data.hangs:
        return None, False
    last = data.hangs[-1]
    report = last.to_checkpoint()
    resumed = data.records > last.records_at
    report["resumed"] = resumed
    return report, not resumed


def _after_training_reason(finish: Optional[Finish], ranks: Sequence[RankSummary]) -> str:
    if not _after_training_note(finish, ranks):
        return ""
    died = [f"rank {r.rank} ({r.exit.signal or 'exit code ' + str(r.exit.exitcode)})"
            for r in ranks if r.exit]
    return ("every rank finished training cleanly; the failure came as the processes exited"
            + (": " + ", ".join(died) if died else ""))


def _after_training_note(finish: Optional[Finish], ranks: Sequence[RankSummary]) -> str:
    """A failing exit although every rank said a clean goodbye: the crash came after training
    (typically at interpreter exit), which torchrun's log alone makes look like a training failure."""
    code = finish.exit_code if finish else None
    if not ranks or type(code) is not int or code == 0:
        return ""
    if any(r.status != "clean" for r in ranks):
        return ""
    return ("every rank finished training and said a clean goodbye; the failing exit (code "
            f"{code}) came afterwards, as the processes ended (torchrun's log names the rank and "
            "its signal). A common cause is a DDP model still alive at interpreter exit, where "
            "gloo can abort the process: after dist.destroy_process_group(), `del model` and "
            "call gc.collect() (or train inside main(), which TraceML collects at exit)")
