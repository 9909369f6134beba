"""AggregatorSettings: everything the launcher hands the aggregator process, in one dataclass.

The launcher builds it from its :class:`~traceml_core.config.LaunchConfig` and passes it to the
child as one JSON line on stdin (never in argv or the environment, so the run token is not visible
in ``ps`` or ``/proc/<pid>/environ``). The aggregator persists :meth:`public` (no token) in its
checkpoints so a summary can be rebuilt without the launcher.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

#: first stdout line of the aggregator process when it listens / when it cannot start
READY = "TRACEML_AGGREGATOR_READY"
ERROR = "TRACEML_AGGREGATOR_ERROR"


@dataclass
class AggregatorSettings:
    run_name: str
    #: the per-run secret; hellos must carry HMAC(token, ...) (see wire/protocol.py)
    token: str
    #: <logs_dir>/<run_name>; a fallback under $TMPDIR/traceml/ is used when it is not writable
    run_dir: Path
    job_id: Optional[str] = None
    bind_host: str = "127.0.0.1"
    #: 0 = any free port (the READY line reports the real one)
    port: int = 29765
    nnodes: int = 1
    nproc_per_node: int = 1
    mode: str = "summary"
    #: seconds after start by which every node should have joined (node 0 gives up after that)
    node_join_window_s: float = 60.0
    #: a node joining more than this many seconds after the start is noted as late: every other
    #: node waited for it (a slow `module load`, a slow shared filesystem, a delayed srun task)
    late_join_s: float = 5.0
    master_addr: str = ""
    #: hostnames by node rank, when the launcher knows them (for example from SLURM_JOB_NODELIST)
    hostnames: list[str] = field(default_factory=list)
    #: wall-clock time the launcher started (the run's start in the summary)
    started_at: float = field(default_factory=time.time)
    #: how the launcher got the port (for error messages), e.g. "--aggregator-port" or "default"
    port_source: str = "default"
    #: the training script and its arguments as given to `traceml run` (the summary's run
    #: section keeps them so `traceml compare` can tell runs of different scripts apart)
    script: str = ""
    script_args: list[str] = field(default_factory=list)
    #: what to write besides the summary at the end (options.EXPORT_KINDS; traceml_core/export.py)
    export: list[str] = field(default_factory=list)

    # --- tuning knobs; the defaults are what `traceml run` uses -------------------------------
    #: interval between checkpoints of the aggregate state (stretched so writing costs <5% CPU)
    checkpoint_interval_s: float = 2.0
    #: after `finish`, how long to keep reading data still in flight from ranks
    drain_s: float = 3.0
    #: after SIGTERM, how long to wait for the launcher's `finish` (Slurm KillWait is 30 s)
    term_grace_s: float = 20.0
    #: after the launcher's control connection drops without `finish`, how long to wait for ranks
    launcher_lost_grace_s: float = 10.0
    #: a connection must complete its hello within this many seconds
    handshake_timeout_s: float = 10.0
    #: at most this many connections may be waiting for their hello; the oldest is dropped beyond
    max_pending_handshakes: int = 1024
    #: at most this many records of one batch feed the quantile sketches (systematic sample,
    #: weighted); counts, sums and maxima always use every record
    sketch_sample_cap: int = 16
    #: upper bound on bytes buffered across all connections before the biggest is cut
    max_buffered_bytes: int = 512 * 1024 * 1024

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def to_json(self) -> str:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "AggregatorSettings":
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown aggregator settings: {', '.join(unknown)}")
        data["run_dir"] = Path(data["run_dir"])
        data["hostnames"] = list(data.get("hostnames") or [])
        data["script_args"] = [str(a) for a in data.get("script_args") or []]
        data["export"] = [str(a) for a in data.get("export") or []]
        return cls(**data)

    def public(self) -> dict[str, Any]:
        """The settings without the token, as plain data (what checkpoints and summaries keep)."""
        data = asdict(self)
        data.pop("token")
        data["run_dir"] = str(self.run_dir)
        return data
