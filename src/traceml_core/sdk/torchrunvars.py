"""torchrun's variables for each worker: one settings model (core's EnvSettings), like Slurm's.

Each field is read from its variable (``rank`` -> ``RANK``), typed and bounded (:mod:`traceml_core.limits`)
from the mapping given; a malformed value is one ConfigError naming the variable, the value and
the fix (``init()`` then logs it and leaves telemetry off, never raising into training). Its own
module because pydantic is imported with it: only ``init()`` pays that, not ``import traceml``.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from .. import limits
from ..settings import EnvSettings, SettingsConfigDict, bounded


class TorchrunVars(EnvSettings):
    model_config = SettingsConfigDict(**{**EnvSettings.model_config, "env_prefix": ""})
    strip_values: ClassVar[bool] = True

    rank: Optional[bounded(limits.TASK_RANK)] = None  # type: ignore[valid-type]
    local_rank: Optional[bounded(limits.LOCAL_RANK)] = None  # type: ignore[valid-type]
    world_size: Optional[bounded(limits.TASKS)] = None  # type: ignore[valid-type]
    #: the node's rank in torchrun's rendezvous (when no launcher said it)
    group_rank: Optional[bounded(limits.NODE_RANK)] = None  # type: ignore[valid-type]

    @classmethod
    def fix(cls, field: str) -> str:
        return (f"torchrun sets {cls.variable(field)} for each worker; if your script or shell sets it, "
                "correct or remove that.")
