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

Slowness can follow the host (a slow GPU, a throttled CPU, a bad link) or the *rank* (its data
shard, work only it does, its batches): a rank that does more lands on some host, and that host
looks slow. So the observations whose blame depends on where the ranks were placed
(:data:`PLACED_KINDS`) carry the ranks they are about, and whether the run measured the ranks' work
per step equal (``work="equal"``); the cluster plugin's rule excludes a host on them only when it
was slow with different ranks on it, or with the work measured equal (traceml_slurm/nodes/health.py).
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

#: verdict kinds whose cause stays with the host a rank ran on, whatever rank it was: a rank that
#: waits in its own work, not one that does more (``work_imbalance``), pauses for periodic work of
#: its own or waits for input; the only verdicts that may blame a host (:func:`host_evidence`)
HOST_FOLLOWING_KINDS = frozenset({"straggler"})
#: observation kinds whose blame depends on where the ranks were placed: they carry their ranks
PLACED_KINDS = frozenset({"compute", "oom", "missing"})

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
                       hosts=tuple(h for h in hosts.values() if h), observations=tuple(obs),
                       origins=tuple(host_origins(summary).items()))


def node_hosts(summary: Summary) -> dict[int, str]:
    """Host name by node rank (the topology's, else a rank's)."""
    out = {n.node: n.hostname or "" for n in summary.topology.nodes}
    for r in summary.ranks:
        if r.node is not None and r.host and not out.get(r.node):
            out[r.node] = r.host
    return out


def host_origins(summary: Summary) -> dict[str, str]:
    """Who named each host: a node's launcher (as it joined), else the first rank that said it."""
    out = {n.hostname: f"node {n.node}'s launcher" for n in summary.topology.nodes if n.hostname}
    for r in summary.ranks:
        if r.host and r.host not in out:
            out[r.host] = f"rank {r.rank}"
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


def host_evidence(v: Verdict) -> bool:
    """Whether verdict ``v`` is evidence against the host of the rank it names: a host-following
    kind (:data:`HOST_FOLLOWING_KINDS`), its excess in the rank's work (not between steps: logging,
    evaluation or checkpointing on one rank is the script's doing) and not on rank 0 (work only
    rank 0 does is the usual cause there, whichever node holds it)."""
    culprit = v.culprit or {}
    return (v.kind in HOST_FOLLOWING_KINDS and v.evidence.get("phase") != "outside"
            and culprit.get("rank") not in (None, 0) and culprit.get("node") is not None)


def work_measured_equal(v: Verdict) -> bool:
    """The verdict's rank was measured doing the same work per step as the others (the straggler
    rule compares its training thread's CPU time per step, and calls it a straggler only when
    more work is not why it is slower): its slowness is then not its work, wherever it runs."""
    ev = v.evidence
    return ev.get("cpu_ms") is not None and ev.get("others_cpu_ms") is not None


def _slowest(summary: Summary) -> Optional[Verdict]:
    """The verdict that names the slowest rank: a host-following one where there is one, else
    the first that names a rank (said in the note, not held against the host)."""
    named = [v for v in summary.verdicts if (v.culprit or {}).get("rank") is not None
             and v.kind not in ("run_failed", "did_not_start", "hang")]
    return next((v for v in named if v.kind in HOST_FOLLOWING_KINDS), named[0] if named else None)


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
    v = _slowest(summary)
    culprit = (v.culprit or {}) if v is not None else {}
    blamed = culprit.get("node") if v is not None and host_evidence(v) else None
    out = []
    for n, own in sorted(mine.items()):
        host = hosts.get(n)
        if not host:
            continue
        ref = median([x for m, x in mine.items() if m != n]) or 0.0
        bad = n == blamed
        note = f"own time {own:.1f} ms per step against {ref:.1f} ms on the other nodes"
        ranks: tuple[int, ...] = ()
        work = ""
        if v is not None and culprit.get("node") == n and not bad:
            note += f" ({_not_host(v)})"
        elif bad and v is not None:
            ranks = (int(culprit["rank"]),)
            work = "equal" if work_measured_equal(v) else ""
            note += f", mostly in {v.evidence.get('phase')}, rank {culprit['rank']}" + (
                " (its work per step measured equal to the others')" if work else "")
        out.append(NodeObservation(host, "compute", round(own, 3), round(ref, 3), "ms", bad, note=note,
                                   ranks=ranks, work=work))
    return out


def _not_host(v: Verdict) -> str:
    """Why the slowest rank's verdict is not held against its host, in a few words."""
    if v.kind not in HOST_FOLLOWING_KINDS:
        return f"{v.kind.replace('_', ' ')}: a cause that follows the rank, not the host"
    if (v.culprit or {}).get("rank") == 0:
        return "the straggler is rank 0: rank-0-only work is the usual cause"
    return "the excess is between steps: the script's work, not the node's"


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
                ranks = tuple(sorted(r.rank for r in summary.ranks if r.node == n and r.failure
                                     and r.failure.get("cause") == "oom"))
                out.append(NodeObservation(hosts[n], "oom", float(count), 0.0, "ranks", True,
                                           note=f"the OOM killer took {count} rank(s) here and none elsewhere",
                                           ranks=ranks))
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
                                           note="the run hung waiting for its ranks",
                                           ranks=tuple(sorted(c for c in hang.report.culprits if c in by_rank))))
    return out
