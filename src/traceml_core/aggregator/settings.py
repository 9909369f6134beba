"""AggregatorSettings: everything the launcher hands the aggregator process, in one pydantic model.

The launcher builds it from its :class:`~traceml_core.config.LaunchConfig` and passes it to the
child as one JSON line on stdin (never in argv or the environment, so the run token is not visible
in ``ps`` or ``/proc/<pid>/environ``). The aggregator persists :meth:`public` (no token) in its
checkpoints so a summary can be rebuilt without the launcher.

It is a model of the one settings mechanism (:mod:`traceml_core.settings`): its numbers carry the
bounds of :mod:`traceml_core.limits`, checked again when the aggregator reads them (unknown keys
are refused), so a settings line that was tampered with or written by another version fails
loudly instead of starting an aggregator with absurd sizes.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from .. import limits
from ..settings import bounded

#: first stdout line of the aggregator process when it listens / when it cannot start
READY = "TRACEML_AGGREGATOR_READY"
ERROR = "TRACEML_AGGREGATOR_ERROR"


class AggregatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    run_name: str
    #: the per-run secret; relays' hellos must carry HMAC(token, ...) (see wire/auth.py)
    token: str
    #: <logs_dir>/<run_name>; a fallback under $TMPDIR/traceml/ is used when it is not writable
    run_dir: Path
    job_id: Optional[str] = None
    #: which attempt of the job this is (Slurm: SLURM_RESTART_COUNT, 0 when unset) and when the
    #: cluster started its allocation, where the launch config knows them: the goodput ledger's
    #: attempt and window, also when no launcher's lifecycle record arrives (a killed attempt)
    restart_count: Optional[bounded(limits.RESTARTS)] = None  # type: ignore[valid-type]
    job_start_time: Optional[float] = None
    bind_host: str = "127.0.0.1"
    #: 0 = any free port (the READY line reports the real one)
    port: bounded(limits.PORT_OR_AUTO) = 29765  # type: ignore[valid-type]
    nnodes: bounded(limits.NODES) = 1  # type: ignore[valid-type]
    nproc_per_node: bounded(limits.PROCS_PER_NODE) = 1  # type: ignore[valid-type]
    mode: str = "summary"
    #: seconds after start by which every node should have joined (node 0 gives up after that)
    node_join_window_s: bounded(limits.WAIT_S) = 60.0  # type: ignore[valid-type]
    #: a node joining more than this many seconds after the start is noted as late: every other
    #: node waited for it (a slow `module load`, a slow shared filesystem, a delayed srun task)
    late_join_s: bounded(limits.WAIT_S) = 5.0  # type: ignore[valid-type]
    master_addr: str = ""
    #: hostnames by node rank, when the launcher knows them (for example from SLURM_JOB_NODELIST)
    hostnames: list[str] = Field(default_factory=list, max_length=limits.NODES.hi)
    #: wall-clock time the launcher started (the run's start in the summary)
    started_at: float = Field(default_factory=time.time)
    #: how the launcher got the port (for error messages), e.g. "--aggregator-port" or "default"
    port_source: str = "default"
    #: the training script and its arguments as given to `traceml run` (the summary's run
    #: section keeps them so `traceml compare` can tell runs of different scripts apart)
    script: str = ""
    script_args: list[str] = Field(default_factory=list)
    #: what to write besides the summary at the end (options.EXPORT_KINDS; traceml_core/report/export.py)
    export: list[str] = Field(default_factory=list)
    #: seconds between live exports (traceml_core/exporters)
    export_interval_s: float = Field(10.0, ge=limits.EXPORT_INTERVAL_S.lo, le=limits.EXPORT_INTERVAL_S.hi)
    #: the outputs' settings, by option key (exporters/output.py: each output's option rows, as
    #: the launch resolved them); an output reads its own, never the environment
    export_settings: dict[str, Any] = Field(default_factory=dict, max_length=256)
    #: ``--hang-report-after``: "auto", "off", or seconds (aggregator/hangwatch.py: the backstop;
    #: "off" turns hang detection off)
    hang_report_after: str = Field("auto", max_length=32)
    #: the cluster plugin of the launch (``slurm``; ``none``/empty: none): the final summary hands
    #: it the run's node evidence and shows its lines for the next job (report/nextjob.py)
    cluster: str = Field("", max_length=64)
    #: the key of the ``control`` hello: made fresh for each aggregator, known only to node 0's
    #: launcher and this process (it travels on the child's stdin), so no other process of the
    #: run - a rank, another node - can finish the run or read its live state
    control_token: str = Field(default_factory=lambda: secrets.token_hex(16))
    #: nodes per group relay (launcher/grouprelay.py; 0: every node's relay connects here): from
    #: hundreds of nodes on, the nodes' relays report through group relays on every
    #: ``relay_fan_in``-th node, which connect here
    relay_fan_in: int = Field(0, ge=0, le=limits.NODES.hi)
    #: a restarted aggregator: the checkpoint of the one that died, to go on from
    #: (aggregator/resume.py); empty for a fresh run
    resume_from: str = ""
    #: this launch of the run: fresh for each ``traceml run``, kept by a restarted aggregator. Its
    #: checkpoints carry it, so a checkpoint of another run (the same name in the same logs
    #: directory) is never resumed, and it owns the run directory's claim (aggregator/claim.py)
    run_id: str = Field(default_factory=lambda: secrets.token_hex(8), max_length=64)

    # --- tuning knobs; the defaults are what `traceml run` uses -------------------------------
    #: interval between checkpoints of the aggregate state (stretched so writing costs <5% CPU)
    checkpoint_interval_s: bounded(limits.WAIT_S) = 2.0  # type: ignore[valid-type]
    #: after `finish`, how long to keep reading data still in flight from ranks
    drain_s: bounded(limits.WAIT_S) = 3.0  # type: ignore[valid-type]
    #: after SIGTERM, how long to wait for the launcher's `finish` (Slurm KillWait is 30 s)
    term_grace_s: bounded(limits.WAIT_S) = 20.0  # type: ignore[valid-type]
    #: after the launcher's control connection drops without `finish`, how long to wait for ranks
    launcher_lost_grace_s: bounded(limits.WAIT_S) = 10.0  # type: ignore[valid-type]
    #: a connection must complete its hello within this many seconds
    handshake_timeout_s: bounded(limits.WAIT_S) = 10.0  # type: ignore[valid-type]
    #: at most this many connections may be waiting for their hello; the oldest is dropped beyond
    max_pending_handshakes: int = Field(1024, ge=1, le=1 << 20)
    #: upper bound on bytes buffered across all connections before the biggest is cut
    max_buffered_bytes: int = Field(512 * 1024 * 1024, ge=1 << 16, le=1 << 40)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def public(self) -> dict[str, Any]:
        """The settings without the token, as plain data (what checkpoints and summaries keep)."""
        return self.model_dump(mode="json", exclude={"token", "control_token"})
