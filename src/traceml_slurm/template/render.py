"""Build the sbatch file and the per-node ``launch.sh`` from a resolved job.

What every generated job does, and why:

- ``#SBATCH --ntasks-per-node=1`` and ``srun --ntasks-per-node=1``: ONE ``traceml run`` per node; it
  starts one worker per GPU itself. With ``--layout=task`` (Lightning's and submitit's layout):
  ``--ntasks-per-node=<GPUs>``, every task one rank, no torchrun. ``traceml run`` reads the node count, its node rank, its GPUs and
  the master address from Slurm on each node, so nothing node-specific is expanded in the batch shell
  (the per-node expansion gotcha cannot happen).
- ``srun --kill-on-bad-exit=1``: one failed node stops the others instead of leaving them hanging.
- ``srun --cpus-per-task``: since Slurm 22.05 srun no longer inherits ``--cpus-per-task`` from sbatch.
- ``PYTHONUNBUFFERED=1``: output reaches the Slurm log as it happens.
- ``TRACEML_TOKEN``: a fresh random token per job, exported before srun so Slurm hands it to every
  node's launcher through the step's environment (no shared file, never on the network).
- Time limit: the one recipe (:mod:`traceml_slurm.timelimit`), ``#SBATCH --signal=TERM@<margin>``:
  Slurm sends SIGTERM to the step's tasks (never to the batch shell or srun, which would turn it
  into SIGKILL for its tasks) ``--signal-margin`` seconds before the limit. Each launcher then
  stops its workers and node 0 writes the summary, marked interrupted.
- Setup lines run with ``set +u`` (``module`` and ``conda activate`` scripts read unset variables)
  in the batch shell before srun, so node 0 starts its aggregator promptly after srun.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Optional

from traceml_core import __version__

from ..timelimit import directive
from .model import JobSpec, ResolvedJob

WRAPPER_NAME = "launch.sh"
INDENT = "  "


@dataclass(frozen=True)
class GeneratedFile:
    name: str
    path: str
    content: str
    executable: bool = False


def sbatch_filename(job: ResolvedJob) -> str:
    return f"{job.spec.job_name}.sbatch"


def _rel(out_dir: Optional[str], name: str) -> str:
    if not out_dir or out_dir in (".", "./"):
        return name
    return str(PurePosixPath(out_dir) / name)


def regenerate_line(job: ResolvedJob) -> str:
    return shlex.join(["traceml", "slurm", "template", *job.command])


def gpu_directive(spec: JobSpec) -> Optional[str]:
    if spec.gpus_per_node == 0:
        return None
    count = f"{spec.gpu_type}:{spec.gpus_per_node}" if spec.gpu_type else str(spec.gpus_per_node)
    if spec.gpu_request == "gres":
        return f"--gres=gpu:{count}"
    return f"--gpus-per-node={count}"


def tasks_per_node(spec: JobSpec) -> int:
    """srun tasks per node: one launcher, or (--layout=task) one task per GPU or CPU worker."""
    return spec.workers_per_node if spec.layout == "task" else 1


def sbatch_directives(spec: JobSpec) -> list[str]:
    """The ``#SBATCH`` options, values shell-quoted (sbatch strips the quotes like a shell)."""
    q = shlex.quote
    d = [f"--job-name={q(spec.job_name)}", f"--nodes={spec.nodes}", f"--ntasks-per-node={tasks_per_node(spec)}"]
    gpu = gpu_directive(spec)
    if gpu:
        d.append(gpu)
    if spec.cpus_per_task is not None:
        d.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.mem is not None:
        d.append(f"--mem={spec.mem}")
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(spec, key)
        if value is not None:
            d.append(f"--{key}={q(value)}")
    if spec.time is not None:
        d.append(f"--time={q(spec.time)}")
    if spec.exclusive:
        d.append("--exclusive")
    if spec.exclude:
        d.append(f"--exclude={q(spec.exclude)}")
    d.append(f"--output={q(spec.output_pattern)}")
    if spec.requeue is True:
        d.append("--requeue")
    elif spec.requeue is False:
        d.append("--no-requeue")
    if spec.signal_margin > 0:
        d.append(directive(spec.signal_margin))
    return d


def traceml_argv(spec: JobSpec) -> list[str]:
    """``traceml run`` with only the values that are the same on every node; Slurm supplies the rest."""
    argv = ["traceml", "run", f"--mode={spec.mode}"]
    if spec.gpus_per_node == 0 and spec.layout == "node":   # (task layout: the tasks per node)
        argv.append(f"--nproc-per-node={spec.workers_per_node}")
    if spec.logs_dir is not None:
        argv.append(f"--logs-dir={spec.logs_dir}")
    argv.append(spec.script)
    if spec.script_args:
        argv += ["--", *spec.script_args]  # `--`: script flags never collide with TraceML's
    return argv


def launch_argv(spec: JobSpec) -> list[str]:
    """What runs on each node: ``traceml run ...``, inside ``apptainer exec`` when asked."""
    argv = traceml_argv(spec)
    if spec.apptainer_image:
        pre = ["apptainer", "exec"]
        if spec.gpus_per_node > 0:
            pre.append("--nv")
        if spec.container_mount:
            pre += ["--bind", ",".join(spec.container_mount)]
        argv = pre + [spec.apptainer_image] + argv
    return argv


def srun_words(spec: JobSpec) -> list[str]:
    """srun and its options as shell words (already quoted; the submit directory is expanded at run time)."""
    words = ["srun", "--kill-on-bad-exit=1", f"--ntasks-per-node={tasks_per_node(spec)}"]
    if spec.cpus_per_task is not None:
        words.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.container_image:
        mounts = '"$SLURM_SUBMIT_DIR"'
        if spec.container_mount:
            mounts += shlex.quote("," + ",".join(spec.container_mount))
        words += [f"--container-image={shlex.quote(spec.container_image)}", f"--container-mounts={mounts}",
                  '--container-workdir="$SLURM_SUBMIT_DIR"']
    return words


def _continued(first: list[str], rest: list[str], indent: str = INDENT) -> str:
    """One command over two lines: srun and its options, then the command it runs."""
    return " ".join(first) + " \\\n" + indent + INDENT + " ".join(rest)


def build_sbatch(job: ResolvedJob) -> str:
    s = job.spec
    wrapper_path = _rel(job.out_dir, WRAPPER_NAME)
    sbatch_path = _rel(job.out_dir, sbatch_filename(job))
    lines = [
        "#!/bin/bash",
        f"# {sbatch_filename(job)}: a TraceML training job, written by traceml slurm template (traceml {__version__}).",
        "# Change the command below rather than this file, and run it again to regenerate:",
        f"#   {regenerate_line(job)}",
        f"# Submit from the directory it was generated in: sbatch {shlex.quote(sbatch_path)}",
        f"# {s.nodes} node(s) x {s.workers_per_node} worker(s) = {s.world_size} processes. "
        + ("TraceML reads node rank, node count, GPUs and master from Slurm on each node."
           if s.layout == "node" else
           "One srun task per GPU (--layout=task): each task is one rank; TraceML reads its rank, local "
           "rank, the world size and the master from Slurm in each task."),
    ]
    lines += [f"#SBATCH {d}" for d in sbatch_directives(s)]
    lines += ["", "set -euo pipefail", 'cd "$SLURM_SUBMIT_DIR"', ""]
    if s.setup:
        lines += ["# Setup: once, in this shell, BEFORE srun (node 0 must start its aggregator promptly);",
                  "# Slurm copies the resulting environment to every node. set +u: module/conda scripts",
                  "# read unset variables.",
                  "set +u", *s.setup, "set -u", ""]
    lines += ["# Environment for every node (Slurm exports this shell's environment to the step).",
              "export PYTHONUNBUFFERED=1"]
    if s.nccl_ifname:
        lines.append(f"export NCCL_SOCKET_IFNAME={shlex.quote(s.nccl_ifname)}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in s.env]
    lines += [
        "# The run's auth token: fresh and random per job, handed to every node's launcher through the",
        "# step's environment (readable only by you and root); it never crosses the network.",
        "TRACEML_TOKEN=\"$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\"",
        "export TRACEML_TOKEN",
        "",
    ]
    lines += _signal_block(s)
    per = "node" if s.layout == "node" else "task"
    if s.wrapper:
        run = ["bash", shlex.quote(wrapper_path)]
        comment = (f"# One launcher per node: srun runs {wrapper_path} on each node." if per == "node" else
                   f"# One task per GPU: srun runs {wrapper_path} in each task (each task is one rank).")
    else:
        run = [shlex.quote(w) for w in launch_argv(s)]
        comment = ("# One launcher per node; each reads its own node rank from Slurm." if per == "node" else
                   "# One task per GPU, each task one rank; each reads its rank from Slurm (no torchrun).")
    lines += [
        comment,
        "# --kill-on-bad-exit=1: a failed node stops the others.",
        _continued(srun_words(s), run),
    ]
    return "\n".join(lines) + "\n"


def _signal_block(s: JobSpec) -> list[str]:
    if s.signal_margin <= 0:
        return ["# No early signal (--signal-margin 0): at the time limit Slurm sends SIGTERM and, KillWait",
                "# seconds later, SIGKILL; node 0 writes the summary if that is long enough.", ""]
    return [f"# Time limit: {s.signal_margin} s before it ({directive(s.signal_margin)}), Slurm sends SIGTERM to "
            "every task of the step",
            "# (not to this shell or srun): each launcher stops its workers and node 0 writes the summary,",
            "# marked interrupted.", ""]


def build_wrapper(job: ResolvedJob) -> str:
    s = job.spec
    lines = [
        "#!/bin/bash",
        f"# {WRAPPER_NAME}: runs once per {'node' if s.layout == 'node' else 'task'} inside the srun step of "
        f"{sbatch_filename(job)} (written by",
        f"# traceml slurm template, traceml {__version__}). Regenerate with:",
        f"#   {regenerate_line(job)}",
        *(["# Each node's `traceml run` reads its own node rank, the node count, its GPUs and the master from",
           "# Slurm here, on its own node: never pass --node-rank=$SLURM_NODEID from the batch shell."]
          if s.layout == "node" else
          ["# Each task's `traceml run` reads its own rank, local rank, the world size and the master from",
           "# Slurm here, in its own task: never pass rank values from the batch shell."]),
        "set -eo pipefail",
    ]
    if s.node_setup:
        lines += ["# Per-node setup, inside the step on every node:", *s.node_setup]
    lines.append("exec " + " ".join(shlex.quote(w) for w in launch_argv(s)))
    return "\n".join(lines) + "\n"


def build_files(job: ResolvedJob) -> list[GeneratedFile]:
    files = [GeneratedFile(sbatch_filename(job), _rel(job.out_dir, sbatch_filename(job)), build_sbatch(job))]
    if job.spec.wrapper:
        files.append(GeneratedFile(WRAPPER_NAME, _rel(job.out_dir, WRAPPER_NAME), build_wrapper(job), True))
    return files
