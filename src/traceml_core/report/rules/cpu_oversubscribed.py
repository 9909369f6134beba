"""CPU-OVERSUBSCRIBED: a node's ranks compute with more threads, together, than the cores they may
run on (CPU runs).

How it decides. Each rank tells node 0 its torch intra-op threads (``torch.get_num_threads()``)
and the cores its affinity mask allows (sdk/threads.py). Per node: the ranks' threads summed
over the union of their cores. Above one thread per core some always wait, and OpenMP's threads
spin while they wait, which makes it worse than the ratio suggests: a warning, critical from
two threads per core. It is a cause: stragglers, all-reduce waits and waits for a core that it
makes are listed after it, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .. import thresholds as T
from ..model import RankSummary
from .base import Evidence, Finding, Run

KIND = "cpu_oversubscribed"
THRESHOLDS = ("CPU_OVERSUBSCRIBED", "CPU_OVERSUBSCRIBED_CRIT")


@dataclass
class OversubscribedEvidence(Evidence):
    node: Any
    host: Optional[str]
    ranks: int
    threads: int
    threads_per_rank: list[int] = field(default_factory=list)
    cores: int = 0
    ratio: float = 0.0
    fair_threads: int = 1
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    ctx = run.ctx
    if ctx.device != "cpu" or not ctx.cpu_threads:
        return None
    by_node: dict[Any, list[tuple[RankSummary, Any]]] = {}
    for r in run.live:
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
    host = rows[0][0].host or None
    return Finding(KIND, sev, {"rank": None, "node": node, "host": host}, OversubscribedEvidence(
        node=node, host=host, ranks=len(rows), threads=threads, threads_per_rank=per, cores=cores,
        ratio=round(ratio, 2), fair_threads=max(1, cores // len(rows))))


def say(ev: OversubscribedEvidence) -> tuple[str, str]:
    host = f", {ev.host}" if ev.host else ""
    each = (f"{ev.threads_per_rank[0]} torch threads each" if len(ev.threads_per_rank) == 1
            else "torch threads " + "/".join(map(str, ev.threads_per_rank)))
    return ((f"the {ev.ranks} rank(s) on node {ev.node}{host} compute with {each}, {ev.threads} in "
             f"all, on {ev.cores} usable core(s) ({ev.ratio:.1f} threads per core): threads wait for a "
             "core and slow each other down, so steps are slower and vary, and ranks fall behind at random"),
            f"give each rank at most {ev.fair_threads} thread(s) (torch.set_num_threads({ev.fair_threads}) "
            "or OMP_NUM_THREADS, which torchrun sets to 1 unless you set it), or run fewer ranks per node")


EVIDENCE = OversubscribedEvidence
