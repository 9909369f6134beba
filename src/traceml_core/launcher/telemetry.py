"""The launcher's telemetry duties on one node: aggregator (node 0), relay, system samples, watch.

Every node's ranks send to the launcher's :class:`~.relay.Relay` on loopback; its link to node 0
is the node's link (the launcher's system samples and, on nodes other than 0, its final ``bye``
follow every rank's frames on it). Node 0's launcher also holds the ``control`` connection to its
aggregator.

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

from ..aggregator.process import AggregatorHandle, start_aggregator
from ..aggregator.settings import AggregatorSettings
from ..config import LaunchConfig
from ..options import export_kinds, link_probe_bytes
from ..wire.client import Link, LinkError
from ..wire.auth import AGGREGATOR, group_aud
from .grouprelay import GroupRelay, group_flush_s, relay_fan_in
from .hangwatch import HangWatch, Stall
from .relay import FLUSH_S, LIVE_FLUSH_S, Relay
from .stacks import StackCollector
from .supervise import Supervisor, log
from .token import Token, disagreement_hint

#: seconds between two status queries of node 0's launcher
WATCH_INTERVAL_S = 1.0
#: the join waits in slices this long, checking for SIGTERM between them
JOIN_SLICE_S = 1.0
#: how often node 0's launcher restarts an aggregator that died mid-run
MAX_RESTARTS = 2
#: seconds between two system samples of a node
SYSTEM_INTERVAL_S = 1.0
#: a group relay waits this long at its node's end for its group's other nodes' last frames
GROUP_DRAIN_S = 10.0


#: the most node 0 waits for the other nodes' probe servers (they start as each node joins)
PROBE_JOIN_WAIT_S = 30.0


def probe_port(config: LaunchConfig) -> int:
    """The link probe's port on every node: the aggregator port + 2 (under Slurm, the spare port
    of the job's block of four). In the task layout the node's relay holds that port
    (launcher/task.py), so the probe takes the aggregator port + 1, the dashboard's default, which
    a multi-node run (summary mode only) never uses."""
    off = 1 if config.task_rank is not None else 2
    return config.aggregator_port + off if config.aggregator_port + off <= 65535 else config.aggregator_port - 2


def _probe_failed(why: str) -> dict[str, Any]:
    from ..linkprobe.analysis import failed

    return failed(why)


class NodeTelemetry:
    def __init__(self, config: LaunchConfig, token: Token) -> None:
        self.config = config
        self.token_info = token
        self.token = token.value
        self.hostname = socket.gethostname()
        self.handle: Optional[AggregatorHandle] = None
        self.link: Optional[Link] = None
        self.relay: Optional[Relay] = None
        #: this node's group relay, when it is the first node of a group (the tree: grouprelay.py)
        self.group_relay: Optional[GroupRelay] = None
        self.join_refused = False
        self._lock = threading.Lock()
        self._reporter: Any = None
        self._restarts = 0
        self._restart_failed = False
        self._sup: Optional[Supervisor] = None
        self._started = time.monotonic()
        self._next_watch = 0.0
        self._last_records = -1
        self._last_progress = time.monotonic()
        self._failure: Optional[str] = None
        self.failed_nodes: list[int] = []
        #: the hang watchdog stopped the run (the launcher then exits with HANG_EXIT_CODE)
        self.hung = False
        self.probe: Any = None      # linkprobe.probe.NodeProbe while it serves
        #: this node's stack dumps for the hang report (every node; its relay collects them)
        self.stacks = StackCollector()
        #: node 0: when to take a hang report (--hang-report-after)
        self.hangwatch = HangWatch(config.hang_report_after)
        self._autopsy: Optional[threading.Thread] = None

    # -- start -----------------------------------------------------------------------------------
    def start_aggregator(self, script: str = "", script_args: Sequence[str] = ()) -> None:
        c = self.config
        settings = AggregatorSettings(
            run_name=c.run_name, token=self.token, run_dir=c.run_dir, job_id=c.job_id,
            bind_host=c.aggregator_bind_host, port=c.aggregator_port, nnodes=c.nnodes,
            nproc_per_node=c.nproc_per_node, mode=c.mode, node_join_window_s=c.aggregator_wait,
            master_addr=c.master_addr, port_source=_flag_source(c, "aggregator_port"),
            hostnames=list(c.hosts_by_node), relay_fan_in=self.fan_in,
            script=script, script_args=list(script_args), export=export_kinds(c.export),
            export_interval_s=c.export_interval)
        self.handle = start_aggregator(settings)
        self.link = self.handle.control
        if self.handle.run_dir_note:
            log(f"warning: {self.handle.run_dir_note}")

    def _restart_aggregator(self) -> None:
        """Node 0's aggregator died mid-run (SIGKILL, OOM kill): start another on the same port,
        going on from the last checkpoint. The relays reconnect by themselves and send what they
        still hold; what reached the dead one after its checkpoint is counted as lost, exactly
        (aggregator/resume.py). At most MAX_RESTARTS times: after that (or if it cannot start)
        the summary is rebuilt from the last checkpoint at the end, as before."""
        h = self.handle
        if h is None or self._restarts >= MAX_RESTARTS or self._restart_failed:
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

    def start_relay(self, wait: float, interrupted: Callable[[], bool] = lambda: False,
                    port: int = 0) -> Optional[Relay]:
        """Start this node's relay on ``port`` (0: any; the task layout fixes it) and wait (at most
        ``wait`` s) for its link to node 0's aggregator. Never raises; None when the relay cannot
        listen (no telemetry from here).

        Waits in slices of a second so a SIGTERM (``interrupted``) ends the wait at once, however
        long --aggregator-wait is."""
        c = self.config
        if self.handle is not None:
            up = (self.handle.connect_host, self.handle.port)
        else:
            up = (c.aggregator_host, c.aggregator_port)
        aud = AGGREGATOR
        fan = self.fan_in
        group = c.node_rank // fan if fan else 0
        if group:  # the tree: report to the relay of this group's first node (grouprelay.py)
            head = group * fan
            if head == c.node_rank:
                self._start_group_relay(group, fan, up)
            up, aud = (c.hosts_by_node[head], c.aggregator_port), group_aud(group)
        try:
            self.relay = Relay(token=self.token, run_name=c.run_name, job_id=c.job_id,
                               node=c.node_rank, nnodes=c.nnodes, nproc_per_node=c.nproc_per_node,
                               upstream=up, hostname=self.hostname, port=port,
                               flush_s=FLUSH_S if c.mode == "summary" else LIVE_FLUSH_S,
                               tail=c.mode != "summary", upstream_aud=aud,
                               warn=lambda msg: log(f"warning: {msg}"), stacks=self.stacks).start()
        except OSError as exc:
            log(f"warning: cannot start this node's relay ({exc}); no telemetry from this node")
            return None
        if self.handle is None:
            log(f"joining the aggregator at {up[0]}:{up[1]} (waiting up to {wait:.0f} s)")
        t0 = time.monotonic()
        deadline = t0 + wait
        connected = False
        while not connected and self.relay.client.refused_reason is None:
            left = deadline - time.monotonic()
            connected = self.relay.wait_connected(max(0.0, min(JOIN_SLICE_S, left)))
            if connected or left <= JOIN_SLICE_S:
                break
            if interrupted():
                log("stopped waiting for the aggregator: interrupted")
                break
        if connected:
            if self.handle is None:
                log(f"joined the aggregator after {time.monotonic() - t0:.1f} s")
        elif self.relay.client.refused_reason is not None:
            self.join_refused = True   # the client logged the reason; its ranks are refused too
            if self.relay.client.refused_reason.startswith("authentication failed"):
                log(f"error: node 0's aggregator does not accept this node's token, so this node "
                    f"sends no telemetry (training goes on): {disagreement_hint(self.token_info)}")
        else:
            log(f"warning: no answer from the aggregator at {up[0]}:{up[1]} after "
                f"{time.monotonic() - t0:.0f} s. Training goes on; this node's relay keeps trying in "
                "the background (raise --aggregator-wait if node 0 starts slowly).")
        self._start_sampler()
        return self.relay

    def link_probe(self, interrupted: Callable[[], bool] = lambda: False) -> None:
        """The link probe between the nodes' launchers (traceml_core/linkprobe; multi-node, unless
        ``--link-probe off``). Every node serves it from now until node 0 has finished it (or this
        launcher ends); node 0 runs its rounds now, before its workers start (the other nodes'
        workers wait in torchrun's rendezvous meanwhile), logs one line and hands the result to
        the aggregator for the summary. Never raises; bounded (see docs/communication.md)."""
        c = self.config
        nbytes = link_probe_bytes(c.link_probe)
        if c.nnodes < 2 or not nbytes:
            return
        # (a node whose join was refused serves too: node 0's hello is then refused at once, where
        # a node that does not listen would be waited for)
        result: Optional[dict[str, Any]] = None
        try:
            from ..linkprobe.probe import NodeProbe

            self.probe = NodeProbe(token=self.token, run_name=c.run_name, job_id=c.job_id,
                                   nnodes=c.nnodes, node=c.node_rank, port=probe_port(c),
                                   nbytes=nbytes, log=log)
            self.probe.serve()     # a node that cannot listen is left out (logged), not fatal
            if self.handle is None:
                return
            # the nodes' servers are waited for within the aggregator's node-join window (a node
            # not up by its end fails the run anyway), at most PROBE_JOIN_WAIT_S
            left = c.aggregator_wait - (time.monotonic() - self._started)
            wait = min(PROBE_JOIN_WAIT_S, max(1.0, left))
            hosts = self._probe_hosts(wait, interrupted)
            if hosts is None:
                result = _probe_failed("the nodes' hostnames are unknown (no node list from the "
                                       "cluster and not every node joined)")
                log(f"warning: link probe: {result['error']}")
            else:
                left = c.aggregator_wait - (time.monotonic() - self._started)
                result = self.probe.measure(hosts, wait_s=min(PROBE_JOIN_WAIT_S, max(1.0, left)),
                                            stop=interrupted)
        except Exception as exc:    # never into training
            log(f"warning: link probe failed ({type(exc).__name__}: {exc})")
            result = _probe_failed(f"the probe failed ({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            # node 0: the summary says what was measured, or that nothing was and why
            if self.handle is not None and result is not None:
                self._send_probe(result)

    def _send_probe(self, result: dict[str, Any]) -> None:
        try:
            with self._lock:
                if self.link is not None:
                    self.link.send({"t": "probe", "result": result})
        except LinkError as exc:
            log(f"warning: the link probe's result did not reach the aggregator ({exc})")

    def _probe_hosts(self, wait: float, interrupted: Callable[[], bool]) -> Optional[list[str]]:
        """Every node's hostname by node rank: the cluster's node list, else what the nodes said
        when they joined (waiting up to ``wait`` s for the last ones)."""
        c = self.config
        if c.hosts_by_node:
            return list(c.hosts_by_node)
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                status = self.handle.status(timeout=2.0) if (self.handle and self.link) else None
            hosts = (status or {}).get("hosts") or {}
            if all(str(n) in hosts for n in range(c.nnodes)):
                return [hosts[str(n)] for n in range(c.nnodes)]
            if time.monotonic() >= deadline or interrupted():
                return None
            time.sleep(0.5)

    @property
    def fan_in(self) -> int:
        """Nodes per group relay (0: every node's relay reports to node 0 directly); none when
        the nodes' hostnames are unknown (a node could not find its group's first node)."""
        c = self.config
        if c.mode != "summary" or len(c.hosts_by_node) != c.nnodes:
            return 0
        return relay_fan_in(c.relay_fan_in, c.nnodes)

    def _start_group_relay(self, group: int, fan: int, up: tuple[str, int]) -> None:
        """This node is its group's first: serve the group's node relays on the aggregator's port
        (free here: the aggregator runs on node 0) and report to node 0. Never raises: without
        it, the group's nodes' relays count what they could not send."""
        c = self.config
        try:
            self.group_relay = GroupRelay(
                token=self.token, run_name=c.run_name, job_id=c.job_id, group=group, fan=fan,
                nnodes=c.nnodes, nproc_per_node=c.nproc_per_node, upstream=up, hostname=self.hostname,
                bind_host=c.aggregator_bind_host, port=c.aggregator_port,
                flush_s=group_flush_s(c.world_size, FLUSH_S),
                warn=lambda msg: log(f"warning: {msg}")).start()
        except OSError as exc:
            log(f"warning: cannot start the relay of nodes {group * fan}..{min(c.nnodes, group * fan + fan) - 1} "
                f"on port {c.aggregator_port} ({exc}); their telemetry is lost and counted by their relays")

    def _start_sampler(self) -> None:
        """This node's system samples (CPU, RAM, GPUs) go up the relay's link once a second."""
        relay = self.relay
        if relay is None or self.join_refused:
            return
        import os

        from ..sdk.samplers.system import SystemReporter, SystemSampler, visible_gpus_from_env

        self._reporter = SystemReporter(
            lambda: SystemSampler(gpus=visible_gpus_from_env(os.environ)), relay.submit,
            node=self.config.node_rank, host=self.hostname, interval=SYSTEM_INTERVAL_S).start()

    # -- during the run --------------------------------------------------------------------------
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

    def attach(self, sup: Supervisor) -> None:
        self._sup = sup
        self._started = time.monotonic()
        self._last_progress = time.monotonic()

    def tick(self) -> None:
        """Called by the supervisor loop on node 0: notice hung ranks, and nodes that never join
        or vanish."""
        hang = self.config.hang_timeout
        if self.handle is not None and not self.handle.alive():
            self._restart_aggregator()
        watch = self.hangwatch.setting != "off"
        if self.handle is None or self._failure is not None or (self.config.nnodes == 1 and not hang
                                                                 and not watch):
            return
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_INTERVAL_S
        if not self._lock.acquire(blocking=False):
            return  # a hang report is being taken over the control link: next tick
        try:
            status = self.handle.status(timeout=2.0) if self.link is not None else None
        finally:
            self._lock.release()
        if status is None:
            return  # no aggregator to ask: telemetry trouble alone never stops a run
        if hang and self._check_hang(status, hang):
            return
        if watch:
            stall = self.hangwatch.observe(now, int(status.get("records", 0)), bool(status.get("silent")),
                                           status.get("median_step_ms"))
            if stall is not None and (self._autopsy is None or not self._autopsy.is_alive()):
                self._autopsy = threading.Thread(target=self.take_hang_report, args=(stall, now),
                                                 name="traceml-hang-report", daemon=True)
                self._autopsy.start()
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
            self._fail(missing, hosts, f"never joined within {wait:.0f} s" + self._refused_note(status))
        elif lost and stalled > min(wait, 30.0):
            self._fail(lost, hosts, f"vanished (its launcher's connection closed) and training has made "
                                    f"no progress for {stalled:.0f} s")

    def take_hang_report(self, stall: Stall, now: float) -> Optional[dict[str, Any]]:
        """Node 0: have every rank's stack taken and read (aggregator/autopsy.py), and print the
        report to the log at once; the aggregator keeps it for the summary."""
        from ..report.hang import render

        silent = max(0.0, now - stall.began)
        with self._lock:
            report = (self.handle.autopsy(silent, stall.threshold_s, stall.threshold_source)
                      if self.handle is not None and self.link is not None else None)
        if report is None:
            log(f"warning: no rank completed a step for {silent:.0f} s, but the hang report could not "
                "be taken (no answer from the aggregator)")
            return None
        for line in render(report):
            log(line)
        return report

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
        # where every rank is stuck, taken before the workers are stopped (unless already taken
        # for this stall)
        if self._autopsy is not None and self._autopsy.is_alive():
            self._autopsy.join(20.0)
        elif self.hangwatch.current is None and self.hangwatch.setting != "off":
            now = time.monotonic()
            self.take_hang_report(Stall(now - silent[0][1], now, hang, f"{src}={hang:g}"), now)
        if self._sup is not None:
            self._sup.terminate(self._failure)
        return True

    def _refused_note(self, status: dict) -> str:
        """Why a node may not have joined: its hellos were refused (tokens that differ)."""
        refused = int(status.get("refused") or 0)
        if not refused:
            return ""
        return (f" (node 0 refused {refused} connection(s) that did not authenticate; "
                f"{disagreement_hint(self.token_info)})")

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
            parts.append(node_names(missing, hosts) + " never joined" + self._refused_note(status))
        self.failed_nodes = sorted(set(failed) | set(lost) | set(missing))
        return "; ".join(parts) or None

    def snapshot(self, request: dict[str, Any], timeout: float = 1.0) -> Optional[dict[str, Any]]:
        """Live views (views/): one ``snapshot`` frame from node 0's aggregator, or None."""
        with self._lock:
            if self.handle is None or self.link is None or not self.handle.alive():
                return None
            try:
                return self.handle.snapshot(request, timeout)
            except LinkError:
                return None

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, *, exit_code: Optional[int], interrupted: bool, reason: Optional[str],
               report: Optional[dict[str, Any]] = None) -> Optional[str]:
        """Node 0: get the final summary text (always, rebuilt if need be). Others: say bye.
        ``report``: this node's worker report (torchrun's failed workers, OOM kills)."""
        if self._reporter is not None:
            self._reporter.stop(1.0)
        if self.probe is not None:
            self.probe.close()
        relay = self.relay
        if self.handle is not None and not self.handle.alive():
            self._restart_aggregator()  # so the summary is the live one, with exact loss counts
        if self.handle is not None:
            if relay is not None:
                # every rank's last frames reach the aggregator before it drains and summarises
                relay.drain(2.0)
                relay.run_ended()
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
        if self.group_relay is not None:  # the group's other nodes end about now: their last frames
            self.group_relay.close(GROUP_DRAIN_S)
        return None

    @staticmethod
    def _relay_report(st) -> None:
        # records the relay could not forward at the end are logged by the relay itself (they
        # are not in the summary); the ones it dropped under pressure were reported upstream
        if st.records_dropped:
            told = st.records_dropped - st.dropped_untold
            log(f"warning: this node's relay dropped {st.records_dropped:,} of {st.records_in:,} "
                f"step records while node 0 was slow or unreachable; node 0 was told of {told:,} "
                "(counted as lost in the summary)"
                + (f", not of the other {st.dropped_untold:,}" if st.dropped_untold else ""))


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
