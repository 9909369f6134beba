"""The commands that start the workers: torchrun's (torch.distributed.run) from a LaunchConfig,
and the task layout's one worker.

Static rendezvous, as the seed guide describes: every node is told its rank; node 0 is the
master. ``--max-restarts=0`` because a restarted worker would restart its step numbering and
TraceML would count it twice; Slurm's requeue is the restart mechanism we support.

The launcher runs this command through :mod:`.agent` (``python -m traceml_core.launcher.agent``
followed by the same torchrun arguments), which checks the workers' Python before it hands over to
torchrun; :func:`agent_command` builds that form.
"""

from __future__ import annotations

import sys
from typing import Sequence

from ..config import LaunchConfig

AGENT_MODULE = "traceml_core.launcher.agent"
#: what each worker runs in place of the bare script (traceml_core/bootstrap.py)
BOOTSTRAP_MODULE = "traceml_core.bootstrap"


def worker_argv(script: str, script_args: Sequence[str], extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun flags, what follows them) so that each worker starts through the bootstrap:
    ``--module traceml_core.bootstrap SCRIPT ARGS`` (``... -m MODULE ARGS`` for ``--module``).
    A ``--no-python`` program is not Python, so it is left as it is."""
    flags = list(extra)
    if "--no-python" in flags:
        return flags, [script, *script_args]
    user_module = "--module" in flags
    flags = [f for f in flags if f != "--module"] + ["--module"]
    return flags, [BOOTSTRAP_MODULE, *(["-m", script] if user_module else [script]), *script_args]


def torchrun_command(config: LaunchConfig, script: str, script_args: Sequence[str], *,
                     python: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``extra``: torchrun flags passed on from the command line (see runargs.py), placed before
    the script as torchrun requires. Workers start through the bootstrap (:func:`worker_argv`)."""
    extra, tail = worker_argv(script, script_args, extra)
    cmd = [
        python or sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={config.nnodes}",
        f"--node-rank={config.node_rank}",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--master-addr={config.master_addr}",
        f"--master-port={config.master_port}",
        "--max-restarts=0",
        *extra,
        *tail,
    ]
    return cmd


def agent_command(torchrun: Sequence[str]) -> list[str]:
    """The same command run through the pre-flight agent."""
    assert list(torchrun[1:3]) == ["-m", "torch.distributed.run"], torchrun
    return [torchrun[0], "-m", AGENT_MODULE, *torchrun[3:]]


def worker_command(script: str, script_args: Sequence[str], *, module: bool = False,
                   no_python: bool = False, python: str | None = None) -> list[str]:
    """The task layout's one worker (no torchrun): the script through the bootstrap (a
    ``--no-python`` program as is)."""
    if no_python:
        return [script, *script_args]
    target = ["-m", script] if module else [script]
    return [python or sys.executable, "-u", "-m", BOOTSTRAP_MODULE, *target, *script_args]
