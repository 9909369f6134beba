"""Build ``final_summary.json`` (``schema_version`` 1) from aggregate plain data.

The input is :meth:`RunState.to_data` (live) or the ``state`` of a checkpoint (rebuilt); the shape
of the output is documented in ``docs/summary-schema.md``. Cost is proportional to ranks x
(phases x sketch buckets + series buckets), never to steps.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from ..wire.protocol import DURATION_COLUMNS
from ..statistics.series import series_values
from .steps import no_steps_reason, steps_block
from .stats import merge_sketches, merged_series, mem_trend, median, ms, phase_quantiles, step_time
from .thresholds import WARMUP_STEPS
from .failure import diagnose, failed_by_itself
from .hang import verdict as hang_verdict
from .timeline import build_timeline
from .verdicts import judge

SCHEMA_VERSION = 1
QUANTILES = (0.5, 0.9, 0.99)
#: how each rank ended; "never_joined" is summary-only (the rank never completed a hello)
RANK_ENDINGS = ("clean", "error", "crashed", "vanished", "interrupted", "running", "never_joined")


def phase_name(column: str) -> str:
    return column[:-3] if column.endswith("_ns") else column


def iso(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    lt = time.localtime(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f".{int((ts % 1) * 1000):03d}" + time.strftime("%z", lt)


def _phase(ph: dict[str, Any]) -> Optional[dict[str, Any]]:
    if ph["count"] <= 0:
        return None
    steady_n = ph["count"] - ph["warm_count"]
    mean = ph["sum"] / ph["count"]
    steady = (ph["sum"] - ph["warm_sum"]) / steady_n if steady_n > 0 else mean
    p50, p90, p99 = phase_quantiles(ph, QUANTILES)
    return {"count": ph["count"], "mean_ms": ms(mean), "steady_mean_ms": ms(steady),
            "p50_ms": ms(p50), "p90_ms": ms(p90), "p99_ms": ms(p99), "max_ms": ms(ph["max"])}


def _rank_status(r: dict[str, Any], finish: Optional[dict[str, Any]], nodes: dict[int, Any],
                 failed_nodes: set[int], provisional: bool, exit_: Optional[dict[str, Any]] = None) -> str:
    """How a rank ended: its own bye wins; then torchrun's record of it (a worker torchrun saw die
    by a signal or a failing exit crashed, on any node: its node's launcher passes the record on);
    else what the launcher reported decides."""
    bye = r.get("bye")
    if bye:
        return bye["status"]
    if _failed_by_itself(exit_):
        return "crashed"
    node = r.get("node")
    ni = nodes.get(node) if node is not None else None
    if node in failed_nodes or (ni is not None and ni.get("left_at") is not None):
        return "vanished"
    if finish is None:
        # provisional (SIGTERM, launcher still to report): still connected = still running;
        # otherwise (rebuilt, or all ranks gone) we cannot know more than "vanished"
        return "running" if provisional and r.get("connected") else "vanished"
    if finish.get("interrupted"):
        return "interrupted"
    code = finish.get("exit_code")
    if code is not None and code != 0:
        return "crashed"
    return "vanished"


def _comm(r: dict[str, Any], phases: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A rank's communication per steady step (see docs/summary-schema.md), or None if not measured.

    Bandwidths are nccl-tests': ``algbw = S / t`` and ``busbw = S * factor / t``, with ``S`` the
    bytes and ``t`` the time collectives were in flight, summed over the steady steps."""
    sums = r.get("sums") or {}
    busy, nbytes = sums.get("comm_busy_ns"), sums.get("comm_bytes")
    bus, calls = sums.get("comm_bus_bytes"), sums.get("comm_calls")
    exposed = phases.get("comm")
    if not exposed or not busy or not busy["count"] or not nbytes or not bus or not calls:
        return None

    def steady(st: dict[str, Any]) -> tuple[float, int]:
        n = st["count"] - st["warm_count"]
        return (st["sum"] - st["warm_sum"], n) if n > 0 else (st["sum"], st["count"])

    busy_ns, n = steady(busy)
    step = (phases.get("step") or {}).get("steady_mean_ms")
    xms = exposed["steady_mean_ms"]
    return {
        "steps": busy["count"],
        "exposed_ms": xms,
        "exposed_fraction": round(xms / step, 4) if step else None,
        "busy_ms": ms(busy_ns / n),
        "overlap_fraction": (round(max(0.0, 1.0 - xms * 1e6 / (busy_ns / n)), 4)
                             if busy_ns > 0 else None),
        "bytes_per_step": int(steady(nbytes)[0] / n),
        "calls_per_step": round(steady(calls)[0] / n, 2),
        "algbw_gbps": round(steady(nbytes)[0] / busy_ns, 4) if busy_ns > 0 else None,
        "busbw_gbps": round(steady(bus)[0] / busy_ns, 4) if busy_ns > 0 else None,
    }


def _failed_at(r: dict[str, Any], status: str) -> Optional[float]:
    """When a failed rank's failure was seen (epoch seconds): its exception's own time stamp,
    else its goodbye's arrival, else when its connection closed."""
    if status in ("clean", "running"):
        return None
    for e in reversed(r.get("events", [])):
        if e.get("kind") == "exception" and isinstance(e.get("ts"), (int, float)):
            return float(e["ts"])
    bye = r.get("bye") or {}
    if bye.get("at") is not None:
        return float(bye["at"])
    return r.get("closed_at")


def _worker_reports(finish: Optional[dict[str, Any]], nodes: dict[int, Any]) -> tuple[dict[int, Any], dict[int, Any]]:
    """torchrun's failed-worker rows by global rank, and each node's OOM report by node (node 0's
    come with the launcher's finish, the others' with their node launcher's goodbye)."""
    workers: dict[int, Any] = {}
    oom: dict[int, Any] = {}
    reports = [(0, finish)] + [(n, (ni or {}).get("bye")) for n, ni in nodes.items() if n != 0]
    for node, rep in reports:
        if not rep:
            continue
        for w in rep.get("workers") or []:
            workers[w["rank"]] = {"exitcode": w.get("exitcode"), "signal": w.get("signal")}
        if "oom" in rep:
            oom[node] = rep.get("oom")
    return workers, oom


def _restart_note(data: dict[str, Any]) -> str:
    n = data.get("resumed") or 0
    if not n:
        return ""
    return (f"node 0's aggregator died during the run and was restarted {n} time(s) from its last "
            "checkpoint; records it had received after that checkpoint are counted as lost "
            "(telemetry.records_lost), the rest is in these statistics")


def _unsent_bound(r: dict[str, Any], ended: float) -> Optional[int]:
    """Records a rank may have produced that nobody could count (beyond ``expected``).

    0 after its ``bye``: the total it says there is exact. Without one (killed, or its node's
    launcher died), what its relay computed when the connection closed: what the rank last said
    it held unsent (its open batch and queue) plus its step rate over the time since that report.
    When even the relay's link was gone, the same from node 0's view: its last report plus its
    step rate until the run ended (an upper estimate: a rank rarely outlives its launcher long).
    None when nothing bounds it (no step ever arrived)."""
    if r.get("bye"):
        return 0
    if r.get("open_bound") is not None:
        return int(r["open_bound"])
    first, last, n = r.get("first_t_end"), r.get("last_t_end"), r.get("received", 0)
    seen = r.get("last_seen")
    if not n or first is None or last is None or seen is None:
        return None
    rate = (n - 1) / ((last - first) / 1e9) if last > first and n > 1 else 0.0
    return int(r.get("last_open") or 0) + math.ceil(rate * max(0.0, ended - seen))


def _rank(r: dict[str, Any], status: str, exit_: Optional[dict[str, Any]] = None,
          ended: Optional[float] = None) -> dict[str, Any]:
    phases = {phase_name(c): _phase(r["phases"][c]) for c in DURATION_COLUMNS}
    step = r["phases"]["step_ns"]
    steady = max(0, step["count"] - step["warm_count"])
    out = r["outside"]
    mem = r["mem"]
    # a rank's relay reports how far its seq went, so records it had to drop at the end count too
    expected = max(r["next_seq"], (r.get("bye") or {}).get("steps") or 0, r.get("relay_seq_end", 0))
    bye = r.get("bye") or {}
    errors = [e["text"] for e in r.get("events", []) if e.get("kind") in ("exception", "error")]
    return {
        "rank": r["rank"], "node": r["node"], "host": r["host"], "local_rank": r["local_rank"],
        "status": status, "error": bye.get("error") or (errors[-1] if errors else None),
        "steps": r["received"], "steady_steps": steady, "last_step": r["last_step"],
        "steps_produced": bye.get("steps"), "fail_step": bye.get("fail_step"),
        "fail_in_step": bool(bye.get("fail_in_step")),
        "failed_at": _failed_at(r, status), "exit": exit_,
        "phases": phases,
        "outside_ms": ms(out["sum"] / out["count"]) if out["count"] else None,
        "comm": _comm(r, phases),
        "mem_peak": ({"max_bytes": mem["max"], "mean_bytes": int(mem["sum"] / mem["count"]),
                      "trend": mem_trend(series_values(r["series"], "mem_max"))} if mem["count"] else None),
        "telemetry": {"received": r["received"], "expected": expected,
                      "lost": max(0, expected - r["received"]),
                      "unsent_max": _unsent_bound(r, ended if ended is not None else time.time()),
                      "gaps": r["gaps"],
                      "duplicates": r["duplicates"], "client_dropped": r["client_dropped"],
                      "relay_dropped": r.get("relay_dropped", 0),
                      "rejected": r.get("rejected", 0),
                      "reconnects": max(0, r["connections"] - 1),
                      "sketched": r.get("sketched", r["received"])},
        "events": r.get("event_count", 0),
        "last_events": r.get("events", [])[-3:],
    }


def _never_joined(rank: int, node: int, exit_: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"rank": rank, "node": node, "host": "", "local_rank": None, "status": "never_joined",
            "error": None, "steps": 0, "steady_steps": 0, "last_step": -1,
            "steps_produced": None, "fail_step": None, "fail_in_step": False, "failed_at": None,
            "exit": exit_,
            "phases": {phase_name(c): None for c in DURATION_COLUMNS}, "outside_ms": None,
            "comm": None, "mem_peak": None,
            "telemetry": {"received": 0, "expected": None, "lost": None, "unsent_max": None,
                          "gaps": 0, "duplicates": 0,
                          "client_dropped": 0, "relay_dropped": 0, "rejected": 0, "reconnects": 0,
                          "sketched": 0},
            "events": 0, "last_events": []}


def _across(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in DURATION_COLUMNS + ("outside",):
        name = phase_name(c)
        vals = []
        for r in ranks:
            v = r["outside_ms"] if name == "outside" else (r["phases"][name] or {}).get("steady_mean_ms")
            if v is not None:
                vals.append((v, r["rank"], r["node"]))
        if not vals:
            out[name] = None
            continue
        mid = median([v for v, _, _ in vals])
        worst = max(vals)
        out[name] = {"ranks": len(vals), "median_ms": round(mid, 4) if mid is not None else None,
                     "worst_rank": worst[1], "worst_node": worst[2], "worst_ms": worst[0],
                     "skew": round(worst[0] / mid, 3) if mid else None}
    return out


def _mean(run: dict[str, Any]) -> Optional[float]:
    return run["sum"] / run["n"] if run["n"] else None


def _system(data: dict[str, Any]) -> dict[str, Any]:
    nodes = []
    gpus_flat = []
    for ns in data.get("system", []):
        gpus = []
        for g in ns["gpus"]:
            util = _mean(g["util_pct"])
            gs = {"index": g["index"], "samples": g["util_pct"]["n"],
                  "util_pct_mean": None if util is None else round(util, 2),
                  "util_pct_max": g["util_pct"]["max"], "mem_used_max": g["mem_used"]["max"],
                  "mem_total": g["mem_total"]["max"], "temp_c_max": g["temp_c"]["max"],
                  "power_w_mean": None if _mean(g["power_w"]) is None else round(_mean(g["power_w"]), 2),
                  "power_w_max": g["power_w"]["max"]}
            gpus.append(gs)
            gpus_flat.append({**gs, "node": ns["node"]})
        cpu = _mean(ns["cpu_pct"])
        nodes.append({"node": ns["node"], "host": ns["host"], "samples": ns["samples"],
                      "cpu_pct_mean": None if cpu is None else round(cpu, 2),
                      "cpu_pct_max": ns["cpu_pct"]["max"], "ram_used_max": ns["ram_used"]["max"],
                      "ram_total": ns["ram_total"]["max"], "gpus": gpus})
    utils = [g["util_pct_mean"] for g in gpus_flat if g["util_pct_mean"] is not None]
    return {"nodes": nodes,
            "gpu_util_pct_mean": round(sum(utils) / len(utils), 2) if utils else None,
            "gpus": gpus_flat}


def _device(ranks: list[dict[str, Any]], system: dict[str, Any]) -> str:
    """What the ranks computed on, as far as was measured: ``cuda`` when their phases were timed
    with CUDA events (the SDK does so for a model on a GPU; ``h2d`` is measured only then) or the
    nodes' GPUs were busy; ``cpu`` when no rank used CUDA timing and no node reported a GPU;
    ``unknown`` otherwise (GPUs present but idle, e.g. a script that never passed its model to
    trace_step). Advice is chosen by it: no GPU advice on a CPU run."""
    if any((r["phases"].get("h2d") or {}).get("count") for r in ranks):
        return "cuda"
    gpus = system.get("gpus") or []
    if any((g.get("util_pct_mean") or 0) > 5 for g in gpus):
        return "cuda"
    if not gpus and any(r["phases"].get("step") for r in ranks):
        return "cpu"
    return "unknown"


def _communication(ranks: list[dict[str, Any]], world: int, probe: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Run-level communication: the ranks' figures side by side (median, least, most)."""
    measured = [r for r in ranks if r.get("comm")]

    def spread(key: str) -> Optional[dict[str, Any]]:
        vals = [(r["comm"][key], r["rank"]) for r in measured if r["comm"].get(key) is not None]
        if not vals:
            return None
        lo, hi = min(vals), max(vals)
        return {"median": round(median([v for v, _ in vals]) or 0.0, 4), "min": lo[0],
                "min_rank": lo[1], "max": hi[0], "max_rank": hi[1]}

    if not measured:
        why = ("a single process: nothing to communicate" if world <= 1 else
               "no rank measured it (no process group in the traced steps, or a DDP model TraceML "
               "could not time: see the ranks' logs)")
    else:
        why = None
    return {
        "measured": bool(measured), "ranks_measured": len(measured), "not_measured_why": why,
        "exposed_ms": spread("exposed_ms"), "exposed_fraction": spread("exposed_fraction"),
        "busy_ms": spread("busy_ms"), "overlap_fraction": spread("overlap_fraction"),
        "bytes_per_step": spread("bytes_per_step"), "calls_per_step": spread("calls_per_step"),
        "algbw_gbps": spread("algbw_gbps"), "busbw_gbps": spread("busbw_gbps"),
        "probe": probe,
    }


#: signals that stop a run from outside (Ctrl-C, scancel, the time limit): a worker they ended did
#: not fail by itself
INTERRUPTS = ("SIGTERM", "SIGINT", "SIGHUP")


def _failed_by_itself(exit_: Optional[dict[str, Any]]) -> bool:
    """torchrun's record of a worker says it failed on its own (a signal other than an interrupt,
    or a failing exit code)."""
    if not exit_:
        return False
    if exit_.get("signal"):
        return exit_["signal"] not in INTERRUPTS
    return exit_.get("exitcode") not in (None, 0)


def _failed_before_interrupt(nodes: dict[int, Any], exits: dict[int, Any],
                             ranks: list[dict[str, Any]]) -> bool:
    """Whether the run had failed on its own before node 0's launcher was interrupted: torchrun
    recorded a failed worker (it records none when a SIGTERM stopped it), another node's
    launcher ended in error rather than interrupted, or a rank raised an exception of its own
    (the task layout has no torchrun, and a node's report there is its local rank 0's only).
    Then the SIGTERM was a consequence (srun --kill-on-bad-exit stopping the step after that
    rank failed), not the cause."""
    if any(_failed_by_itself(e) for e in exits.values()):
        return True
    if any(n != 0 and ((ni or {}).get("bye") or {}).get("status") == "error" for n, ni in nodes.items()):
        return True
    return any(failed_by_itself(r) for r in ranks)


def _run_status(finish: Optional[dict[str, Any]], ranks: list[dict[str, Any]], provisional: bool,
                failed_first: bool = False) -> str:
    if finish is None:
        if provisional:
            return "running"
        statuses = {r["status"] for r in ranks}
        if statuses == {"clean"}:
            return "completed"
        return "failed" if statuses & {"error", "crashed"} else "unknown"
    if finish.get("interrupted"):
        return "failed" if failed_first else "interrupted"
    code = finish.get("exit_code")
    if code is None:
        statuses = {r["status"] for r in ranks}
        if statuses == {"clean"}:
            return "completed"
        return "failed" if statuses & {"error", "crashed"} else "unknown"
    return "completed" if code == 0 else "failed"


def build_summary(data: dict[str, Any], *, files: Optional[dict[str, Any]] = None,
                  rebuilt: Optional[dict[str, Any]] = None, provisional: bool = False,
                  now: Optional[float] = None) -> dict[str, Any]:
    """The final summary dict. ``rebuilt``: ``{"checkpoint": path, "taken_at": ts}`` when it comes
    from a checkpoint instead of the live aggregator; ``provisional``: written on SIGTERM before
    the launcher reported the exit (a later write replaces it)."""
    now = time.time() if now is None else now
    s = data["settings"]
    finish = data.get("finish")
    nnodes, nproc = s["nnodes"], s["nproc_per_node"]
    world = nnodes * nproc
    nodes_data = {n["node"]: n for n in data.get("nodes", [])}
    failed_nodes = set((finish or {}).get("failed_nodes") or [])
    by_rank = {r["rank"]: r for r in data.get("ranks", [])}
    exits, oom_by_node = _worker_reports(finish, nodes_data)
    run_end = (finish or {}).get("at") or (rebuilt or {}).get("taken_at") or now
    ranks: list[dict[str, Any]] = []
    for rank in range(max([world] + [k + 1 for k in by_rank])):
        r = by_rank.get(rank)
        if r is None:
            ranks.append(_never_joined(rank, rank // nproc if nproc else 0, exits.get(rank)))
        else:
            ranks.append(_rank(r, _rank_status(r, finish, nodes_data, failed_nodes, provisional,
                                               exits.get(rank)),
                               exits.get(rank), run_end))

    hostnames = list(s.get("hostnames") or [])
    by_node: dict[Any, list[int]] = {}
    for r in ranks:  # once, not once per node: the summary's work stays linear in nodes + ranks
        by_node.setdefault(r["node"], []).append(r["rank"])
    topo_nodes = []
    for node in range(nnodes):
        ni = nodes_data.get(node) or {}
        host = ni.get("host") or (hostnames[node] if node < len(hostnames) else "")
        joined_at = ni.get("joined_at")
        delay = None if joined_at is None else round(max(0.0, joined_at - s["started_at"]), 3)
        topo_nodes.append({
            "node": node, "hostname": host or None, "joined": joined_at is not None,
            "joined_at": iso(joined_at), "join_delay_s": delay,
            "late": bool(delay is not None and delay > s.get("late_join_s", s["node_join_window_s"])),
            "left_early": ni.get("left_at") is not None or node in failed_nodes,
            "exit_code": (ni.get("bye") or {}).get("exit_code"),
            "ranks": by_node.get(node, []),
        })
    for r in ranks:  # fill hostnames of ranks that never joined from the topology
        if not r["host"] and 0 <= (r["node"] or 0) < nnodes:
            r["host"] = topo_nodes[r["node"] or 0]["hostname"] or ""

    system = _system(data)
    live_ranks = [by_rank[r] for r in sorted(by_rank)]
    sketches = {phase_name(c): merge_sketches(r["phases"][c]["sketch"] for r in live_ranks)
                for c in DURATION_COLUMNS}
    steps = step_time(sketches["step"])
    steps["steps"] = sum(r["phases"]["step_ns"]["count"] for r in live_ranks)  # exact, not sketched
    device = _device(ranks, system)
    communication = _communication(ranks, world, data.get("probe"))
    cpu = [n["cpu_pct_mean"] for n in system["nodes"] if n["cpu_pct_mean"] is not None]
    run_status = _run_status(finish, ranks, provisional, _failed_before_interrupt(nodes_data, exits, ranks))
    step_src = steps_block(live_ranks, ranks)
    joined_n = sum(1 for r in ranks if r["status"] != "never_joined")
    verdicts = judge(ranks, {"gpus": system["gpus"], "gpu_util_pct": system["gpu_util_pct_mean"],
                             "median_step_ms": steps["median_ms"], "step_source": step_src["source"],
                             "no_steps": no_steps_reason(step_src, joined_n, world, run_status),
                             "device": device, "communication": communication, "world": world,
                             "nnodes": nnodes, "cpu_busy_pct": max(cpu) if cpu else None})
    hang_report, ended_hung = _last_hang(data)
    failure = None if ended_hung else diagnose(ranks, oom_by_node, run_status)
    reason = (finish or {}).get("reason") or ""
    perf = [v for v in verdicts if v["kind"] != "no_clear_bottleneck"] or verdicts
    if ended_hung:  # the run ended while hung: where every rank was stuck is the headline
        verdicts = [hang_verdict(hang_report, ended_hung=True)] + perf
        short = "hung: " + hang_report["finding"]
        reason = f"{short}; {reason}" if reason else short
    elif failure is not None:  # failures first: the primary verdict is the failure
        verdicts = [failure] + perf
        short = failure.pop("reason")
        reason = f"{short}; {reason}" if reason else short
    elif run_status == "failed" and not reason:
        reason = _after_training_reason(finish, ranks) or "the launcher reported a failing exit code"
    if hang_report is not None and not ended_hung:  # a stall that resolved: worth a look
        verdicts = verdicts[:1] + [hang_verdict(hang_report, ended_hung=False)] + verdicts[1:]
    endings = {k: 0 for k in RANK_ENDINGS}
    for r in ranks:
        endings[r["status"]] = endings.get(r["status"], 0) + 1

    joined = [r for r in ranks if r["status"] != "never_joined"]
    tel = [r["telemetry"] for r in joined]
    received = sum(t["received"] for t in tel)
    expected = sum(t["expected"] or 0 for t in tel)
    started = s["started_at"]
    ended = (finish or {}).get("at") or (rebuilt or {}).get("taken_at") or now
    return {
        "schema_version": SCHEMA_VERSION,
        "provisional": provisional,
        "rebuilt": rebuilt,
        "run": {
            "name": s["run_name"], "job_id": s.get("job_id"), "mode": s.get("mode"),
            "script": s.get("script") or None, "script_args": s.get("script_args"),
            "started_at": iso(started), "ended_at": iso(ended),
            "duration_s": round(max(0.0, ended - started), 3),
            "status": run_status,
            "exit_code": (finish or {}).get("exit_code"),
            "reason": reason,
            "finish_reported_by": (finish or {}).get("source"),
        },
        "topology": {"nnodes": nnodes, "nproc_per_node": nproc, "world_size": world,
                     "master_addr": s.get("master_addr") or None,
                     "nodes_joined": sum(1 for n in topo_nodes if n["joined"]), "nodes": topo_nodes},
        "steps": step_src,
        "verdict": verdicts[0],
        "other_verdicts": verdicts[1:],
        "phases": [phase_name(c) for c in DURATION_COLUMNS] + ["outside"],
        "warmup_steps": WARMUP_STEPS,
        "step_time": steps,
        "across_ranks": _across(joined),
        "device": device,
        "communication": communication,
        "ranks": ranks,
        "rank_endings": {k: v for k, v in endings.items() if v},
        "system": {"nodes": system["nodes"], "gpu_util_pct_mean": system["gpu_util_pct_mean"]},
        "telemetry": {
            "records_received": received, "records_expected": expected,
            "records_lost": max(0, expected - received),
            "gaps": sum(t["gaps"] for t in tel), "duplicates": sum(t["duplicates"] for t in tel),
            "client_dropped": sum(t["client_dropped"] for t in tel),
            "relay_dropped": sum(t.get("relay_dropped", 0) for t in tel),
            # bounds of what nobody could count (ranks without a goodbye; see _unsent_bound):
            # None when one of them cannot be bounded
            "records_unsent_max": (None if any(t["unsent_max"] is None for t in tel)
                                   else sum(t["unsent_max"] for t in tel)),
            "ranks_without_goodbye": sum(1 for t in tel if t["unsent_max"] != 0),
            # complete: every record of every rank is accounted for, exactly. A summary rebuilt
            # from a mid-run checkpoint cannot know what came after it; a rank without a goodbye
            # may have produced records nobody saw
            "complete": (expected == received and endings.get("never_joined", 0) == 0
                         and all(t["unsent_max"] == 0 for t in tel)
                         and not (rebuilt and not rebuilt.get("final_checkpoint"))),
            "sketched_fraction": round(sum(t["sketched"] for t in tel) / received, 4) if received else None,
            "aggregator_restarts": data.get("resumed", 0),
            "wire": data.get("counters", {}),
        },
        "compare": {
            "sketches": sketches,
            "step_series": merged_series(live_ranks),
        },
        "timeline": build_timeline(data, ranks, verdicts[0]),
        "files": files or {},
        "hang": hang_report,
        "hangs": list(data.get("hangs") or []),
        "notes": [n for n in (data.get("run_dir_note"), _after_training_note(finish, ranks),
                              _restart_note(data)) if n],
    }


def _last_hang(data: dict[str, Any]) -> tuple[Optional[dict[str, Any]], bool]:
    """The last hang report, and whether the run ended still hung (no step record arrived after
    it). Earlier reports stay in ``hangs``."""
    hangs = data.get("hangs") or []
    if not hangs:
        return None, False
    report = dict(hangs[-1])
    resumed = int(data.get("records") or 0) > int(report.get("records_at") or 0)
    report["resumed"] = resumed
    return report, not resumed


def _after_training_reason(finish: Optional[dict[str, Any]], ranks: list[dict[str, Any]]) -> str:
    if not _after_training_note(finish, ranks):
        return ""
    died = [f"rank {r['rank']} ({r['exit']['signal'] or 'exit code ' + str(r['exit']['exitcode'])})"
            for r in ranks if r.get("exit")]
    return ("every rank finished training cleanly; the failure came as the processes exited"
            + (": " + ", ".join(died) if died else ""))


def _after_training_note(finish: Optional[dict[str, Any]], ranks: list[dict[str, Any]]) -> str:
    """A failing exit although every rank said a clean goodbye: the crash came after training
    (typically at interpreter exit), which torchrun's log alone makes look like a training failure."""
    code = (finish or {}).get("exit_code")
    if not ranks or type(code) is not int or code == 0:
        return ""
    if any(r["status"] != "clean" for r in ranks):
        return ""
    return ("every rank finished training and said a clean goodbye; the failing exit (code "
            f"{code}) came afterwards, as the processes ended (torchrun's log names the rank and "
            "its signal). A common cause is a DDP model still alive at interpreter exit, where "
            "gloo can abort the process: after dist.destroy_process_group(), `del model` and "
            "call gc.collect() (or train inside main(), which TraceML collects at exit)")
