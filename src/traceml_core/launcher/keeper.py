"""Node 0's aggregator, kept by its launcher (rank 0's task in the task layout).

The keeper starts the aggregator (a child process in its own session, so training survives its
death) and holds its ``control`` connection: status queries for the watchdog, snapshots for the
live views, hang reports, the link probe's result and, at the end, ``finish``. Those come from
the monitor loop, the view's thread and the hang report's thread, so every use of the control
connection takes one lock.

When the aggregator dies mid-run (SIGKILL, an OOM kill) the keeper starts another on the same
port, going on from the last checkpoint (:meth:`AggregatorKeeper.ensure_alive`, at most
:data:`MAX_RESTARTS` times; docs/reliability.md).
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from .grouprelay import tree_fan_in
from ..aggregator.process import AggregatorHandle, start_aggregator
from ..aggregator.settings import AggregatorSettings
from ..config import LaunchConfig
from ..livesnapshot import LiveSnapshot
from ..options import export_kinds
from ..wire.client import Link, LinkError
from .supervise import log

#: how often node 0's launcher restarts an aggregator that died mid-run
MAX_RESTARTS = 2
#: seconds a status query may take
STATUS_TIMEOUT_S = 2.0


class AggregatorKeeper:
    def __init__(self, config: LaunchConfig, token: str) -> None:
        self.config = config
        self.token = token
        self.handle: Optional[AggregatorHandle] = None
        self.link: Optional[Link] = None
        self._lock = threading.Lock()
        self._restarts = 0
        self._restart_failed = False

    def start(self, script: str = "", script_args: Sequence[str] = (), *,
              allocation_start: Optional[float] = None) -> None:
        """Raises TraceMLError (port in use, run directory unusable, ...) before training starts.
        ``allocation_start``: when the cluster started the job, where the launcher learnt it
        (else the launch config's)."""
        c = self.config
        settings = AggregatorSettings(
            run_name=c.run_name, token=self.token, run_dir=c.run_dir, job_id=c.job_id,
            restart_count=c.restart_count, job_start_time=allocation_start or c.job_start_time,
            bind_host=c.aggregator_bind_host, port=c.aggregator_port, nnodes=c.nnodes,
            nproc_per_node=c.nproc_per_node, mode=c.mode, node_join_window_s=c.aggregator_wait,
            master_addr=c.master_addr, port_source=c.flag_source("aggregator_port"),
            hostnames=list(c.hosts_by_node), relay_fan_in=tree_fan_in(c),
            script=script, script_args=list(script_args), export=export_kinds(c.export),
            export_interval_s=c.export_interval, export_settings=dict(c.outputs), cluster=c.cluster or "",
            hang_report_after=str(c.hang_report_after))
        self.handle = start_aggregator(settings)
        self.link = self.handle.control
        if self.handle.run_dir_note:
            log(f"warning: {self.handle.run_dir_note}")

    @property
    def upstream(self) -> tuple[str, int]:
        """Where this node's relay reaches the aggregator."""
        assert self.handle is not None
        return self.handle.connect_host, self.handle.port

    def ensure_alive(self) -> None:
        """Node 0's aggregator died mid-run (SIGKILL, OOM kill): start another on the same port,
        going on from the last checkpoint. The relays reconnect by themselves and send what they
        still hold; what reached the dead one after its checkpoint is counted as lost, exactly
        (aggregator/resume.py). At most MAX_RESTARTS times: after that (or if it cannot start)
        the summary is rebuilt from the last checkpoint at the end, as before."""
        h = self.handle
        if h is None or h.alive() or self._restarts >= MAX_RESTARTS or self._restart_failed:
            return
        from ..rundir import CHECKPOINT_NAME
        from ..aggregator.process import _describe_exit

        code = h.proc.poll()
        self._restarts += 1
        ckpt = h.run_dir / CHECKPOINT_NAME
        log(f"warning: the aggregator exited ({_describe_exit(code)}); starting a new one on port "
            f"{h.port} from its last checkpoint (training is not affected)")
        settings = h.settings.model_copy(update={"port": h.port, "resume_from": str(ckpt) if ckpt.exists() else "",
                                                 "port_source": h.settings.port_source})
        try:
            new = start_aggregator(settings)
        except Exception as exc:  # noqa: BLE001 - telemetry trouble never stops training
            self._restart_failed = True
            log(f"warning: could not restart the aggregator ({exc}); the summary will be rebuilt "
                "from its last checkpoint at the end")
            return
        with self._lock:
            self.handle, self.link = new, new.control

    # -- questions over the control connection -------------------------------------------------
    def status(self, *, wait: bool = True, notices_after: int = 0) -> Optional[dict[str, Any]]:
        """The aggregator's ``status`` (aggregator/ingest.py), or None when there is no answer.
        ``wait=False``: None at once when the control connection is busy (a hang report).
        ``notices_after``: the hang detection's log lines after this one come with it."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if self.handle is None or self.link is None:
                return None
            return self.handle.status(timeout=STATUS_TIMEOUT_S, notices_after=notices_after)
        finally:
            self._lock.release()

    def snapshot(self, request: dict[str, Any], timeout: float = 1.0) -> Optional[LiveSnapshot]:
        """Live views (views/): one snapshot from the aggregator, or None."""
        with self._lock:
            if self.handle is None or self.link is None or not self.handle.alive():
                return None
            try:
                return self.handle.snapshot(request, timeout)
            except LinkError:
                return None

    def autopsy(self, silent_s: float, threshold_s: float, source: str) -> Optional[dict[str, Any]]:
        """The hang report of this silence: the one the aggregator's detection declared, else one
        taken now (aggregator/autopsy.py); None without an answer."""
        with self._lock:
            if self.handle is None or self.link is None:
                return None
            return self.handle.autopsy(silent_s, threshold_s, source)

    def send_probe(self, result: dict[str, Any]) -> None:
        """The link probe's section of the summary (linkprobe/analysis.py)."""
        try:
            with self._lock:
                if self.link is not None:
                    self.link.send({"t": "probe", "result": result})
        except LinkError as exc:
            log(f"warning: the link probe's result did not reach the aggregator ({exc})")

    def all_ranks_ended(self) -> bool:
        """Every rank of the run has been seen and none is connected any more (True when there is
        no aggregator to ask: nothing to wait for)."""
        status = self.status()
        if status is None:
            return True
        return (int(status.get("ranks_connected", 0)) == 0
                and int(status.get("ranks_seen", 0)) >= self.config.world_size)

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, exit_code: Optional[int], *, interrupted: bool, reason: Optional[str],
               failed_nodes: list[int], report: Optional[dict[str, Any]]) -> Optional[str]:
        """Ask for the final summary (always written: rebuilt from the last checkpoint if need be)
        and return its text, or None when none could be written."""
        assert self.handle is not None
        self.ensure_alive()  # so the summary is the live one, with exact loss counts
        with self._lock:
            result = self.handle.finish(exit_code, interrupted=interrupted, reason=reason or "",
                                        failed_nodes=failed_nodes, report=report)
            self.link = None
        if result.summary_txt is None:
            log(f"error: no summary could be written: {result.error}")
            return None
        note = " (rebuilt from the last checkpoint)" if result.rebuilt else ""
        log(f"summary{note}: {result.summary_json}")
        page = result.summary_json.with_name("final_summary.html") if result.summary_json else None
        if page is not None and page.is_file():
            log(f"report (open in a browser, works offline): {page}")
        try:
            return result.summary_txt.read_text()
        except OSError as exc:
            log(f"warning: cannot read {result.summary_txt}: {exc}")
            return None
