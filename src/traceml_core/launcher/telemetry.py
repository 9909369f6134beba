"""The launcher's telemetry duties on one node: aggregator (node 0), join, relay, system samples,
watch.

With the relay on (the default), this node's ranks send to the launcher's :class:`~.relay.Relay`
on loopback, which forwards one stream to node 0; on nodes other than 0 the relay takes over the
node's link (so the launcher's system samples and final ``bye`` follow every rank's frames on
it), on node 0 it opens its own ``node`` link next to the launcher's control connection.

Node 0 owns the aggregator and watches the other nodes through it. A node that never joins, or
whose launcher vanishes, ends the run only when training is provably stuck (no step reached the
aggregator for ``aggregator_wait`` seconds): telemetry trouble alone never stops a healthy run.
With ``--hang-timeout`` (off by default) node 0 also stops a run in which a rank that is still
connected and has not finished sends no step for that long (see docs/reliability.md).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Optional, Sequence

from ..aggregator.control import Link, LinkError, LinkRefused, join_aggregator
from ..aggregator.process import AggregatorHandle, start_aggregator
from ..aggregator.settings import AggregatorSettings
from ..config import LaunchConfig
from ..options import export_kinds
from .relay import FLUSH_S, LIVE_FLUSH_S, Relay
from .supervise import Supervisor, log

#: seconds between two status queries of node 0's launcher
WATCH_INTERVAL_S = 1.0
#: the join waits in slices this long, checking for SIGTERM between them
JOIN_SLICE_S = 1.0
#: seconds between two system samples of a node
SYSTEM_INTERVAL_S = 1.0


class NodeTelemetry:
    def __init__(self, config: LaunchConfig, token: str) -> None:
        self.config = config
        self.token = token
        self.hostname = socket.gethostname()
        self.handle: Optional[AggregatorHandle] = None
        self.link: Optional[Link] = None
        self.relay: Optional[Relay] = None
        self.join_refused = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler_thread: Optional[threading.Thread] = None
        self._sup: Optional[Supervisor] = None
        self._started = time.monotonic()
        self._next_watch = 0.0
        self._last_records = -1
        self._last_progress = time.monotonic()
        self._failure: Optional[str] = None
        self.failed_nodes: list[int] = []
        #: the hang watchdog stopped the run (the launcher then exits with HANG_EXIT_CODE)
        self.hung = False

    # -- start -----------------------------------------------------------------------------------
    def start_aggregator(self, script: str = "", script_args: Sequence[str] = ()) -> None:
        c = self.config
        settings = AggregatorSettings(
            run_name=c.run_name, token=self.token, run_dir=c.run_dir, job_id=c.job_id,
            bind_host=c.aggregator_bind_host, port=c.aggregator_port, nnodes=c.nnodes,
            nproc_per_node=c.nproc_per_node, mode=c.mode, node_join_window_s=c.aggregator_wait,
            master_addr=c.master_addr, port_source=_flag_source(c, "aggregator_port"),
            hostnames=list(c.hosts_by_node),
            script=script, script_args=list(script_args), export=export_kinds(c.export))
        self.handle = start_aggregator(settings)
        self.link = self.handle.control
        if self.handle.run_dir_note:
            log(f"warning: {self.handle.run_dir_note}")

    def join(self, wait: float, interrupted: Callable[[], bool] = lambda: False) -> bool:
        """Join the aggregator (node 0's launcher already has its control link). Never raises.

        Waits in slices of a second so a SIGTERM (``interrupted``) ends the wait at once, however
        long --aggregator-wait is."""
        c = self.config
        if self.link is None:
            host = c.aggregator_host
            log(f"joining the aggregator at {host}:{c.aggregator_port} (waiting up to {wait:.0f} s)")
            t0 = time.monotonic()
            deadline = t0 + wait
            while True:
                try:
                    self.link = join_aggregator(
                        host, c.aggregator_port, token=self.token, run_name=c.run_name, job_id=c.job_id,
                        node=c.node_rank, nproc=c.nproc_per_node, hostname=self.hostname,
                        wait_s=max(0.0, min(JOIN_SLICE_S, deadline - time.monotonic())))
                    break
                except LinkRefused as exc:
                    log(f"warning: {exc}. Training goes on without telemetry from this node.")
                    self.join_refused = True
                    return False
                except LinkError as exc:
                    if interrupted():
                        log("stopped waiting for the aggregator: interrupted")
                        return False
                    if time.monotonic() < deadline:
                        continue
                    later = (" (its relay keeps trying in the background)" if c.relay else "")
                    log(f"warning: {exc} after {time.monotonic() - t0:.0f} s. Training goes on without "
                        f"telemetry from this node{later}; raise --aggregator-wait if node 0 starts "
                        f"slowly.")
                    return False
            log(f"joined the aggregator after {time.monotonic() - t0:.1f} s")
        self._start_sampler()
        return True

    def start_relay(self, port: int = 0) -> Optional[Relay]:
        """Start this node's relay (after :meth:`join`) on ``port`` (0: any); None when node 0
        refused this node or the port cannot be had."""
        c = self.config
        if self.join_refused:
            return None
        if self.handle is not None:
            host = "127.0.0.1" if c.aggregator_bind_host in ("0.0.0.0", "::") else c.aggregator_bind_host
            up_port = self.handle.port
        else:
            host, up_port = c.aggregator_host, c.aggregator_port

        def connect():
            return join_aggregator(host, up_port, token=self.token, run_name=c.run_name, job_id=c.job_id,
                                   node=c.node_rank, nproc=c.nproc_per_node, hostname=self.hostname,
                                   wait_s=0).sock

        upstream = None
        with self._lock:
            if self.handle is None and self.link is not None:
                upstream, self.link = self.link.sock, None  # the relay owns the node's link now
        try:
            self.relay = Relay(token=self.token, run_name=c.run_name, job_id=c.job_id,
                               node=c.node_rank, nnodes=c.nnodes, nproc_per_node=c.nproc_per_node,
                               connect=connect, upstream=upstream, port=port,
                               flush_s=FLUSH_S if c.mode == "summary" else LIVE_FLUSH_S,
                               warn=lambda msg: log(f"warning: {msg}")).start()
        except OSError as exc:
            log(f"warning: cannot start this node's relay ({exc}); ranks connect to node 0 directly")
            if upstream is not None:
                upstream.close()
            return None
        return self.relay

    def _start_sampler(self) -> None:
        def run() -> None:
            try:
                from ..sdk.samplers.system import SystemSampler, visible_gpus_from_env
                import os

                sampler = SystemSampler(gpus=visible_gpus_from_env(os.environ))
            except Exception as exc:  # never let sampling take the launcher down
                log(f"warning: no system sampling on this node ({type(exc).__name__}: {exc})")
                return
            while not self._stop.wait(SYSTEM_INTERVAL_S):
                try:
                    frame = {"t": "system", "node": self.config.node_rank, "host": self.hostname,
                             "samples": [sampler.sample()]}
                except Exception:
                    continue
                if not self._send(frame):
                    return
            sampler.close()

        self._sampler_thread = threading.Thread(target=run, name="traceml-node-sampler", daemon=True)
        self._sampler_thread.start()

    def _send(self, frame: dict[str, Any]) -> bool:
        relay = self.relay
        if relay is not None and self.handle is None:
            relay.submit(frame)  # a sample dropped while node 0 is unreachable is no reason to stop
            return True
        with self._lock:
            if self.link is None:
                return False
            try:
                self.link.send(frame)
                return True
            except LinkError:
                return False

    # -- the task layout (launcher/task.py) -----------------------------------------------------
    def all_ranks_ended(self) -> bool:
        """Node 0: every rank of the run has been seen and none is connected any more."""
        if self.handle is None:
            return True
        with self._lock:
            status = self.handle.status(timeout=2.0) if self.link is not None else None
        if status is None:
            return True   # no aggregator to ask: nothing to wait for
        return (int(status.get("ranks_connected", 0)) == 0
                and int(status.get("ranks_seen", 0)) >= self.config.world_size)

    def relay_ranks_connected(self) -> int:
        relay = self.relay
        return relay.stats().ranks_connected if relay is not None else 0

    # -- during the run --------------------------------------------------------------------------
    def attach(self, sup: Supervisor) -> None:
        self._sup = sup
        self._started = time.monotonic()
        self._last_progress = time.monotonic()

    def tick(self) -> None:
        """Called by the supervisor loop on node 0: notice hung ranks, and nodes that never join
        or vanish."""
        hang = self.config.hang_timeout
        if self.handle is None or self._failure is not None or (self.config.nnodes == 1 and not hang):
            return
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_INTERVAL_S
        with self._lock:
            status = self.handle.status(timeout=2.0) if self.link is not None else None
        if status is None:
            return  # no aggregator to ask: telemetry trouble alone never stops a run
        if hang and self._check_hang(status, hang):
            return
        if self.config.nnodes == 1:
            return
        records = int(status.get("records", 0))
        if records != self._last_records:
            self._last_records, self._last_progress = records, now
        stalled = now - self._last_progress
        wait = self.config.aggregator_wait
        joined = set(status.get("nodes_joined", []))
        missing = [n for n in range(self.config.nnodes) if n not in joined]
        lost = list(status.get("nodes_lost", []))
        hosts = self._hosts(status)
        if missing and now - self._started > wait and stalled > wait:
            self._fail(missing, hosts, f"never joined within {wait:.0f} s")
        elif lost and stalled > min(wait, 30.0):
            self._fail(lost, hosts, f"vanished (its launcher's connection closed) and training has made "
                                    f"no progress for {stalled:.0f} s")

    def _check_hang(self, status: dict, hang: float) -> bool:
        """The hang watchdog (``--hang-timeout``): a rank that has stepped, has not said bye and
        is still connected sent no step for ``hang`` seconds. Stops the workers, naming the ranks."""
        silent = [s for s in status.get("silent") or [] if isinstance(s, list) and len(s) >= 5]
        # relayed steps reach the aggregator once per merge window: silence that short is not a hang
        relay = getattr(self, "relay", None)
        slack = float(getattr(relay, "flush_s", 0.0) or 0.0) + WATCH_INTERVAL_S if relay is not None else 0.0
        if not silent or not silent[0][1] > hang + slack:
            return False
        stuck = [s for s in silent if s[1] > hang + slack]
        names = "; ".join(f"rank {r} (node {n}, {h or '?'}) after {steps} steps, silent {age:.0f} s"
                          for r, age, steps, n, h in stuck)
        more = "" if len(stuck) < len(silent) or len(silent) < 8 else " (and maybe more)"
        src = self.config.source("hang_timeout")
        src = "--hang-timeout" if src == "cli" else src
        self.hung = True
        self._failure = (f"training looks hung: no step for more than {hang:g} s from {names}{more}; "
                         f"stopped by the hang watchdog ({src}={hang:g})")
        if self._sup is not None:
            self._sup.terminate(self._failure)
        return True

    def _hosts(self, status: dict) -> dict[str, str]:
        """Hostnames by node: what joined nodes said, else what the cluster plugin listed (so a
        node that never joined is still named)."""
        known = {str(n): h for n, h in enumerate(self.config.hosts_by_node)}
        return {**known, **(status.get("hosts") or {})}

    def _fail(self, nodes: list[int], hosts: dict, what: str) -> None:
        names = node_names(nodes, hosts)
        self.failed_nodes = nodes
        self._failure = f"{names} {what}"
        if self._sup is not None:
            self._sup.terminate(self._failure)

    def failure_reason(self) -> Optional[str]:
        """Why the run failed from node 0's point of view: a node that never joined, vanished or failed."""
        if self._failure is not None or self.handle is None or self.config.nnodes == 1:
            return self._failure
        with self._lock:
            status = self.handle.status(timeout=2.0) if self.link is not None else None
        if not status:
            return None
        hosts = self._hosts(status)

        parts = []
        failed = {int(n): code for n, code in status.get("nodes_failed", {}).items()}
        if failed:
            shown = sorted(failed.items())
            parts.append(", ".join(f"{node_names([n], hosts)} failed (exit code {code})"
                                   for n, code in shown[:NAMED_NODES])
                         + (f" and {len(shown) - NAMED_NODES:,} more nodes failed" if len(shown) > NAMED_NODES else ""))
        lost = [n for n in status.get("nodes_lost", []) if n not in failed]
        if lost:
            parts.append(node_names(lost, hosts) + " vanished (its launcher's connection closed)")
        joined = set(status.get("nodes_joined", []))
        missing = [n for n in range(self.config.nnodes) if n not in joined]
        if missing:
            parts.append(node_names(missing, hosts) + " never joined")
        self.failed_nodes = sorted(set(failed) | set(lost) | set(missing))
        return "; ".join(parts) or None

    def snapshot(self, request: dict[str, Any], timeout: float = 1.0) -> Optional[dict[str, Any]]:
        """Live views (views/): one ``snapshot`` frame from node 0's aggregator, or None."""
        with self._lock:
            if self.handle is None or self.link is None or not self.handle.alive():
                return None
            try:
                return self.link.snapshot(request, timeout)
            except LinkError:
                return None

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, *, exit_code: Optional[int], interrupted: bool, reason: Optional[str],
               report: Optional[dict[str, Any]] = None) -> Optional[str]:
        """Node 0: get the final summary text (always, rebuilt if need be). Others: say bye.
        ``report``: this node's worker report (torchrun's failed workers, OOM kills)."""
        self._stop.set()
        relay = self.relay
        if self.handle is not None:
            if relay is not None:
                # every rank's last frames reach the aggregator before it drains and summarises
                relay.drain(2.0)
                relay.upstream_ending()
            with self._lock:
                result = self.handle.finish(exit_code, interrupted=interrupted, reason=reason or "",
                                            failed_nodes=self.failed_nodes, report=report)
                self.link = None
            if relay is not None:
                self._relay_report(relay.close(1.0))
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
        status = "interrupted" if interrupted else ("clean" if exit_code == 0 else "error")
        if relay is not None:
            self._relay_report(relay.close(3.0, bye={"t": "bye", "status": status, "exit_code": exit_code,
                                                     **(report or {})}))
            return None
        with self._lock:
            if self.link is not None:
                try:
                    self.link.bye(exit_code, status, report)
                except LinkError:
                    pass
                self.link.close()
                self.link = None
        return None

    @staticmethod
    def _relay_report(st) -> None:
        lost = st.records_dropped + st.records_unsent
        if lost:
            log(f"warning: this node's relay could not forward {lost:,} of {st.records_in:,} step "
                f"records ({st.records_dropped:,} dropped while node 0 was slow or unreachable, "
                f"{st.records_unsent:,} still held at the end); the summary counts them as lost")


#: how many nodes a log line names one by one; the rest are counted (a line stays readable, and a
#: 65,536-node run does not write megabytes of log)
NAMED_NODES = 8


def node_names(nodes: list[int], hosts: dict) -> str:
    """``node 3 (gpu07), node 5`` for at most NAMED_NODES nodes, then ``and N more (nodes a-b,...)``."""
    def name(n: int) -> str:
        return f"node {n}" + (f" ({hosts[str(n)]})" if str(n) in hosts else "")

    text = ", ".join(name(n) for n in nodes[:NAMED_NODES])
    if len(nodes) > NAMED_NODES:
        rest = sorted(nodes[NAMED_NODES:])
        text += f" and {len(rest):,} more (nodes {rest[0]}-{rest[-1]})" if rest[-1] - rest[0] + 1 == len(rest) \
            else f" and {len(rest):,} more"
    return text


def _flag_source(config: LaunchConfig, key: str) -> str:
    src = config.source(key)
    return "--" + key.replace("_", "-") if src == "cli" else src
