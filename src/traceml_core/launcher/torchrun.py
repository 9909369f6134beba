"""Build the torchrun (torch.distributed.run) command line from a LaunchConfig.

Static rendezvous, as the seed guide describes: every node is told its rank; node 0 is the
master. ``--max-restarts=0`` because a restarted worker would restart its step numbering and
TraceML would count it twice; Slurm's requeue is the restart mechanism we support.
"""

from __future__ import annotations

import sys
from typing import Sequence

from ..config import LaunchConfig


def torchrun_command(config: LaunchConfig, script: str, script_args: Sequence[str], *,
                     python: str | None = None) -> list[str]:
    cmd = [
        python or sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={config.nnodes}",
        f"--node-rank={config.node_rank}",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--master-addr={config.master_addr}",
        f"--master-port={config.master_port}",
        "--max-restarts=0",
        script,
    ]
    cmd.extend(script_args)
    return cmd
