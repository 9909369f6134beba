"""The node health rule: from the stored records, which hosts to exclude, with the doubt said.

One slow run is not proof: a node shares its job with the job's load, and many stragglers are
not hardware at all. So a host's evidence is judged per *job* (a run and a doctor of the same job
are one sample of it), over the host's most recent jobs inside the age window:

* a job is **bad** for a host when any observation of that job found the host worse than its
  peers in the same job (core's rule per kind: report/nodeevidence.py, the doctor's checks);
* a host is **excluded** when, of its last :data:`RECENT_JOBS` jobs in the last
  :data:`WINDOW_DAYS` days, at least :data:`MIN_BAD_JOBS` were bad and at least
  :data:`BAD_SHARE` of them (repeated, and most of the time), or when one observation is
  *strong* (a hardware fault such as an XID or uncorrectable ECC error);
* the **score** is the share of those jobs that were clean (1.0 healthy, 0.0 bad in every one;
  None: no job in the window). Older evidence is aged out: counted in the reason, not in the rule;
* evidence that depends on where the ranks ran (a slow rank's compute, its OOM kill, its hang:
  observations that carry their ``ranks``) counts only when the slowness stays with the host, not
  the rank (:func:`placed`): the host was slow with *different* ranks on it across its recent
  jobs, or the run measured the ranks' work per step equal. A rank that does more (its data
  shard, work only it does) is slow wherever it lands; blaming each host it lands on would
  exclude healthy nodes one after the other. Such a host is not excluded, and its reason says so.

A host that was slow and then clean again recovers by itself: once most of its last jobs are
clean it is no longer excluded. The false-exclude and miss rates of this rule, measured on the
dev cluster, are in docs/node-health.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from statistics import median
from typing import Callable, Optional, Sequence

from traceml_core.plugins import NodeObservation

from .store import Record

WINDOW_DAYS = 14.0
RECENT_JOBS = 5
MIN_BAD_JOBS = 2
BAD_SHARE = 0.5

#: how the reason names each kind of evidence
KIND_WORDS = {
    "link_send": "link sending", "link_recv": "link receiving", "compute": "compute (own time per step)",
    "failure": "first failure", "oom": "OOM kills", "missing": "ranks missing",
    "bench_cpu": "CPU matmul", "bench_gpu": "GPU matmul", "h2d": "host-to-device copy",
    "gpu_health": "GPU health",
}


@dataclass
class JobVerdict:
    """One job of one host: bad or clean, and the observations that say so."""

    job_id: str
    at: float
    bad: list[NodeObservation] = field(default_factory=list)
    strong: list[NodeObservation] = field(default_factory=list)
    #: every observation of the host in this job, bad or not, with its record's source and time
    seen: list[tuple[NodeObservation, str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Latest:
    """The newest figure of one kind for one host, from its recent jobs: what `traceml slurm nodes
    --json` shows as the host's evidence."""

    kind: str
    value: Optional[float]
    peers: Optional[float]
    unit: str
    bad: bool
    strong: bool
    note: str
    job_id: str
    source: str
    at: float
    #: the ranks it is about (placed evidence), whether their work was measured equal, and
    #: whether the rule counted it (placed evidence of the same rank only: not counted)
    ranks: tuple[int, ...] = ()
    work: str = ""
    counted: bool = True

    def to_json(self) -> dict:
        return {"kind": self.kind, "value": self.value, "peers": self.peers, "unit": self.unit, "bad": self.bad,
                "strong": self.strong, "note": self.note, "job": self.job_id, "source": self.source,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.at)),
                "ranks": list(self.ranks), "work": self.work or None, "counted": self.counted}


@dataclass
class NodeHealth:
    host: str
    cluster: str
    #: share of its recent jobs that were clean; None: no job in the window
    score: Optional[float]
    exclude: bool
    #: the recent jobs judged (newest first), how many were bad
    jobs: int
    bad_jobs: int
    #: records of this host older than the window (not counted)
    aged_out: int
    why: str
    #: the strongest reason in one line ("node3: link sending at 0.012 GB/s against ...")
    reason: str
    last_seen: Optional[float]
    #: the newest figure of each kind in its recent jobs (link rates, compute, the doctor's
    #: benchmarks, GPU health), kind by kind
    evidence: tuple[Latest, ...] = ()
    #: recent jobs in which it was slow only by evidence that may follow the rank (:func:`placed`),
    #: not counted; and the ranks that were on it then
    rank_following_jobs: int = 0
    rank_following: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"host": self.host, "cluster": self.cluster, "score": self.score, "exclude": self.exclude,
                "jobs": self.jobs, "bad_jobs": self.bad_jobs, "aged_out": self.aged_out, "why": self.why,
                "reason": self.reason, "rank_following_jobs": self.rank_following_jobs,
                "rank_following_ranks": list(self.rank_following),
                "last_seen": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.last_seen))
                if self.last_seen else None,
                "evidence": [e.to_json() for e in self.evidence]}


def judge(records: Sequence[Record], now: Optional[float] = None) -> list[NodeHealth]:
    """Every host seen in ``records`` (one cluster's), worst first."""
    now = time.time() if now is None else now
    since = now - WINDOW_DAYS * 86400.0
    by_host: dict[tuple[str, str], dict[str, JobVerdict]] = {}
    aged: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, str], float] = {}
    for rec in records:
        for host in rec.hosts:
            key = (rec.cluster, host)
            last[key] = max(last.get(key, 0.0), rec.at)
            if rec.at < since:
                aged[key] = aged.get(key, 0) + 1
                by_host.setdefault(key, {})
                continue
            job = by_host.setdefault(key, {}).setdefault(rec.job_id or f"{rec.run_name}@{rec.at}",
                                                         JobVerdict(rec.job_id, rec.at))
            job.at = max(job.at, rec.at)
            for o in rec.observations:
                if o.host != host:
                    continue
                job.seen.append((o, rec.source, rec.at))
                if o.bad:
                    job.bad.append(o)
                    if o.strong:
                        job.strong.append(o)
    out = [_health(host, cluster, jobs, aged.get((cluster, host), 0), last.get((cluster, host)))
           for (cluster, host), jobs in by_host.items()]
    out.sort(key=lambda h: (not h.exclude, h.score if h.score is not None else 2.0, h.host))
    return out


def placed(o: NodeObservation) -> bool:
    """Evidence whose blame depends on where the ranks ran: it names its ranks, and their work
    was not measured equal (then it could be the rank's doing, wherever it ran)."""
    return bool(o.ranks) and o.work != "equal"


def _health(host: str, cluster: str, jobs: dict[str, JobVerdict], aged: int, last_seen: Optional[float]) -> NodeHealth:
    recent = sorted(jobs.values(), key=lambda j: -j.at)[:RECENT_JOBS]
    # placed evidence counts only when the host was slow with different ranks on it
    ranks_on = sorted({r for j in recent for o in j.bad if placed(o) for r in o.ranks})
    follows_host = len(ranks_on) >= 2

    def counts(o: NodeObservation) -> bool:
        return follows_host or not placed(o)
    judged = [JobVerdict(j.job_id, j.at, [o for o in j.bad if counts(o)], [o for o in j.strong if counts(o)], j.seen)
              for j in recent]
    aside = [j for j, k in zip(recent, judged) if j.bad and not k.bad]
    bad = [j for j in judged if j.bad]
    strong = [o for j in judged for o in j.strong]
    n, nb = len(recent), len(bad)
    score = round(1.0 - nb / n, 3) if n else None
    repeated = nb >= MIN_BAD_JOBS and nb >= BAD_SHARE * n
    exclude = bool(strong) or repeated
    aged_words = f"; {aged} older record(s) aged out (over {WINDOW_DAYS:.0f} days)" if aged else ""
    if not n:
        return NodeHealth(host, cluster, None, False, 0, 0, aged, f"no job in the last {WINDOW_DAYS:.0f} days"
                          + aged_words, "", last_seen)
    reason = _reason(host, bad, n)
    evidence = _latest(recent, counts)
    if strong:
        why = f"a hardware fault: {strong[0].note}" + aged_words
    elif repeated:
        why = f"worse than its peers in {nb} of its last {n} job(s): {reason.split(': ', 1)[1]}" + aged_words
    elif nb:
        need = max(MIN_BAD_JOBS, int(-(-BAD_SHARE * n // 1)))
        why = (f"worse than its peers in {nb} of its last {n} job(s) ({reason.split(': ', 1)[1]}): "
               f"not excluded, the rule needs {need} of {n}" + (" - one slow run may be the load of that job"
                                                                if nb == 1 else "") + aged_words)
    else:
        why = f"clean in its last {n} job(s)" + aged_words
    if aside:
        why += "; " + _aside_words(aside, ranks_on)
    return NodeHealth(host, cluster, score, exclude, n, nb, aged, why, reason if nb else "", last_seen, evidence,
                      len(aside), tuple(ranks_on) if aside else ())


def _aside_words(aside: Sequence[JobVerdict], ranks: Sequence[int]) -> str:
    """Why the jobs in which the host was slow only with one rank on it are not counted."""
    kinds = sorted({KIND_WORDS.get(o.kind, o.kind) for j in aside for o in j.bad if placed(o)})
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "the same ranks"
    return (f"not counted: slow in {len(aside)} more job(s) ({', '.join(kinds)}) with only {who} on it, so the "
            "slowness may follow the rank (its data or work), not the host; it counts once the host is slow "
            "with another rank on it, or with the ranks' work measured equal")


def _latest(recent: Sequence[JobVerdict], counts: Callable[[NodeObservation], bool]) -> tuple[Latest, ...]:
    newest: dict[str, Latest] = {}
    for job in recent:
        for o, source, at in job.seen:
            if o.kind not in newest or at > newest[o.kind].at:
                newest[o.kind] = Latest(o.kind, o.value, o.peers, o.unit, o.bad, o.strong, o.note, job.job_id,
                                        source, at, o.ranks, o.work, counts(o))
    return tuple(sorted(newest.values(), key=lambda e: e.kind))


def _reason(host: str, bad: Sequence[JobVerdict], n: int) -> str:
    """``node3: link sending at 0.012 GB/s against 1.5 GB/s in 3 of 3 jobs since Dec 02``: the kind
    seen in most bad jobs, with the medians of what was measured; then every other kind seen bad
    (``; also CPU matmul at 10 GFLOP/s against 40 GFLOP/s in 1 of 3``)."""
    if not bad:
        return ""
    kinds: dict[str, list[NodeObservation]] = {}
    for j in bad:
        for kind in {o.kind for o in j.bad}:
            kinds.setdefault(kind, []).append(next(o for o in j.bad if o.kind == kind))
    # most bad jobs first; on a tie a link last (a node short of CPU also sends and receives slowly:
    # the cause before its consequence)
    ranked = sorted(kinds.items(), key=lambda kv: (len(kv[1]), not kv[0].startswith("link"), kv[0]), reverse=True)
    since = time.strftime("%b %d", time.localtime(min(j.at for j in bad)))
    (kind, obs), others = ranked[0], ranked[1:]
    out = f"{host}: {_what(kind, obs)} in {len(obs)} of {n} job(s) since {since}"
    if others:
        out += "; also " + ", ".join(f"{_what(k, o)} in {len(o)} of {n}" for k, o in others)
    return out


def _what(kind: str, obs: Sequence[NodeObservation]) -> str:
    """``link sending at 0.012 GB/s against 1.5 GB/s``: the medians of what was measured."""
    values = [o.value for o in obs if o.value is not None]
    peers = [o.peers for o in obs if o.peers is not None]
    words = KIND_WORDS.get(kind, kind)
    if values and peers:
        return f"{words} at {_num(median(values))} {obs[0].unit} against {_num(median(peers))} {obs[0].unit}"
    return obs[0].note or words


def _num(v: float) -> str:
    return f"{v:.3g}"


def exclude_line(health: Sequence[NodeHealth]) -> Optional[str]:
    """``#SBATCH --exclude=node3,node7`` for the hosts to exclude; None when none is."""
    from ..hostlists import compress_hosts

    bad = [h.host for h in health if h.exclude]
    return f"#SBATCH --exclude={compress_hosts(bad)}" if bad else None
