"""The doctor and the user's node store (docs/node-health.md): what the doctor measured of each
node goes into the store, and the doctor ends with the line for the next job script when a host
of this cluster is bad enough (from this doctor and the user's earlier jobs).

What the doctor adds: its link probe's best send and receive rate of each node
(``cross.link-bandwidth``), judged by the probe's own rule against the other nodes of the job
(core's ``link_observations_of``), as one record of source ``doctor``; a run of the same job is
the same sample of it. A doctor that measured no link (``--local``, two nodes, the probe skipped)
adds nothing but still shows what the store says of the hosts.
"""

from __future__ import annotations

import time
from typing import Optional

from traceml_core.plugins import NextJob, RunEvidence
from traceml_core.selftest import link_observations_of

from ..facts import Facts
from .model import Report

LINK_CHECK = "cross.link-bandwidth"


def evidence(report: Report) -> Optional[RunEvidence]:
    """This doctor's node evidence, or None when it measured nothing to compare."""
    check = next((r for r in report.results if r.id == LINK_CHECK), None)
    if check is None or report.job.job_id is None:
        return None
    nodes = [{"host": host, "gbps": o.data.get("gbps"), "recv_gbps": o.data.get("recv_gbps")}
             for host, o in check.nodes.items() if o.data.get("gbps") is not None or o.data.get("recv_gbps") is not None]
    obs = link_observations_of(nodes)
    if not obs:
        return None
    return RunEvidence(job_id=report.job.job_id, run_name="doctor", at=time.time(), source="doctor",
                       hosts=tuple(n["host"] for n in nodes), observations=tuple(obs))


def next_job(report: Report, facts: Facts) -> Optional[NextJob]:
    """Record this doctor's evidence (if any) and answer with the store's lines; never raises."""
    if not facts.in_job:
        return None
    try:
        from ..nodes import next_job as answer, record

        return answer(*record(facts.node_store, facts.cluster_name, evidence(report)))
    except Exception as exc:  # noqa: BLE001 - node health must never cost the doctor
        return NextJob(notes=(f"node health could not be judged ({type(exc).__name__}: {str(exc)[:200]})",))
