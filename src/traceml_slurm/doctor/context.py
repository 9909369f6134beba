"""Slurm context checks: where we run, the task layout, the launch config, stale launcher variables.

They render the Slurm facts (:mod:`traceml_slurm.facts`), the same the resolver decides from: the
layout check shows the resolver's layout decision and its refusals, never a second rule.
"""

from __future__ import annotations

from traceml_core.errors import ConfigError

from ..context import Context
from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext


def check_context(ctx: NodeContext) -> Outcome:
    try:
        v = ctx.slurm
    except ConfigError as exc:
        return failed(str(exc), "Remove the malformed SLURM_* variable from your script or shell; Slurm sets it.")
    kind = ctx.context
    data = {"context": kind.value, "job_id": v.job_id, "step_id": v.step_id, "host": ctx.hostname}
    if kind is Context.NONE:
        return failed(
            f"not inside a Slurm allocation (no SLURM_JOB_ID) on {ctx.hostname}",
            "Run it inside one: `salloc -N2 --ntasks-per-node=1 --gres=gpu:N` then `traceml slurm doctor`, "
            "or put `traceml slurm doctor` in the sbatch script before `srun`.", **data)
    nnodes = v.job_num_nodes or v.nnodes
    job = f"job {v.job_id}" + (f" ({nnodes} nodes)" if nnodes else "")
    if kind is Context.BATCH_SHELL:
        return passed(f"batch shell of {job} on {ctx.hostname}", **data)
    if kind is Context.SALLOC_SHELL:
        if ctx.options.local:
            return warned(
                f"salloc shell of {job} on {ctx.hostname}, which is not a compute node of the job: --local "
                f"checks this host only",
                "Drop --local (the doctor then starts an agent on every node of the job), or run "
                "`srun --overlap -N1 traceml slurm doctor --local` to check one compute node.", **data)
        return passed(f"salloc shell of {job} on {ctx.hostname}", **data)
    step_nodes = v.step_num_nodes or v.nnodes
    where = f"node {v.nodeid} of {step_nodes}" if v.nodeid is not None and step_nodes else ctx.hostname
    if kind is Context.INTERACTIVE_STEP:
        return passed(f"interactive step of {job} on {ctx.hostname} ({where})", **data)
    return passed(f"srun step {v.job_id}.{v.step_id} on {ctx.hostname} ({where})", **data)


def check_tasks_per_node(ctx: NodeContext) -> Outcome:
    """One launcher per node, or one task per GPU (the same on every node): the resolver's layout
    decision for the step we run in, or, from a shell, for a bare `srun traceml run` of the job."""
    kind = ctx.context
    if kind is Context.NONE:
        return skipped("not inside a Slurm allocation")
    in_step = kind in (Context.STEP, Context.INTERACTIVE_STEP)
    var = "SLURM_STEP_TASKS_PER_NODE" if in_step else "SLURM_TASKS_PER_NODE"
    try:
        layout = ctx.facts.layout if in_step else ctx.facts.job_layout
    except ConfigError as exc:
        return failed(str(exc), f"Unset {exc.variable or var} if your script sets it: Slurm sets it.")
    if layout is None:
        return skipped(f"{var} is not set")
    data = {"tasks_per_node": layout.text, "layout": layout.kind}
    layout_refusals = [r for r in layout.refusals if r.variable == var]
    if layout_refusals:
        r = layout_refusals[0]
        return failed(r.what, r.fix, **data)
    if layout.kind == "node":
        return passed(f"1 task per node ({var}={layout.text})", **data)
    if in_step:
        return passed(
            f"{layout.per_node} tasks per node ({var}={layout.text}): the one-task-per-GPU layout, each task one "
            "rank (the launch config check below says whether the GPUs match)", **data)
    return passed(
        f"the job has {layout.per_node} tasks per node ({var}={layout.text}): a bare `srun traceml run` starts one "
        f"task per GPU, each one rank (for one launcher per node: `srun --ntasks-per-node=1 traceml run train.py`)",
        **data)


def _config_line(c) -> str:  # type: ignore[no-untyped-def]
    return (f"nnodes={c.nnodes} node_rank={c.node_rank} nproc_per_node={c.nproc_per_node} "
            f"master={c.master_addr}:{c.master_port} aggregator={c.aggregator_host}:{c.aggregator_port} "
            f"run_name={c.run_name} logs_dir={c.logs_dir}")


def check_launch_config(ctx: NodeContext) -> Outcome:
    """The same resolver as `traceml run --print-config`; sources go to the data (shown with -v / --json)."""
    out = ctx.launch()
    if out.config is None:
        return failed(f"`traceml run` would refuse here: {out.error}",
                      "Follow the message above; `traceml run --print-config` on the node shows the same.")
    c = out.config
    data = {"config": c.to_json()["config"], "warnings": list(c.warnings), "emulated": out.emulated}
    line = _config_line(c)
    if out.emulated:
        line = f"as node 0's `srun` step would resolve it: {line}"
    if c.warnings:
        return warned(f"{line}; warning: {' | '.join(c.warnings)}",
                      "See the warning; set the value explicitly (flag or TRACEML_*) if the guess is wrong.", **data)
    return passed(line, **data)


def check_stale_env(ctx: NodeContext) -> Outcome:
    found = dict(ctx.facts.env.launcher_vars)
    traceml = dict(ctx.facts.env.traceml_vars)
    data = {"launcher_vars": found, "traceml_vars": traceml}
    if not found:
        extra = f"; TRACEML_* set: {', '.join(sorted(traceml))}" if traceml else ""
        return passed("no stale MASTER_ADDR / RANK / WORLD_SIZE" + extra, **data)
    shown = ", ".join(f"{k}={v}" for k, v in found.items())
    return warned(
        f"set in the environment: {shown} (left over from a login shell or an earlier launch?); torchrun "
        f"replaces them for the workers, but code that reads them before init is misled",
        f"Unset them in the sbatch script before srun: `unset {' '.join(found)}`.", **data)


def check_cpus(ctx: NodeContext) -> Outcome:
    """The CPU facts the input-bound verdict joins with its measured input wait (docs/input-cpu.md),
    before the run: what Slurm gives each task, what this step may run on, and whether srun passes
    the job's --cpus-per-task on (22.05 to 23.10 do not)."""
    import os

    from ..cpus import PASS_ON, passes_on, slurm_version

    grant = ctx.facts.cpus
    version = slurm_version(ctx.facts.environ)
    try:
        mask = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mask = None
    omp = ctx.facts.omp_num_threads
    data = {"cpus_per_task": grant.cpus_per_task, "srun_cpus_per_task": grant.srun_cpus_per_task,
            "cpus_on_node": grant.cpus_on_node, "affinity_cpus": mask, "omp_num_threads": omp, "version": version}
    asked = (f"--cpus-per-task={grant.cpus_per_task}" if grant.cpus_per_task is not None
             else "no --cpus-per-task (Slurm's default: 1 CPU per task)")
    line = (f"{asked}; SRUN_CPUS_PER_TASK {grant.srun_cpus_per_task if grant.srun_cpus_per_task else 'unset'}; "
            f"this step may run on {mask if mask is not None else '?'} CPU(s); "
            f"{grant.cpus_on_node if grant.cpus_on_node else '?'} allocated on the node; "
            f"OMP_NUM_THREADS {omp if omp else 'unset (torchrun sets 1)'}; Slurm {version or 'version unknown'}")
    if (grant.cpus_per_task or 1) > 1 and grant.srun_cpus_per_task is None and passes_on(version) is False:
        return warned(f"{line}: srun of Slurm {version} does not pass --cpus-per-task={grant.cpus_per_task} on to "
                      "its tasks, so each task of `srun traceml run` gets 1 CPU and its DataLoader workers share it",
                      f"In the job script, before srun: `{PASS_ON}`.", **data)
    return passed(line, **data)


CHECKS = (
    CheckSpec("slurm.context", "Inside a Slurm allocation", check_context, scope="job"),
    CheckSpec("slurm.tasks-per-node", "One launcher task per node", check_tasks_per_node, scope="job"),
    CheckSpec("slurm.launch-config", "Launch config resolves", check_launch_config),
    CheckSpec("slurm.stale-env", "No stale launcher variables", check_stale_env),
    CheckSpec("slurm.cpus", "CPUs for each task", check_cpus),
)
