"""Why an input-bound run waits for data, as far as the CPU says: the cause the input-bound verdict uses.

Input-bound (report/rules/input_bound.py) says *that* every rank waits for its next batch. This module says
whether the CPU is why, from what each rank measured of itself (sdk/threads.py, the
``cpu_threads`` event: :class:`~.model.CpuThreads`): the CPUs its affinity mask allows, its
DataLoader worker processes and the CPU they used, its own CPU use, the cgroup's CPU throttling,
and what the cluster plugin says the scheduler gave the task (``ClusterEnvironment.cpu_request``:
CPUs per task, the lines that ask for more). One cause, the first that holds for most ranks:

* ``cpu_quota``: the cgroup throttled the rank's CPU (a CPU limit, not the cores) a tenth of the
  time or more;
* ``not_inherited``: the job asked for more CPUs per task than the task may run on (srun of
  Slurm 22.05 to 23.10 does not pass ``--cpus-per-task`` on): the line that passes it;
* ``cpu_binding``: the workers and the rank want (are on, or runnable and waiting for) the CPUs
  they may use: more workers would only share them; ask for more CPUs per task (the plugin's
  lines);
* ``few_workers``: the workers are busy but CPUs of the task are left over: more workers;
* ``no_workers``: the rank makes its batches in its own process (no DataLoader workers) and
  computes doing it (half a CPU or more);
* ``not_cpu``: the workers (or, without workers, the rank) mostly wait, and the task's CPUs are
  not full: the CPU is not the limit (the storage, the network or a sleep in the loader is).

None when the ranks did not say (an older SDK, no ``traceml run``): the verdict then says nothing
of the CPU. Pure functions; every figure the sentences use is in the evidence, rounded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from .model import CpuRequest, CpuThreads

#: the task's CPUs count as full when its processes use this share of them
SATURATED = 0.8
#: a worker using less than this share of a core mostly waits (for storage, a lock, a sleep)
WORKER_IDLE = 0.5
#: share of the wall clock the cgroup's CPU quota held the rank back that makes it the cause
THROTTLED = 0.10

CAUSES = ("cpu_quota", "not_inherited", "cpu_binding", "few_workers", "no_workers", "not_cpu")


def _cause(f: CpuThreads) -> Optional[str]:
    if f.workers is None or f.workers_cores is None or f.workers_waiting is None or f.proc_cores is None:
        return None
    cpus = len(f.cpus)
    workers = f.workers_cores + f.workers_waiting  # a computing worker is on a CPU or waiting for one
    full = workers + f.proc_cores >= SATURATED * cpus
    req = f.request
    if f.throttled is not None and f.throttled >= THROTTLED:
        return "cpu_quota"
    if req is not None and req.cpus_per_task is not None and req.cpus_per_task > cpus and full:
        return "not_inherited"
    if f.workers == 0:  # the rank fetches in its own process: computing, or waiting (storage, a sleep)
        return "no_workers" if f.proc_cores >= WORKER_IDLE else "not_cpu"
    if full:
        return "cpu_binding"
    return "few_workers" if workers / f.workers >= WORKER_IDLE else "not_cpu"


def evidence(facts: Sequence[Optional[CpuThreads]]) -> Optional[dict[str, Any]]:
    """The CPU cause of an input-bound run from each waiting rank's facts, or None when none said."""
    judged = [(c, f) for f in facts if f is not None for c in [_cause(f)] if c is not None]
    if not judged:
        return None
    cause, _ = Counter(c for c, _ in judged).most_common(1)[0]
    f = next(f for c, f in judged if c == cause)
    req = f.request or CpuRequest()
    cpus = len(f.cpus)
    workers = f.workers or 0
    want = max(cpus + 1, workers + 1)
    ev: dict[str, Any] = {
        "cause": cause, "ranks": len(judged), "ranks_agree": sum(1 for c, _ in judged if c == cause),
        "cpus": cpus, "workers": workers, "workers_cores": round(f.workers_cores or 0.0, 2),
        "workers_waiting": round(f.workers_waiting or 0.0, 2), "rank_cores": round(f.proc_cores or 0.0, 2),
        "throttled": round(f.throttled, 3) if f.throttled is not None else None,
        "torch_threads": f.threads, "omp_num_threads": f.omp,
        "cpus_per_task": req.cpus_per_task, "cpus_per_task_source": req.cpus_per_task_source,
        "srun_cpus_per_task": req.srun_cpus_per_task, "cpus_on_node": req.cpus_on_node,
        "scheduler": req.scheduler, "version": req.version, "want_cpus": want,
        "fix_lines": [], "fix_why": [],
    }
    if cause in ("cpu_binding", "no_workers", "cpu_quota") and req.fix:
        lines = [ln.replace("{n}", str(want)) for ln in req.fix]
        ev["fix_lines"] = lines
        ev["fix_why"] = [_short(ev)] * len(lines)
    elif cause == "not_inherited" and req.pass_on:
        ev["fix_lines"] = list(req.pass_on)
        ev["fix_why"] = [_short(ev)] * len(req.pass_on)
    return ev


def _want(ev: dict[str, Any]) -> float:
    """CPUs the workers and the rank wanted: on a CPU, or runnable and waiting for one."""
    return ev["workers_cores"] + ev["workers_waiting"] + ev["rank_cores"]


def _cpu(n: int) -> str:
    return f"{n} CPU" + ("" if n == 1 else "s")


def _short(ev: dict[str, Any]) -> str:
    if ev["cause"] == "not_inherited":
        return (f"the job asks for {ev['cpus_per_task']} CPUs per task, each rank may run on {_cpu(ev['cpus'])} "
                "(srun did not pass the request on)")
    if ev["cause"] == "cpu_quota":
        return f"the rank's cgroup held its CPU back {ev['throttled']:.0%} of the time"
    return (f"input-bound: {ev['workers']} DataLoader worker(s) and the rank share {_cpu(ev['cpus'])} "
            f"and want {_want(ev):.1f}")


def say(ev: dict[str, Any]) -> tuple[str, str]:
    """(a sentence to add to the input-bound verdict's why, its next step): the next step ends in
    the lines to paste into the next job script where the cluster plugin gave them."""
    cause, cpus, w = ev["cause"], ev["cpus"], ev["workers"]
    busy = _want(ev)
    want = (f"{busy:.1f} CPUs: {ev['workers_cores'] + ev['rank_cores']:.1f} on a CPU, "
            f"the workers {ev['workers_waiting']:.1f} more waiting for one")
    granted = (f"; {ev['scheduler']} gave each task {_cpu(ev['cpus_per_task'])}: {ev['cpus_per_task_source']}"
               if ev.get("cpus_per_task") is not None and ev.get("scheduler") else "")
    paste = f"; in the next job script: {'; '.join(ev['fix_lines'])}" if ev["fix_lines"] else ""
    fewer = f", or use num_workers={cpus - 1}" if 1 < cpus <= w else ""
    if cause == "cpu_quota":
        return (f"the CPU is the limit: the rank's cgroup throttled its CPU {ev['throttled']:.0%} of the time "
                f"(a CPU quota, whatever the {_cpu(cpus)} its affinity mask allows)",
                f"raise the job's CPU limit to {ev['want_cpus']} CPUs per rank{fewer}" + paste)
    if cause == "not_inherited":
        why = (f"the CPU is the limit: the job asks for {ev['cpus_per_task']} CPUs per task but each rank "
               f"may run on {_cpu(cpus)}, and it and its {w} DataLoader worker(s) want {want}")
        if ev.get("version"):
            why += f"; srun of {ev['scheduler']} {ev['version']} does not pass --cpus-per-task on to its tasks"
        return why, (f"let srun give each task the job's {ev['cpus_per_task']} CPUs" + paste)
    if cause == "cpu_binding":
        return (f"the CPU is the limit: {w} DataLoader worker(s) and the rank share {_cpu(cpus)} (the "
                f"rank's affinity mask{granted}) and want {want}: more workers would only share the same CPUs",
                f"give each rank {ev['want_cpus']} CPUs{fewer}" + paste)
    if cause == "no_workers":
        why = (f"the rank makes its batches in its own process (no DataLoader workers) and computes doing it "
               f"({ev['rank_cores']:.1f} CPUs of the {_cpu(cpus)} it may run on)")
        if cpus > 1:
            return why, f"make them in a DataLoader with num_workers={cpus - 1}"
        return why, f"give each rank {ev['want_cpus']} CPUs and make the batches in DataLoader workers" + paste
    if cause == "few_workers":
        return (f"the {w} DataLoader worker(s) compute ({ev['workers_cores'] + ev['workers_waiting']:.1f} CPUs "
                f"on a CPU or waiting for one) and the rank's {_cpu(cpus)} are not all used ({busy:.1f} wanted)",
                f"raise num_workers to {max(w + 1, cpus - 1)} (each rank may run on {_cpu(cpus)})")
    if not w:
        return (f"the CPU is not the limit: the rank makes its batches in its own process (no DataLoader "
                f"workers) and used {ev['rank_cores']:.1f} CPUs of the {_cpu(cpus)} it may run on: the fetch "
                "waits (for storage, the network, a lock or a sleep), it does not compute",
                "find what the fetch waits for (the storage's read speed, a remote dataset, a sleep), or "
                "overlap it with the step: a DataLoader with workers, or a prefetching thread")
    return (f"the CPU is not the limit: the {w} DataLoader worker(s) were on a CPU or waiting for one "
            f"{ev['workers_cores'] + ev['workers_waiting']:.1f} CPUs' worth, and the rank used {ev['rank_cores']:.1f}, "
            f"of the {_cpu(cpus)} it may run on: the workers wait (for "
            "storage, the network, a lock or a sleep), they do not compute",
            "find what the loader waits for (the storage's read speed, a remote dataset, a sleep); more "
            "workers only hide it")
