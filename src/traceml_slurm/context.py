"""Where in a Slurm job this process runs: batch shell, salloc shell, srun step, interactive step.

Told apart by the step variables (``SLURM_STEP_ID`` and friends exist only in srun steps), never
by ``SLURM_NODEID``, which a batch shell also has (set to 0). An salloc shell runs on the login
host and has no ``SLURM_NODEID`` / ``SLURMD_NODENAME``. An interactive step (``srun --pty``, or
Slurm's ``use_interactive_step``) has a pty port or the step id ``interactive``.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic costs ~0.1 s to import: only Slurm jobs pay it (see settings)
    from .settings import SlurmVars

#: Slurm's numeric id of the interactive step (SLURM_INTERACTIVE_STEP)
INTERACTIVE_STEP_IDS = {"interactive", "4294967290"}
BATCH_STEP_IDS = {"batch", "4294967291"}


class Context(str, Enum):
    NONE = "none"
    BATCH_SHELL = "batch shell"
    SALLOC_SHELL = "salloc shell"
    STEP = "srun step"
    INTERACTIVE_STEP = "interactive step"


def classify(v: SlurmVars) -> Context:
    if v.job_id is None:
        return Context.NONE
    if v.step_id is None or v.step_id in BATCH_STEP_IDS:
        if v.nodeid is None and v.nodename is None:
            return Context.SALLOC_SHELL
        return Context.BATCH_SHELL
    if v.step_id in INTERACTIVE_STEP_IDS or v.pty_port is not None:
        return Context.INTERACTIVE_STEP
    return Context.STEP
