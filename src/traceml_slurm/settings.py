"""The Slurm variables we read, typed, read from a mapping (never straight from os.environ).

pydantic-settings gives the typing and one place that names every variable; a malformed value is
turned into a one-paragraph :class:`ConfigError` that names the variable, the value and the fix.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from traceml_core.errors import ConfigError

#: what to tell the user when Slurm's own variable is malformed
_FIX = "Slurm sets this variable; if your script or shell sets it, remove that (or pass the matching flag)."


class SlurmVars(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", case_sensitive=True, populate_by_name=False)

    # job
    job_id: Optional[str] = Field(None, alias="SLURM_JOB_ID")
    job_name: Optional[str] = Field(None, alias="SLURM_JOB_NAME")
    job_nodelist: Optional[str] = Field(None, alias="SLURM_JOB_NODELIST")
    job_num_nodes: Optional[int] = Field(None, alias="SLURM_JOB_NUM_NODES", ge=1)
    nnodes: Optional[int] = Field(None, alias="SLURM_NNODES", ge=1)
    submit_dir: Optional[str] = Field(None, alias="SLURM_SUBMIT_DIR")
    array_job_id: Optional[str] = Field(None, alias="SLURM_ARRAY_JOB_ID")
    array_task_id: Optional[str] = Field(None, alias="SLURM_ARRAY_TASK_ID")
    restart_count: Optional[int] = Field(None, alias="SLURM_RESTART_COUNT", ge=0)
    het_size: Optional[int] = Field(None, alias="SLURM_HET_SIZE", ge=1)
    het_job_id: Optional[str] = Field(None, alias="SLURM_HET_JOB_ID")
    ntasks_per_node: Optional[int] = Field(None, alias="SLURM_NTASKS_PER_NODE", ge=1)
    job_gpus: Optional[str] = Field(None, alias="SLURM_JOB_GPUS")
    # step (absent in a batch shell and in an salloc shell)
    step_id: Optional[str] = Field(None, alias="SLURM_STEP_ID")
    step_num_nodes: Optional[int] = Field(None, alias="SLURM_STEP_NUM_NODES", ge=1)
    step_nodelist: Optional[str] = Field(None, alias="SLURM_STEP_NODELIST")
    step_tasks_per_node: Optional[str] = Field(None, alias="SLURM_STEP_TASKS_PER_NODE")
    step_num_tasks: Optional[int] = Field(None, alias="SLURM_STEP_NUM_TASKS", ge=1)
    step_gpus: Optional[str] = Field(None, alias="SLURM_STEP_GPUS")
    pty_port: Optional[str] = Field(None, alias="SLURM_PTY_PORT")
    # node
    nodeid: Optional[int] = Field(None, alias="SLURM_NODEID", ge=0)
    procid: Optional[int] = Field(None, alias="SLURM_PROCID", ge=0)
    localid: Optional[int] = Field(None, alias="SLURM_LOCALID", ge=0)
    nodename: Optional[str] = Field(None, alias="SLURMD_NODENAME")
    gpus_on_node: Optional[int] = Field(None, alias="SLURM_GPUS_ON_NODE", ge=0)
    gpus_per_node: Optional[str] = Field(None, alias="SLURM_GPUS_PER_NODE")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # type: ignore[override]
        # Only what the caller passes: the resolver stays a pure function of its mapping.
        return (init_settings,)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "SlurmVars":
        names = {f.alias for f in cls.model_fields.values() if f.alias}
        # Blank node lists are kept (and refused later, naming them); other blanks count as unset.
        keep_blank = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}
        raw: dict[str, Any] = {k: v.strip() for k, v in environ.items()
                               if k in names and (v.strip() != "" or k in keep_blank)}
        try:
            return cls(**raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            variable = str(first["loc"][0])
            value = raw.get(variable)
            what = "a whole number" if "int" in first["type"] else "valid"
            if first["type"] in ("greater_than_equal", "greater_than"):
                what = f"at least {first.get('ctx', {}).get('ge', 0)}"
            raise ConfigError(
                f"{variable}={value!r} is not {what}, so TraceML cannot derive the launch from it. {_FIX}",
                variable=variable,
            ) from None

    def source(self, field: str) -> str:
        return "slurm:" + str(type(self).model_fields[field].alias)
