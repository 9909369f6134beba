"""The Slurm variables we read: one settings model (core's EnvSettings), prefix ``SLURM_``, from a mapping.

Core's settings mechanism (:mod:`traceml_core.settings`) maps each field to its variable
(``job_id`` -> ``SLURM_JOB_ID``; ``SLURMD_NODENAME`` by alias), types and bounds it (bounds from
:mod:`traceml_core.limits`) and reads only the mapping it is given, so the resolver stays a pure
function. A malformed value is one :class:`ConfigError` naming the variable, the value and the
fix. Values are stripped; a blank one counts as unset, except the node lists (refused, named).
"""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import Field

from traceml_core import limits
from traceml_core.settings import EnvSettings, SettingsConfigDict, bounded

#: what to tell the user when Slurm's own variable is malformed
_FIX = "Slurm sets this variable; if your script or shell sets it, remove that (or pass the matching flag)."


class SlurmVars(EnvSettings):
    model_config = SettingsConfigDict(**{**EnvSettings.model_config, "env_prefix": "SLURM_"})
    keep_blank: ClassVar[frozenset[str]] = frozenset({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"})
    strip_values: ClassVar[bool] = True

    # job
    job_id: Optional[str] = None
    job_name: Optional[str] = None
    job_nodelist: Optional[str] = Field(None, max_length=limits.NODELIST_CHARS.hi)
    job_num_nodes: Optional[bounded(limits.NODES)] = None  # type: ignore[valid-type]
    nnodes: Optional[bounded(limits.NODES)] = None  # type: ignore[valid-type]
    submit_dir: Optional[str] = None
    array_job_id: Optional[str] = None
    array_task_id: Optional[str] = None
    restart_count: Optional[bounded(limits.RESTARTS)] = None  # type: ignore[valid-type]
    het_size: Optional[bounded(limits.NODES)] = None  # type: ignore[valid-type]
    het_job_id: Optional[str] = None
    ntasks_per_node: Optional[bounded(limits.PROCS_PER_NODE)] = None  # type: ignore[valid-type]
    job_gpus: Optional[str] = None
    #: Slurm >= 23.02: the job's end (time limit) and start, in seconds since the epoch
    job_end_time: Optional[bounded(limits.EPOCH_S)] = None  # type: ignore[valid-type]
    job_start_time: Optional[bounded(limits.EPOCH_S)] = None  # type: ignore[valid-type]
    # step (absent in a batch shell and in an salloc shell)
    step_id: Optional[str] = None
    step_num_nodes: Optional[bounded(limits.NODES)] = None  # type: ignore[valid-type]
    step_nodelist: Optional[str] = Field(None, max_length=limits.NODELIST_CHARS.hi)
    step_tasks_per_node: Optional[str] = Field(None, max_length=limits.NODELIST_CHARS.hi)
    step_num_tasks: Optional[bounded(limits.TASKS)] = None  # type: ignore[valid-type]
    step_gpus: Optional[str] = None
    pty_port: Optional[str] = None
    # node
    nodeid: Optional[bounded(limits.NODE_RANK)] = None  # type: ignore[valid-type]
    procid: Optional[bounded(limits.TASK_RANK)] = None  # type: ignore[valid-type]
    localid: Optional[bounded(limits.LOCAL_RANK)] = None  # type: ignore[valid-type]
    nodename: Optional[str] = Field(None, alias="SLURMD_NODENAME")
    gpus_on_node: Optional[bounded(limits.GPUS_PER_NODE)] = None  # type: ignore[valid-type]
    gpus_per_node: Optional[str] = None

    @classmethod
    def fix(cls, field: str) -> str:
        return _FIX

    def source(self, field: str) -> str:
        return "slurm:" + type(self).variable(field)
