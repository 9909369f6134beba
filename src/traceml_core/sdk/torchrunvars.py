"""torchrun's variables for each worker, read like every other variable TraceML takes: each one
bounded by :mod:`traceml_core.limits`, read from the mapping given, a bad value one paragraph that
names the variable, the value and the fix (``init()`` logs it and goes on without telemetry).

Read with :meth:`~traceml_core.limits.Limit.parse`, the rule's own reader where no pydantic model
is needed, not with an EnvSettings model: every rank reads these in ``init()``, and a model would
import pydantic there (+125 ms of CPU per ``init()``, measured; the SDK imports no pydantic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from .. import limits
from ..errors import ConfigError, show

#: (field, variable, bound) of each variable that ``init()`` reads
VARIABLES = (("rank", "RANK", limits.TASK_RANK), ("local_rank", "LOCAL_RANK", limits.LOCAL_RANK),
             ("world_size", "WORLD_SIZE", limits.TASKS), ("group_rank", "GROUP_RANK", limits.NODE_RANK))


@dataclass(frozen=True)
class TorchrunVars:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    #: the node's rank in torchrun's rendezvous (when no launcher said it)
    group_rank: Optional[int] = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "TorchrunVars":
        """The variables set in ``environ`` (a blank one counts as unset); ConfigError on a bad one."""
        values = {}
        for field, var, limit in VARIABLES:
            raw = environ.get(var)
            if raw is not None and raw.strip():
                try:
                    values[field] = limit.parse(raw)
                except ValueError as exc:
                    raise ConfigError(f"{var}={show(raw.strip())} {exc}. torchrun sets {var} for each "
                                      "worker; if your script or shell sets it, correct or remove that.",
                                      variable=var) from None
        return cls(**values)  # type: ignore[arg-type]
