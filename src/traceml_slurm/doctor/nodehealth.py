"""The doctor and the user's node store (docs/node-health.md): what the doctor measured of each
node goes into the store, and the doctor ends with the line for the next job script when a host
of this cluster is bad enough (from this doctor and the user's earlier jobs).

What the doctor adds, as one record of source ``doctor`` (a run of the same job is the same
sample of it): its link probe's best send and receive rate of each node
(``cross.link-bandwidth``), judged by the probe's own rule against the other nodes of the job
(core's ``link_observations_of``), and its micro-benchmarks (``cross.compute-speed``: the CPU
matmul, each node's slowest GPU's matmul and host-to-device copy), judged by core's rule for rates
measured on each node (``slower_than_peers``); and NVML's health of each node's GPUs
(``gpu.health``: a hardware fault is strong evidence, a thermal or power slowdown is bad when it
repeats). A doctor that measured nothing to compare
(``--local``, one node) adds nothing but still shows what the store says of the hosts.
"""

from __future__ import annotations

import time
from typing import Optional

from traceml_core.plugins import NextJob, NodeObservation, RunEvidence
from traceml_core.selftest import link_observations_of

from ..facts import Facts
from .crossnode import BENCH_KINDS, bench_observations
from .model import CheckResult, Report

LINK_CHECK = "cross.link-bandwidth"
SPEED_CHECK = "cross.compute-speed"
HEALTH_CHECK = "gpu.health"


def evidence(report: Report) -> Optional[RunEvidence]:
    """This doctor's node evidence, or None when it measured nothing to compare."""
    if report.job.job_id is None:
        return None
    obs: list[NodeObservation] = []
    hosts: list[str] = []
    link = _check(report, LINK_CHECK)
    if link is not None:
        nodes = [{"host": host, "gbps": o.data.get("gbps"), "recv_gbps": o.data.get("recv_gbps")}
                 for host, o in link.nodes.items()
                 if o.data.get("gbps") is not None or o.data.get("recv_gbps") is not None]
        found = link_observations_of(nodes)
        obs += found
        hosts += [n["host"] for n in nodes] if found else []
    speed = _check(report, SPEED_CHECK)
    if speed is not None:
        figures = {host: {kind: o.data.get(kind) for kind, _, _ in BENCH_KINDS} for host, o in speed.nodes.items()}
        quotas = {host: {k: o.data.get(k) for k in ("cpu_quota", "cpu_throttled")} for host, o in speed.nodes.items()}
        found = bench_observations(figures, quotas)
        obs += found
        hosts += [h for h, f in figures.items() if any(v is not None for v in f.values())] if found else []
    health = _check(report, HEALTH_CHECK)
    if health is not None:
        for host, o in health.nodes.items():
            found = gpu_health_observation(host, o.data)
            if found is not None:
                obs.append(found)
                hosts.append(host)
    if not obs:
        return None
    return RunEvidence(job_id=report.job.job_id, run_name="doctor", at=time.time(), source="doctor",
                       hosts=tuple(dict.fromkeys(hosts)), observations=tuple(obs))


def gpu_health_observation(host: str, data: dict) -> Optional[NodeObservation]:
    """One node's ``gpu.health`` outcome as node evidence: a hardware fault is bad and *strong*
    (no repetition needed), a thermal or power slowdown bad; a node whose GPUs NVML read clean is
    a clean observation; None when no device was read."""
    if not data.get("devices"):
        return None
    faults, slowdowns = list(data.get("faults") or []), list(data.get("slowdowns") or [])
    if faults or slowdowns:
        note = "; ".join(faults + slowdowns)
    else:
        note = f"{len(data['devices'])} GPU(s) healthy"
    return NodeObservation(host, "gpu_health", float(len(faults) + len(slowdowns)), None, "GPUs",
                           bool(faults or slowdowns), bool(faults), note=note[:300])


def _check(report: Report, cid: str) -> Optional[CheckResult]:
    return next((r for r in report.results if r.id == cid and not r.ignored), None)


def next_job(report: Report, facts: Facts) -> Optional[NextJob]:
    """Record this doctor's evidence (if any) and answer with the store's lines; never raises."""
    if not facts.in_job:
        return None
    try:
        from ..environment import _job_hosts
        from ..nodes import checked, next_job as answer, record

        # the job's nodes as Slurm gave them: the environment's list, else the one the doctor resolved
        kept, notes = checked(evidence(report), facts.job_id, _job_hosts(facts) or tuple(report.job.nodes or ()))
        health, more = record(facts.node_store, facts.cluster_name, kept)
        return answer(health, notes + more)
    except Exception as exc:  # noqa: BLE001 - node health must never cost the doctor
        return NextJob(notes=(f"node health could not be judged ({type(exc).__name__}: {str(exc)[:200]})",))
