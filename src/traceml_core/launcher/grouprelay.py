"""Group relays: the tree that keeps node 0 under one core for tens of thousands of ranks.

Why: node 0 merges one window per rank per relay flush. At 65,536 ranks (8,192 nodes) that is
65,536 windows a second through 8,192 links, several cores. With the tree, node relays send
their windows to a **group relay** instead (a thread of the launcher of each group's first node),
which merges each rank's consecutive windows (:meth:`WindowStats.merge
<traceml_core.statistics.window.WindowStats.merge>`: the same value, over more records) and forwards
them to node 0 every :func:`group_flush_s` seconds on one link: node 0 serves about sqrt(nodes)
links and merges a window per rank every few seconds, whatever the node count. Nothing else
changes for node 0: the group relay passes every other frame on as it came (joins, losses,
events, goodbyes, system samples), in each rank's order, and says which nodes it carries
(``node`` frames), so node 0 keeps each node's presence, its ranks' routes and endings exactly as
with direct links.

Shape (``fan_in`` F from the node count, :func:`fan_in`): group ``g`` is nodes ``g*F ..
g*F+F-1``; its first node runs the group relay on the aggregator's port (free there: the
aggregator runs on node 0 only), and those nodes' relays connect to it (endpoint ``group:<g>``).
Group 0's nodes connect to node 0's aggregator directly (it is their group head).

Guarantees, as the node relay's (launcher/relay.py): it checks every hello (kind ``node`` of its
group's nodes only) and every frame (``wire/frames.validate``; a bad relayed frame is counted and
skipped, as at node 0); its memory is capped (``budget_bytes``); a window it cannot queue is
dropped and counted for its rank (``dropped`` frames carry the node relay's count plus its own);
after its own link to node 0 comes back it re-announces the nodes and ranks it carries; downstream
``req`` and ``end`` frames go to every node relay of the group.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..statistics.window import MAX_RECORDS, WindowStats
from ..wire.auth import AGGREGATOR, Endpoint, Identity, NonceCache, check_hello, group_aud
from ..wire.client import ClientConfig, TelemetryClient
from ..wire.fold import fold_frame
from ..wire.frames import validate
from ..wire.protocol import ProtocolError, encode
from ..wire.server import Conn, FramedServer, Handler, Limits, Waker, listen
from .outqueue import OutQueue, Outgoing

log = logging.getLogger("traceml.grouprelay")

#: from this many nodes on, node relays report through group relays (below, node 0 merges every
#: node relay's windows itself well within a core: 0.2 of one at 4,096 ranks on 256 nodes)
TREE_MIN_NODES = 512
#: node 0 merges about this many rank windows a second at most, whatever the size (the group
#: relays' flush interval grows with the ranks beyond it)
NODE0_WINDOWS_PER_S = 8192
#: bytes a group relay holds for node 0 at most (its group's windows; it drops and counts beyond)
DEFAULT_BUDGET = 256 * 1024 * 1024


def fan_in(nnodes: int) -> int:
    """Nodes per group (0: no tree): about sqrt(nodes) from TREE_MIN_NODES nodes on, so node 0
    serves ~sqrt(nodes) links and each group relay ~sqrt(nodes) node relays."""
    if nnodes < TREE_MIN_NODES:
        return 0
    return math.isqrt(nnodes - 1) + 1


def relay_fan_in(value: str, nnodes: int) -> int:
    """Nodes per group for the ``relay_fan_in`` option's normalised value (options.py): ``auto``
    = :func:`fan_in`, ``off`` = 0 (no group relays), or that many nodes."""
    if value == "off" or nnodes < 2:
        return 0
    if value == "auto":
        return fan_in(nnodes)
    return min(int(value), nnodes)


def tree_fan_in(config: Any) -> int:
    """Nodes per group relay for a launch (its LaunchConfig): 0 (no group relays) in the live
    modes (one node) and when the nodes' hostnames are unknown (a node could not find its
    group's first node), else :func:`relay_fan_in` of ``--relay-fan-in``. Every node and node 0's
    aggregator compute the same."""
    if config.mode != "summary" or len(config.hosts_by_node) != config.nnodes:
        return 0
    return relay_fan_in(config.relay_fan_in, config.nnodes)


def group_flush_s(world: int, node_flush_s: float = 1.0) -> float:
    """How long a group relay merges each rank's windows before forwarding them: node relays'
    flush interval, longer beyond NODE0_WINDOWS_PER_S ranks (2 s at 16,384 ranks, 8 s at
    65,536): node 0 then merges at most ~8,192 windows a second, however many ranks."""
    return max(node_flush_s, node_flush_s * world / NODE0_WINDOWS_PER_S)  # (a whole number of seconds)


def group_members(group: int, fan: int, nnodes: int) -> range:
    """The nodes of ``group``."""
    return range(group * fan, min((group + 1) * fan, nnodes))


@dataclass
class _NodeLink:
    conn: Conn
    node: int
    host: str
    nproc: Optional[int]


@dataclass
class _RankLane:
    """What the group relay knows of one rank of its group."""

    rank: int
    node: int
    pending: Optional[WindowStats] = None  # windows merged, not queued yet
    merged: int = 0         # ... how many
    dropped: int = 0        # the rank's own cumulative drop count (its windows' ``dropped``)
    open: Optional[int] = None
    seen_end: int = 0       # seq after the last record that reached this relay
    up_dropped: int = 0     # records its node relay dropped (its cumulative count)
    own_dropped: int = 0    # windows' records this relay dropped (budget full)
    reported: int = 0       # own_dropped + up_dropped queued in a loss frame
    told: int = 0           # ... handed to the upstream socket
    join: Optional[dict[str, Any]] = field(default=None)


class GroupRelay(Handler):
    """See the module docstring. ``upstream`` is node 0's aggregator ``(host, port)``."""

    def __init__(self, *, token: str, run_name: str, job_id: Optional[str], group: int, fan: int,
                 nnodes: int, nproc_per_node: int, upstream: tuple[str, int], hostname: str = "",
                 bind_host: str = "0.0.0.0", port: int = 0, flush_s: float = 1.0,
                 budget_bytes: int = DEFAULT_BUDGET, handshake_timeout_s: float = 10.0,
                 warn: Optional[Callable[[str], None]] = None,
                 client_options: Optional[dict[str, Any]] = None) -> None:
        self.group = group
        self.members = group_members(group, fan, nnodes)
        self.head = self.members.start
        self.nproc_per_node = nproc_per_node
        self.flush_s = max(0.0, flush_s)
        self.budget = max(1 << 16, int(budget_bytes))
        self._warn = warn or (lambda msg: log.warning("traceml: %s", msg))
        self.endpoint = Endpoint(aud=group_aud(group), run=run_name, job=job_id, keys={"node": token},
                                 nnodes=nnodes, nproc_per_node=nproc_per_node, nodes=self.members)
        self._nonces = NonceCache()
        self.counters: dict[str, int] = {}
        self.net = FramedServer(listen(bind_host, port, 1024), self, counters=self.counters,
                                log=self._warn, name=f"group {group}'s relay",
                                limits=Limits(hello_timeout_s=handshake_timeout_s, max_pending=4 * fan + 16,
                                              max_buffered=self.budget, max_out=1 << 20))
        self.host, self.port = self.net.listener.getsockname()[:2]
        self._waker = Waker(self.net)
        self.out = OutQueue(on_told=self._told)
        self.merge = GroupMerge(self.out, nproc_per_node, self.budget)
        self._nodes: dict[int, _NodeLink] = {}
        self._down: deque[dict[str, Any]] = deque()
        self._retell: deque[_RankLane] = deque()
        self._next_flush = 0.0
        self._closing = False
        self._close_deadline = 0.0
        self._run_ended = False
        self._thread: Optional[threading.Thread] = None
        host, port_ = upstream
        opts = {"backoff_initial": 0.1, "poll_interval": 0.05, **(client_options or {})}
        self.client = TelemetryClient(
            ClientConfig(host, port_, token, aud=AGGREGATOR, run=run_name, job=job_id, node=self.head, rank=-1,
                         kind="group", hostname=hostname or socket.gethostname(),
                         extra={"nodes": len(self.members)}, peer="node 0's aggregator",
                         name=f"traceml-group-up-{group}", **opts),
            source=self.out, on_connect=self._reannounce, on_frame=self._from_upstream)

    # ---- other threads ----------------------------------------------------------------------
    def start(self) -> "GroupRelay":
        self.client.start()
        self._thread = threading.Thread(target=self._run, name=f"traceml-group-{self.group}", daemon=True)
        self._thread.start()
        return self

    def wait_connected(self, timeout: float) -> bool:
        return self.client.wait_connected(timeout)

    def run_ended(self) -> None:
        self._run_ended = True
        self.client.ending()

    def close(self, timeout: float = 2.0) -> None:
        """Forward what is held, then stop (within ``timeout`` s)."""
        self._close_deadline = time.monotonic() + max(0.0, timeout)
        self._closing = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout / 2 + 1.0)
        self.client.close(max(0.1, self._close_deadline - time.monotonic()))

    def _wake(self) -> None:
        self._waker.wake()

    def _told(self, rank: int, count: int) -> None:  # the client thread
        lane = self.merge.ranks.get(rank)
        if lane is not None and count > lane.told:
            lane.told = count

    def _reannounce(self) -> list[Union[dict[str, Any], bytes]]:
        """Client thread, after each welcome: the nodes and ranks this relay carries (node 0
        forgot them when the previous link closed), then the losses it was not told of."""
        frames: list[Union[dict[str, Any], bytes]] = []
        nodes = dict(self._nodes)
        for n in sorted(nodes):
            frames.append({"t": "node", "node": n, "host": nodes[n].host, "nproc": nodes[n].nproc})
        for lane in sorted(list(self.merge.ranks.values()), key=lambda ln: ln.rank):
            if lane.join is not None and lane.node in nodes:
                frames.append(dict(lane.join, new=False, seq_end=lane.seen_end))
            if lane.up_dropped + lane.own_dropped > lane.told:
                self._retell.append(lane)
        self._wake()
        return frames

    def _from_upstream(self, msg: dict[str, Any]) -> None:
        """Client thread: ``req`` and ``end`` from node 0, for every node relay of the group."""
        if msg["t"] == "end":
            self.run_ended()
        self._down.append(msg)
        self._wake()

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self.net.step(max(0.0, min(0.05, self._next_flush - time.monotonic())))
                while self._down:
                    msg = self._down.popleft()
                    data = encode({k: msg[k] for k in ("t", "id", "kind", "ranks", "args") if k in msg})
                    for link in list(self._nodes.values()):
                        self.net.send_raw(link.conn, data)
                while self._retell:
                    lane = self._retell.popleft()
                    lane.reported = min(lane.reported, lane.told)
                    self.merge.loss(lane)
                now = time.monotonic()
                if self._closing or now >= self._next_flush:
                    self._next_flush = now + self.flush_s
                    self.merge.flush()
                    self.client.wake()
                if self._closing and (not self.net.conns or now >= self._close_deadline):
                    self.merge.flush()
                    self.client.wake()
                    return
        except Exception as exc:  # never take the launcher down; node relays see a closed link
            self._warn(f"the group relay stopped after an internal error: {type(exc).__name__}: {exc}")
        finally:
            self.net.close_all()
            self.net.poller.close()
            self._waker.close()

    # ---- node relays (the handler) -----------------------------------------------------------
    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Union[Identity, str]:
        refused = self.client.refused_reason
        if refused is not None:
            return f"node 0 refused this group's relay: {refused}"
        if self._closing:
            return "this group's relay is shutting down"
        return check_hello(msg, self.endpoint, self._nonces)

    def on_accept(self, conn: Conn) -> None:
        i = conn.ident
        assert i is not None
        old = self._nodes.get(i.node)
        if old is not None and old.conn is not conn:  # replaced: its new link is the node
            self._node_gone(old, say=False)
            old.conn.user = None
            self.net.close(old.conn)
        self._nodes[i.node] = link = _NodeLink(conn, i.node, i.host, i.nproc)
        conn.user = link
        self._put(encode({"t": "node", "node": i.node, "host": i.host, "nproc": i.nproc}))

    def on_close(self, conn: Conn) -> None:
        link = conn.user
        if link is not None and self._nodes.get(link.node) is link:
            self._node_gone(link, say=True)

    def _node_gone(self, link: _NodeLink, say: bool) -> None:
        self.merge.flush(link.node)
        del self._nodes[link.node]
        if say:
            self._put(encode({"t": "node", "node": link.node, "gone": True}))

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        link: _NodeLink = conn.user
        try:
            checked = validate("node", msg)
        except ProtocolError as exc:  # the link carries the node's other ranks: skip, count
            self.counters["malformed"] = self.counters.get("malformed", 0) + 1
            self.net.events("relayed_malformed", f"{conn.label()}: skipped a bad relayed "
                            f"{str(msg.get('t'))[:20]!r} frame: {str(exc)[:200]}")
            return
        if checked is None or link is None:
            self.counters["ignored_frames"] = self.counters.get("ignored_frames", 0) + 1
            return
        self.merge.frame(link.node, checked, bytes(data[off:end]))

    def _put(self, data: bytes) -> None:
        self.out.put(Outgoing(data))


class GroupMerge:
    """What a group relay does with its nodes' frames, without sockets: each rank's consecutive
    windows merged until :meth:`flush` (or until a frame of the rank that must stay in order),
    every other frame passed on, all into ``out`` (what the relay's client sends to node 0).
    ``frame`` takes frames already validated (``wire/frames.validate("node", ...)``) from node
    ``node``'s link, with their received bytes."""

    def __init__(self, out: OutQueue, nproc_per_node: int, budget_bytes: int = DEFAULT_BUDGET) -> None:
        self.out = out
        self.nproc_per_node = nproc_per_node
        self.budget = max(1 << 16, int(budget_bytes))
        self.ranks: dict[int, _RankLane] = {}
        self._waiting: dict[int, _RankLane] = {}   # ranks holding merged windows
        self.windows_in = 0
        self.windows_out = 0
        self.malformed = 0

    def frame(self, node: int, checked: dict[str, Any], raw: bytes) -> None:
        t = checked["t"]
        if t == "system":
            if checked["node"] == node:
                self.out.put(Outgoing(raw))
            return
        rank = checked.get("rank")
        if rank is None:  # the node launcher's own end: after its ranks' frames
            self.flush(node)
            self.out.put(Outgoing(encode(dict(checked, node=node))))
            return
        if type(rank) is not int or rank // self.nproc_per_node != node:
            self.malformed += 1
            return
        lane = self.ranks.get(rank)
        if lane is None:
            lane = self.ranks[rank] = _RankLane(rank, node)
        if t == "fold":
            self._window(lane, checked)
            return
        if lane.pending is not None:  # one rank's frames stay in order
            self._queue(lane)
        if t == "join":
            lane.join = {k: checked.get(k) for k in ("t", "rank", "local_rank", "host", "pid")}
        elif t in ("gone", "dropped"):
            lane.up_dropped = max(lane.up_dropped, checked["relay_dropped"])
            lane.seen_end = max(lane.seen_end, checked["seq_end"])
            total = lane.up_dropped + lane.own_dropped
            if lane.own_dropped:  # node 0 hears of both relays' drops, as one count
                raw = encode(dict(checked, relay_dropped=total))
            self.out.put(Outgoing(raw, rank, 0, total))
            lane.reported = max(lane.reported, total)
            return
        self.out.put(Outgoing(raw))

    def flush(self, node: Optional[int] = None) -> None:
        """Queue the merged windows (of ``node``'s ranks only, when given)."""
        for lane in list(self._waiting.values()):
            if node is None or lane.node == node:
                self._queue(lane)

    def _window(self, lane: _RankLane, msg: dict[str, Any]) -> None:
        value: WindowStats = msg["value"]
        self.windows_in += 1
        if msg["dropped"] > lane.dropped:
            lane.dropped = msg["dropped"]
        if msg.get("open") is not None:
            lane.open = msg["open"]
        end = msg["seq"] + msg["n"]
        if end > lane.seen_end:
            lane.seen_end = end
        p = lane.pending
        if p is not None and p.joins(value) and p.records + value.records <= MAX_RECORDS:
            p.merge(value)
            lane.merged += 1
            return
        if p is not None:
            self._queue(lane)
        lane.pending = WindowStats().merge(value)
        lane.merged = 1
        self._waiting[lane.rank] = lane

    def _queue(self, lane: _RankLane) -> None:
        """Queue the rank's merged windows for node 0 (or drop and count them: budget full)."""
        p = lane.pending
        lane.pending = None
        self._waiting.pop(lane.rank, None)
        if p is None or not p.records:
            return
        if lane.merged > 1:  # node 0 merges counted sketches with C-level passes, keeping no keys
            p.count_sketches()  # (one window's keys cost it less: they go on as they came)
        data = encode(fold_frame(lane.rank, p, lane.dropped, lane.open))
        if self.out.queued + len(data) > self.budget:
            lane.own_dropped += p.records
            self.out.records_dropped += p.records
            self.loss(lane)
            return
        self.out.put(Outgoing(data, lane.rank, p.records))
        self.windows_out += 1

    def loss(self, lane: _RankLane) -> None:
        """Queue a loss frame for the rank when node 0 was not told of all its drops yet."""
        total = lane.up_dropped + lane.own_dropped
        if total > lane.reported:
            data = encode({"t": "dropped", "rank": lane.rank, "relay_dropped": total, "seq_end": lane.seen_end})
            self.out.put(Outgoing(data, lane.rank, 0, total))
            lane.reported = total

