"""What the launcher hands each worker: one environment variable, read once by ``traceml.init()``.

The launcher resolves the :class:`~traceml_core.config.LaunchConfig` and exports
``TRACEML_RUN_INFO`` (JSON of :class:`RunInfo`) into the workers' environment; torchrun adds
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``. The SDK never re-resolves the launch config and never
reads scheduler variables. The token travels the same way: environments of a user's processes are
readable only by that user (and root).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

ENV_VAR = "TRACEML_RUN_INFO"


@dataclass(frozen=True)
class RunInfo:
    run_name: str
    job_id: Optional[str]
    nnodes: int
    node_rank: int
    nproc_per_node: int
    aggregator_host: str
    aggregator_port: int
    token: str
    #: seconds init() may spend connecting before it gives up and becomes a no-op
    connect_wait: float
    mode: str
    logs_dir: str
    #: the worker bootstrap finds steps in a script without trace_step (``--auto-steps``)
    auto_steps: bool = True
    #: what the scheduler gave each task in CPUs (the cluster plugin's ``cpu_request``; None:
    #: not known): each rank sends it with its CPU facts (sdk/threads.py)
    cpu_request: Optional[dict] = None

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["RunInfo"]:
        raw = environ.get(ENV_VAR)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(**data)
        except (ValueError, TypeError):
            return None
