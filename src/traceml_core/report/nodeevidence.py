"""What one run's summary says about each of its nodes, judged against the other nodes of the run.

A pure function of the typed summary (:class:`~.document.Summary`): the cluster plugin keeps these
observations across the user's jobs and decides from many runs whether a node is bad
(``traceml_slurm/nodes``); one run only says whether a node was worse than its peers *in this
run*, by the rule each kind already has:

* ``link_send`` / ``link_recv``: the link probe's best rate of each node against the median of the
  other nodes' (3 nodes or more: with two, a slow pair cannot be pinned on either end), slow below
  ``PROBE_SLOW_FRACTION`` (the probe's own rule, thresholds.py);
* ``compute``: each node's median own time per step (step - the wait for the others + the time
  between steps, verdicts.own_time) against the other nodes'; bad only for the node of the rank the
  straggler verdict names, and only when the excess is in the node's work: not between steps
  (logging, evaluation on one rank is the script's doing) and not on rank 0 (rank-0-only work is
  the usual cause there, whichever node holds it);
* ``failure``: the node whose launcher, torchrun or rank failed first by a signal or vanished (a
  Python exception or an exit code is the script's, not the node's);
* ``oom``: a node whose ranks the OOM killer took while another node's did not;
* ``missing``: a node that never joined, or whose ranks never arrived where the others waited
  (the hang report's culprits, all on one node of several).
"""

from __future__ import annotations

import time
from typing import Mapping, Optional

from ..plugins import NodeObservation, RunEvidence
from .document import Summary, Verdict
from .model import RankSummary
from .stats import median
from .thresholds import MIN_STEPS, PROBE_SLOW_FRACTION
from .verdicts import own_time

#: failure causes that are the script's own (report/failure.py: classify), not evidence of a node: a
#: collective mismatch (the ranks' calls differ) and a rank that finished early (its data ran out)
#: follow the script wherever it runs
SCRIPT_CAUSES = frozenset({"exception", "exit", "interrupted", "never_joined", "unknown",
                           "collective_mismatch", "left_early"})
#: signals a user or the scheduler sends to stop a run
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"})


def run_evidence(summary: Summary, *, source: str = "run", at: Optional[float] = None) -> RunEvidence:
    hosts = node_hosts(summary)
    obs: list[NodeObservation] = []
    obs += link_observations(summary)
    obs += compute_observations(summary, hosts)
    obs += failure_observations(summary, hosts)
    obs += missing_observations(summary, hosts)
    return RunEvidence(job_id=summary.run.job_id, run_name=summary.run.name or "", source=source,
                       at=time.time() if at is None else at,
                       hosts=tuple(h for h in hosts.values() if h), observations=tuple(obs))


def node_hosts(summary: Summary) -> dict[int, str]:
    """Host name by node rank (the topology's, else a rank's)."""
    out = {n.node: n.hostname or "" for n in summary.topology.nodes}
    for r in summary.ranks:
        if r.node is not None and r.host and not out.get(r.node):
            out[r.node] = r.host
    return out


def link_observations(summary: Summary) -> list[NodeObservation]:
    probe = (summary.communication.probe if summary.communication else None) or {}
    return [] if probe.get("error") else link_observations_of(probe.get("nodes") or [])


def link_observations_of(nodes: list[dict]) -> list[NodeObservation]:
    """The link probe's rule on its per-node best rates (``{"host", "gbps", "recv_gbps"}``: a run's
    probe, or the doctor's, which runs the same probe). With two nodes a slow pair cannot be pinned
    on either end: nothing."""
    nodes = [n for n in nodes if n.get("host")]
    if len(nodes) < 3:
        return []
    out = []
    for key, kind, verb in (("gbps", "link_send", "sends"), ("recv_gbps", "link_recv", "receives")):
        out += slower_than_peers({n["host"]: n.get(key) for n in nodes}, kind, "GB/s", verb, PROBE_SLOW_FRACTION)
    return out


def slower_than_peers(values: Mapping[str, Optional[float]], kind: str, unit: str, verb: str,
                      fraction: float) -> list[NodeObservation]:
    """One rule for every rate measured on each node of a job (the link probe's, the doctor's
    matmul and host-to-device copy): a node is worse than its peers when its rate is below
    ``fraction`` of the median of the *other* nodes' (so one slow node cannot drag the reference
    down with it). A node not measured (None) is neither judged nor part of the reference."""
    out = []
    for host, mine in values.items():
        ref = median([v for h, v in values.items() if h != host and v is not None])
        if mine is None or not ref:
            continue
        out.append(NodeObservation(host, kind, mine, ref, unit, mine < fraction * ref,
                                   note=f"{verb} at {mine:.3g} {unit} against {ref:.3g} {unit}"))
    return out


def _straggler(summary: Summary) -> Optional[Verdict]:
    return next((v for v in summary.verdicts if v.kind == "straggler"), None)


def compute_observations(summary: Summary, hosts: dict[int, str]) -> list[NodeObservation]:
    live = [r for r in summary.ranks if r.phases.get("step") and r.steady_steps >= MIN_STEPS
            and r.node is not None]
    by_node: dict[int, list[float]] = {}
    for r in live:
        own = own_time(r.steady_ms("step"), r.steady_ms)
        if own is not None:
            by_node.setdefault(r.node, []).append(own)  # type: ignore[arg-type]
    if len(by_node) < 2:
        return []
    mine = {n: median(v) or 0.0 for n, v in by_node.items()}
    s = _straggler(summary)
    culprit = (s.culprit or {}) if s is not None else {}
    phase = s.evidence.get("phase") if s is not None else None
    blamed = culprit.get("node") if s is not None and phase != "outside" and culprit.get("rank") != 0 else None
    out = []
    for n, own in sorted(mine.items()):
        host = hosts.get(n)
        if not host:
            continue
        ref = median([v for m, v in mine.items() if m != n]) or 0.0
        bad = n == blamed
        note = f"own time {own:.1f} ms per step against {ref:.1f} ms on the other nodes"
        if s is not None and culprit.get("node") == n and not bad:
            note += (" (the straggler is rank 0: rank-0-only work is the usual cause)" if culprit.get("rank") == 0
                     else " (the excess is between steps: the script's work, not the node's)")
        elif bad:
            note += f", mostly in {phase}"
        out.append(NodeObservation(host, "compute", round(own, 3), round(ref, 3), "ms", bad, note=note))
    return out


def failure_observations(summary: Summary, hosts: dict[int, str]) -> list[NodeObservation]:
    out: list[NodeObservation] = []
    failed = next((v for v in summary.verdicts if v.kind == "run_failed"), None)
    if failed is not None:
        ev = failed.evidence
        node = ev.get("node")
        host = ev.get("host") or hosts.get(node) if isinstance(node, int) else None
        cause, sig = ev.get("cause"), ev.get("signal")
        if host and cause not in SCRIPT_CAUSES and sig not in STOP_SIGNALS:
            what = f"killed by {sig}" if sig else str(cause).replace("_", " ")
            out.append(NodeObservation(host, "failure", None, None, "", True,
                                       note=f"the run's first failure ({what})"))
    oom: dict[int, int] = {}
    for r in summary.ranks:
        if r.failure and r.failure.get("cause") == "oom" and r.node is not None:
            oom[r.node] = oom.get(r.node, 0) + 1
    if oom and len(oom) < len(hosts):
        for n, count in sorted(oom.items()):
            if hosts.get(n):
                out.append(NodeObservation(hosts[n], "oom", float(count), 0.0, "ranks", True,
                                           note=f"the OOM killer took {count} rank(s) here and none elsewhere"))
    return out


def missing_observations(summary: Summary, hosts: dict[int, str]) -> list[NodeObservation]:
    out = []
    never = [n for n in summary.topology.nodes if not n.joined]
    if never and len(never) < len(summary.topology.nodes):
        for n in never:
            if hosts.get(n.node):
                out.append(NodeObservation(hosts[n.node], "missing", None, None, "", True,
                                           note="its launcher never joined the run"))
    hang = summary.hang
    if hang is not None and not hang.resumed and hang.report.culprits:
        by_rank: dict[int, RankSummary] = {r.rank: r for r in summary.ranks}
        nodes = {by_rank[c].node for c in hang.report.culprits if c in by_rank}
        if len(nodes) == 1 and len(hosts) > 1:
            n = nodes.pop()
            if n is not None and hosts.get(n):
                out.append(NodeObservation(hosts[n], "missing", None, None, "", True,
                                           note="the run hung waiting for its ranks"))
    return out
