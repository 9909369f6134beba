"""Controller facts checks (ctl.*): the job, its nodes, its GRES per node, its partition, as the
controller sees them, through either backend of :mod:`traceml_slurm.controller` (pyslurm or scontrol).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

from ..controller import ControllerError, gpu_count
from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext


# -- the controller's answers: asked once, all at once --------------------------------------------------

class Answers:
    """The controller's answers for this doctor run (job, config, batch script, then the job's nodes
    and partition), asked in the background as soon as a ctl.* or time.* check is going to run: with
    scontrol each is a process and a round trip, so they go in parallel (pyslurm answers in-process,
    one after the other). A check waits only for the answer it reads."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Any]] = {}
        self._pool: Optional[ThreadPoolExecutor] = None

    def _backend(self) -> Any:
        return self.ctx.controller()

    def _ask(self, what: str) -> Any:
        try:
            backend = self._backend()
            if what == "job":
                return backend.job(str(self.ctx.job_id))
            if what == "config":
                return backend.config()
            if what == "script":
                return backend.batch_script(str(self.ctx.job_id))
            job = self.get("job")
            if isinstance(job, ControllerError):
                return job
            if what == "nodes":
                return backend.nodes(job.nodes)
            if what == "partition":
                return backend.partition(job.partition.split(",")[0]) if job.partition else None
            raise KeyError(what)
        except ControllerError as exc:
            return exc

    def start(self) -> None:
        """Ask every question now, in the background (idempotent)."""
        with self._lock:
            if self._pool is not None or not self.ctx.job_id:
                return
            try:
                parallel = self._backend().name == "scontrol"
            except ControllerError:
                return
            self._pool = ThreadPoolExecutor(max_workers=len(QUESTIONS) if parallel else 1,
                                            thread_name_prefix="doctor-controller")
            for what in QUESTIONS:
                self._futures[what] = self._pool.submit(self._ask, what)
            self._pool.shutdown(wait=False)

    def get(self, what: str) -> Any:
        """The answer, or the ControllerError that stands for it (asked here when not started)."""
        with self._lock:
            future = self._futures.get(what)
        if future is None:
            value = self._ask(what)
            done: Future[Any] = Future()
            done.set_result(value)
            with self._lock:
                future = self._futures.setdefault(what, done)
        return future.result()


#: what is asked of the controller (the job first: nodes and partition wait for it)
QUESTIONS = ("job", "config", "script", "nodes", "partition")


def answers(ctx: NodeContext) -> Answers:
    if ctx.controller_answers is None:
        ctx.controller_answers = Answers(ctx)
    return ctx.controller_answers


def _facts(ctx: NodeContext, what: str) -> Any:
    """The controller's answer for this run (asked once; the job facts serve four checks)."""
    return answers(ctx).get(what)


def unavailable(err: ControllerError) -> Outcome:
    if err.missing:
        return skipped(f"{err} (`traceml run` does not need the controller)")
    return warned(f"the controller did not answer: {err}", "Check `scontrol ping`; `traceml run` itself does not need "
                  "the controller, only these checks do.")


def _backend_name(ctx: NodeContext) -> str:
    try:
        return ctx.controller().name
    except ControllerError:
        return "?"


def check_job(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    limit = "no time limit" if j.time_limit_s is None else f"time limit {j.time_limit_s / 60:.0f} min"
    data = {"backend": _backend_name(ctx), "state": j.state, "partition": j.partition, "nodes": j.nodes,
            "time_limit_s": j.time_limit_s, "end_time": j.end_time, "batch_host": j.batch_host}
    line = f"job {j.job_id} {j.state} in partition {j.partition}, {j.num_nodes} nodes {j.nodes}, {limit} (via {data['backend']})"
    if not j.live:
        return warned(line, "The job is not running normally; check `scontrol show job`.", **data)
    return passed(line, **data)


BAD_NODE_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND", "POWERED_DOWN", "POWER_DOWN", "*")
DRAIN_STATES = ("DRAIN", "REBOOT", "MAINT")


def check_nodes(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    nodes = _facts(ctx, "nodes")
    if isinstance(nodes, ControllerError):
        return unavailable(nodes)
    data = {"nodes": {n.name: {"state": n.state, "reason": n.reason} for n in nodes}}
    line = ", ".join(f"{n.name} {n.state}" for n in nodes)
    bad = [n for n in nodes if any(s in n.state.upper() for s in BAD_NODE_STATES)]
    if bad:
        return failed(f"{line}: " + "; ".join(f"{n.name} is {n.state}" + (f" ({n.reason})" if n.reason else "") for n in bad),
                      f"Resubmit excluding them (--exclude={','.join(n.name for n in bad)}) and tell the admins.", **data)
    draining = [n for n in nodes if any(s in n.state.upper() for s in DRAIN_STATES)]
    if draining:
        return warned(f"{line}: " + "; ".join(f"{n.name} is {n.state}" + (f" ({n.reason})" if n.reason else "") for n in draining),
                      "An admin marked them for maintenance: this job runs, but a requeue will not land there.", **data)
    return passed(line, **data)


def check_gres(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    if not any(j.gres_per_node.values()):  # a job without GRES has a node list of empty strings
        return passed(f"no GRES allocated (job TresPerNode={j.tres_per_node or 'none'})", gres={})
    counts = {host: gpu_count(g) for host, g in j.gres_per_node.items()}
    line = ", ".join(f"{h}: {g}" for h, g in j.gres_per_node.items())
    data = {"gres": j.gres_per_node, "gpus": counts}
    if len(set(counts.values())) > 1:
        return failed(f"GPUs differ between nodes ({line}): torchrun needs the same number of workers on every node",
                      "Ask for GPUs per node (`--gpus-per-node=N` or `--gres=gpu:N`), not in total (`--gpus=N`).", **data)
    return passed(line, **data)


def check_partition(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    if not j.partition:
        return skipped("the job names no partition")
    p = _facts(ctx, "partition")
    if isinstance(p, ControllerError):
        return unavailable(p)
    mt = "UNLIMITED" if p.max_time_s is None else f"{p.max_time_s / 60:.0f} min"
    mn = "UNLIMITED" if p.max_nodes is None else str(p.max_nodes)
    line = f"{p.name}: {p.state}, MaxTime {mt}, MaxNodes {mn}"
    data = {"name": p.name, "state": p.state, "max_time_s": p.max_time_s, "max_nodes": p.max_nodes}
    if p.state != "UP":
        return warned(line, "This job runs, but a requeue or the next submission will wait: pick a partition that is UP.", **data)
    return passed(line, **data)


CHECKS = (
    CheckSpec("ctl.job", "Job state", check_job, scope="job"),
    CheckSpec("ctl.nodes", "Node states", check_nodes, scope="job"),
    CheckSpec("ctl.gres", "GRES per node", check_gres, scope="job"),
    CheckSpec("ctl.partition", "Partition limits", check_partition, scope="job"),
)
