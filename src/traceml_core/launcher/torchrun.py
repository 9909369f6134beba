"""Build the torchrun (torch.distributed.run) command line from a LaunchConfig.

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


def torchrun_command(config: LaunchConfig, script: str, script_args: Sequence[str], *,
                     python: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``extra``: torchrun flags passed on from the command line (see runargs.py), placed before
    the script as torchrun requires."""
    cmd = [
        python or sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={config.nnodes}",
        f"--node-rank={config.node_rank}",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--master-addr={config.master_addr}",
        f"--master-port={config.master_port}",
        "--max-restarts=0",
        *extra,
        script,
    ]
    cmd.extend(script_args)
    return cmd


def agent_command(torchrun: Sequence[str]) -> list[str]:
    """The same command run through the pre-flight agent."""
    assert list(torchrun[1:3]) == ["-m", "torch.distributed.run"], torchrun
    return [torchrun[0], "-m", AGENT_MODULE, *torchrun[3:]]
