"""What a run ran on, beside what it ran (the summary's ``context``): the CPU wait per step, the load
other processes put on its nodes, its hosts, threads, torch and GPUs.

``traceml compare`` sets two runs' contexts side by side (report/compare.py): the same script on a
busy and on an idle node is 68% faster on the idle one, and without this section the user credits
the code. Every figure comes from what the ranks measured (sdk/threads.py: the training thread's
run-queue wait from the kernel's schedstat, its threads, OMP_NUM_THREADS, torch's version; the
nodes' CPU samples); a figure not measured is None, never 0.

The one codec (``traceml_core/codec.py``) writes and reads it: no hand-written ``to_json``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from .model import CpuThreads


@dataclass(frozen=True)
class RunContext:
    #: the nodes' host names, in node order
    hosts: list[str] = field(default_factory=list)
    #: GPUs sampled, over all nodes
    gpus: int = 0
    #: the torch versions the ranks said (one, normally)
    torch: list[str] = field(default_factory=list)
    #: torch's intra-op threads per rank (the median over ranks)
    threads: Optional[int] = None
    #: OMP_NUM_THREADS as the ranks had it ("unset" where it was not)
    omp: list[str] = field(default_factory=list)
    #: how long per steady step the training thread waited for a core (runnable, no core free):
    #: the median over ranks, and the most any rank waited (ms per step)
    cpu_wait_ms: Optional[float] = None
    cpu_wait_max_ms: Optional[float] = None
    #: how long per steady step the training thread ran on a core (the median over ranks): the
    #: work, which a busy node does not change and a code change does
    cpu_run_ms: Optional[float] = None
    #: the CPU the nodes used beyond the run's own processes (ranks and their DataLoader workers),
    #: in % of the node's cores, on the busiest node: load from other processes
    other_load_pct: Optional[float] = None
    #: how many ranks said their CPU facts
    ranks_measured: int = 0


def build_context(hosts: Sequence[Optional[str]], gpus: int, cpu_threads: Mapping[int, CpuThreads],
                  rank_nodes: Mapping[int, Optional[int]],
                  node_cpu_pct: Mapping[int, Optional[float]]) -> RunContext:
    """``cpu_threads``: each rank's CPU facts by rank; ``rank_nodes``: each rank's node;
    ``node_cpu_pct``: each node's mean CPU use over the run, % of its cores."""
    facts = list(cpu_threads.values())
    waits = [f.wait_ms for f in facts if f.wait_ms is not None]
    runs = [f.run_ms for f in facts if f.run_ms is not None]
    threads = [f.threads for f in facts]
    other: Optional[float] = None
    for node, pct in node_cpu_pct.items():
        mine = [f for r, f in cpu_threads.items() if rank_nodes.get(r) == node]
        used = [f.proc_cores for f in mine]
        if pct is None or not mine or any(u is None for u in used):
            continue
        cores = max(len(f.cpus) for f in mine)
        ours = sum(float(f.proc_cores or 0.0) + float(f.workers_cores or 0.0) for f in mine)
        left = max(0.0, float(pct) - 100.0 * ours / max(1, cores))
        other = left if other is None else max(other, left)
    return RunContext(
        hosts=[h or "?" for h in hosts], gpus=gpus,
        torch=sorted({f.torch for f in facts if f.torch}),
        threads=int(statistics.median(threads)) if threads else None,
        omp=sorted({f.omp if f.omp else "unset" for f in facts}),
        cpu_wait_ms=round(statistics.median(waits), 3) if waits else None,
        cpu_wait_max_ms=round(max(waits), 3) if waits else None,
        cpu_run_ms=round(statistics.median(runs), 3) if runs else None,
        other_load_pct=None if other is None else round(other, 1),
        ranks_measured=len(facts))
