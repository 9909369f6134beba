"""One node's link to node 0: its relay, its system samples, its end of the link probe.

Every node's ranks send to the node's :class:`~.relay.Relay` on loopback; the relay's connection
to node 0's aggregator is the node's link: the launcher's system samples and, on nodes other
than 0, its final ``bye`` follow every rank's frames on it. The relay also adds the kernel's view
of the node's ranks to the hang autopsy (:mod:`.procstate`). In the node layout every node's
launcher holds the link; in the task layout, local rank 0's task of each node.

Nothing here ever stops training: a relay that cannot listen means no telemetry from this node,
an aggregator that does not answer means the relay keeps trying in the background.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Optional

from ..config import LaunchConfig
from ..options import link_probe_bytes
from ..wire.auth import AGGREGATOR, group_aud
from .grouprelay import GroupRelay, group_flush_s, tree_fan_in
from .keeper import AggregatorKeeper
from .relay import FLUSH_S, LIVE_FLUSH_S, Relay
from .supervise import log
from .token import Token, disagreement_hint

#: the join waits in slices this long, checking for SIGTERM between them
JOIN_SLICE_S = 1.0
#: seconds between two system samples of a node
SYSTEM_INTERVAL_S = 1.0
#: the most node 0 waits for the other nodes' probe servers (they start as each node joins)
PROBE_JOIN_WAIT_S = 30.0
#: seconds node 0's relay gets to pass its ranks' last frames on before the summary is asked for
DRAIN_S = 2.0
#: seconds a relay gets to empty its queue when it closes (node 0: after the summary; others: with
#: their bye)
CLOSE_S, CLOSE_WITH_BYE_S = 1.0, 3.0
#: a group relay waits this long at its node's end for its group's other nodes' last frames
GROUP_DRAIN_S = 10.0


def probe_port(config: LaunchConfig) -> int:
    """The link probe's port on every node: the aggregator port + 2 (under Slurm, the spare port
    of the job's block of four). In the task layout the node's relay holds that port
    (:func:`.starters.relay_port`), so the probe takes the aggregator port + 1, the dashboard's
    default, which a multi-node run (summary mode only) never uses."""
    off = 1 if config.task_rank is not None else 2
    return config.aggregator_port + off if config.aggregator_port + off <= 65535 else config.aggregator_port - 2


def _probe_failed(why: str) -> dict[str, Any]:
    from ..linkprobe.analysis import failed

    return failed(why)


class NodeLink:
    def __init__(self, config: LaunchConfig, token: Token) -> None:
        self.config = config
        self.token_info = token
        self.hostname = socket.gethostname()
        self.relay: Optional[Relay] = None
        #: this node's group relay, when it is the first node of a group (the tree: grouprelay.py)
        self.group_relay: Optional[GroupRelay] = None
        self.join_refused = False
        self.probe: Any = None      # linkprobe.probe.NodeProbe while it serves
        self._reporter: Any = None

    def join(self, upstream: tuple[str, int], wait: float, interrupted: Callable[[], bool] = lambda: False,
             port: int = 0, announce: bool = True) -> Optional[Relay]:
        """Start this node's relay on ``port`` (0: any; the task layout fixes it) and wait (at most
        ``wait`` s) for its link to the aggregator at ``upstream``. Never raises; None when the
        relay cannot listen (no telemetry from here). ``announce``: log the wait (not on node 0,
        whose aggregator is local).

        Waits in slices of a second so a SIGTERM (``interrupted``) ends the wait at once, however
        long --aggregator-wait is."""
        c = self.config
        aud = AGGREGATOR
        fan = tree_fan_in(c)
        group = c.node_rank // fan if fan else 0
        if group:  # the tree: report to the relay of this group's first node (grouprelay.py)
            head = group * fan
            if head == c.node_rank:
                self._start_group_relay(group, fan, upstream)
            upstream, aud = (c.hosts_by_node[head], c.aggregator_port), group_aud(group)
        try:
            self.relay = Relay(token=self.token_info.value, run_name=c.run_name, job_id=c.job_id,
                               node=c.node_rank, nnodes=c.nnodes, nproc_per_node=c.nproc_per_node,
                               upstream=upstream, hostname=self.hostname, port=port,
                               flush_s=FLUSH_S if c.mode == "summary" else LIVE_FLUSH_S,
                               tail=c.mode != "summary", upstream_aud=aud,
                               warn=lambda msg: log(f"warning: {msg}")).start()
        except OSError as exc:
            where = f" on 127.0.0.1:{port}" if port else ""
            log(f"warning: cannot start this node's relay{where} ({exc}); no telemetry from this node")
            return None
        if announce:
            log(f"joining the aggregator at {upstream[0]}:{upstream[1]} (waiting up to {wait:.0f} s)")
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
            if announce:
                log(f"joined the aggregator after {time.monotonic() - t0:.1f} s")
        elif self.relay.client.refused_reason is not None:
            self.join_refused = True   # the client logged the reason; its ranks are refused too
            if self.relay.client.refused_reason.startswith("authentication failed"):
                log(f"error: node 0's aggregator does not accept this node's token, so this node "
                    f"sends no telemetry (training goes on): {disagreement_hint(self.token_info)}")
        else:
            log(f"warning: no answer from the aggregator at {upstream[0]}:{upstream[1]} after "
                f"{time.monotonic() - t0:.0f} s. Training goes on; this node's relay keeps trying in "
                "the background (raise --aggregator-wait if node 0 starts slowly).")
        self._start_sampler()
        return self.relay

    def _start_group_relay(self, group: int, fan: int, upstream: tuple[str, int]) -> None:
        """This node is its group's first: serve the group's node relays on the aggregator's port
        (free here: the aggregator runs on node 0) and report to node 0. Never raises: without
        it, the group's nodes' relays count what they could not send."""
        c = self.config
        try:
            self.group_relay = GroupRelay(
                token=self.token_info.value, run_name=c.run_name, job_id=c.job_id, group=group,
                fan=fan, nnodes=c.nnodes, nproc_per_node=c.nproc_per_node, upstream=upstream,
                hostname=self.hostname, bind_host=c.aggregator_bind_host, port=c.aggregator_port,
                flush_s=group_flush_s(c.world_size, FLUSH_S), warn=lambda msg: log(f"warning: {msg}")).start()
        except OSError as exc:
            last = min(c.nnodes, group * fan + fan) - 1
            log(f"warning: cannot start the relay of nodes {group * fan}..{last} on port "
                f"{c.aggregator_port} ({exc}); their telemetry is lost and counted by their relays")

    def _start_sampler(self) -> None:
        """This node's system samples (CPU, RAM, GPUs) go up the relay's link once a second."""
        relay = self.relay
        if relay is None or self.join_refused:
            return
        from ..sdk.samplers.system import SystemReporter, SystemSampler, visible_gpus_from_env

        self._reporter = SystemReporter(
            lambda: SystemSampler(gpus=visible_gpus_from_env(os.environ)), relay.submit,
            node=self.config.node_rank, host=self.hostname, interval=SYSTEM_INTERVAL_S).start()

    def link_probe(self, keeper: Optional[AggregatorKeeper], budget_s: float,
                   interrupted: Callable[[], bool] = lambda: False) -> None:
        """The link probe between the nodes' launchers (traceml_core/linkprobe; multi-node, unless
        ``--link-probe off``). Every node serves it from now until node 0 has finished it (or this
        launcher ends); node 0 (the one with the ``keeper``) runs its rounds now, before its
        workers start (the other nodes' workers wait in torchrun's rendezvous meanwhile), logs one
        line and hands the result to the aggregator for the summary. ``budget_s``: what is left of
        the node-join window (a node not up by its end fails the run anyway). Never raises;
        bounded (see docs/communication.md)."""
        c = self.config
        nbytes = link_probe_bytes(c.link_probe)
        if c.nnodes < 2 or not nbytes:
            return
        # (a node whose join was refused serves too: node 0's hello is then refused at once, where
        # a node that does not listen would be waited for)
        result: Optional[dict[str, Any]] = None
        started = time.monotonic()
        try:
            from ..linkprobe.probe import NodeProbe

            self.probe = NodeProbe(token=self.token_info.value, run_name=c.run_name, job_id=c.job_id,
                                   nnodes=c.nnodes, node=c.node_rank, port=probe_port(c),
                                   nbytes=nbytes, log=log)
            self.probe.serve()     # a node that cannot listen is left out (logged), not fatal
            if keeper is None:
                return
            # the nodes' servers are waited for within the node-join window, at most PROBE_JOIN_WAIT_S
            hosts = self._probe_hosts(keeper, min(PROBE_JOIN_WAIT_S, max(1.0, budget_s)), interrupted)
            if hosts is None:
                result = _probe_failed("the nodes' hostnames are unknown (no node list from the "
                                       "cluster and not every node joined)")
                log(f"warning: link probe: {result['error']}")
            else:
                left = budget_s - (time.monotonic() - started)
                result = self.probe.measure(hosts, wait_s=min(PROBE_JOIN_WAIT_S, max(1.0, left)),
                                            stop=interrupted)
        except Exception as exc:    # never into training
            log(f"warning: link probe failed ({type(exc).__name__}: {exc})")
            result = _probe_failed(f"the probe failed ({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            # node 0: the summary says what was measured, or that nothing was and why
            if keeper is not None and result is not None:
                keeper.send_probe(result)

    def _probe_hosts(self, keeper: AggregatorKeeper, wait: float,
                     interrupted: Callable[[], bool]) -> Optional[list[str]]:
        """Every node's hostname by node rank: the cluster's node list, else what the nodes said
        when they joined (waiting up to ``wait`` s for the last ones)."""
        c = self.config
        if c.hosts_by_node:
            return list(c.hosts_by_node)
        deadline = time.monotonic() + wait
        while True:
            hosts = (keeper.status() or {}).get("hosts") or {}
            if all(str(n) in hosts for n in range(c.nnodes)):
                return [hosts[str(n)] for n in range(c.nnodes)]
            if time.monotonic() >= deadline or interrupted():
                return None
            time.sleep(0.5)

    # -- during the run --------------------------------------------------------------------------
    def ranks_connected(self) -> int:
        """Ranks of this node still connected to its relay."""
        relay = self.relay
        return relay.stats().ranks_connected if relay is not None else 0

    def first_step_at(self) -> Optional[float]:
        """When the first step records of this node's ranks reached its relay (epoch s), or None."""
        return self.relay.first_steps_at if self.relay is not None else None

    # -- the end ---------------------------------------------------------------------------------
    def stop_extras(self) -> None:
        """The system samples and the probe server end with the workers."""
        if self._reporter is not None:
            self._reporter.stop(1.0)
        if self.probe is not None:
            self.probe.close()

    def drain(self) -> None:
        """Node 0: every rank's last frames reach the aggregator before it drains and summarises."""
        if self.relay is not None:
            self.relay.drain(DRAIN_S)
            self.relay.run_ended()

    def close(self, bye: Optional[dict[str, Any]] = None) -> None:
        """Close the relay, sending the launcher's ``bye`` after every rank's frames (not node 0,
        whose launcher said ``finish`` instead); then, on a group's first node, its group relay
        once the group's other nodes closed their links (at most GROUP_DRAIN_S)."""
        relay = self.relay
        if relay is not None:
            if bye is None:
                _relay_report(relay.close(CLOSE_S))
            else:
                _relay_report(relay.close(CLOSE_WITH_BYE_S, bye=bye))
        if self.group_relay is not None:  # the group's other nodes end about now: their last frames
            self.group_relay.close(GROUP_DRAIN_S)


def _relay_report(st: Any) -> None:
    # records the relay could not forward at the end are logged by the relay itself (they are not
    # in the summary); the ones it dropped under pressure were reported upstream
    if st.records_dropped:
        told = st.records_dropped - st.dropped_untold
        log(f"warning: this node's relay dropped {st.records_dropped:,} of {st.records_in:,} "
            f"step records while node 0 was slow or unreachable; node 0 was told of {told:,} "
            "(counted as lost in the summary)"
            + (f", not of the other {st.dropped_untold:,}" if st.dropped_untold else ""))
