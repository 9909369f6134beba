"""Frames -> run state: everything the aggregator does with what its peers send, without sockets.

A peer is a *link*: any object standing for one accepted connection (the server passes its
``Conn``; tests pass plain objects). Links are ``node`` links (a node's relay: carries that node's
ranks and its launcher's system samples and end) or the ``control`` link (node 0's launcher).
Frames arrive here already validated (wire/frames.py, at the server's trust boundary), so this
module only applies them. One rank lifecycle: a rank exists for node 0 between its relay's
``join`` and ``gone`` (or the end of the relay's link).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..codec import decode
from ..rankfacts import FACT_KINDS
from ..rundata import LaunchEnd, LaunchLifecycle, RankBye, StepSource
from ..statistics.sketch import merged_quantiles
from ..wire.auth import Identity
from ..wire.protocol import ProtocolError
from .rankstate import RankState
from .state import RunState

#: connections one node may hold at once; more is a reconnect storm and the oldest is closed
MAX_NODE_LINKS = 4


class SubLink:
    """A node behind a group relay (launcher/grouprelay.py): for everything here it is that
    node's link (its ranks' routes, its presence); its frames come on the group's connection."""

    __slots__ = ("conn", "ident")

    def __init__(self, conn: Any, ident: Identity) -> None:
        self.conn = conn
        self.ident = ident

    @property
    def closed(self) -> bool:
        return bool(getattr(self.conn, "closed", False))


def _launch_end(msg: dict[str, Any], **fields: Any) -> LaunchEnd:
    """A launcher's end report (a node ``bye`` or the ``finish``), its worker report checked by
    frames.worker_report."""
    return decode(LaunchEnd, dict(fields, exit_code=msg.get("exit_code"), at=time.time(), workers=msg["workers"],
                                  oom=msg["oom"], torchrun=msg.get("torchrun")))


def _lifecycle(msg: dict[str, Any]) -> Optional[LaunchLifecycle]:
    """The launcher's lifecycle record (normalised by frames.launch_lifecycle), if it sent one."""
    return None if msg["lifecycle"] is None else decode(LaunchLifecycle, msg["lifecycle"])


class Ingest:
    def __init__(self, state: RunState, log: Callable[[str], None]) -> None:
        self.state = state
        self.log = log
        #: per node, its open links (normally one: its relay)
        self.node_links: dict[int, list[Any]] = {}
        #: per link, the ranks its relay announced and that are not ``gone`` yet
        self.carried: dict[Any, set[int]] = {}
        #: per rank, the link that carries it now
        self.route: dict[int, Any] = {}
        self.control: Any = None
        self.control_seen = False
        self._world_warned = False
        self._linked: set[int] = set()
        #: per group relay's connection, the nodes it carries now
        self.groups: dict[Any, dict[int, SubLink]] = {}
        #: the hang autopsy being collected (aggregator/autopsy.py), if any
        self.autopsy: Any = None
        self._median_step: tuple[float, Optional[float]] = (0.0, None)

    # --- links ---------------------------------------------------------------------------------
    def node_joined(self, link: Any, ident: Identity, now: float) -> Optional[Any]:
        """A node's relay connected. Returns an older link of that node to close, if too many."""
        st = self.state
        links = self.node_links.setdefault(ident.node, [])
        evict = None
        if len(links) >= MAX_NODE_LINKS:
            st.counters["replaced"] += 1
            evict = links[0]
            if isinstance(evict, SubLink):  # behind a group relay: that node's older link ends
                self.link_closed(evict, evict.ident, now, finishing=False)
                evict = None
        links.append(link)
        self.carried[link] = set()
        # a node seen on a link before (this process, or the checkpoint it resumed from)
        rejoin = ident.node in self._linked or any(
            n.node == ident.node and n.joined_at for n in (st.base.nodes if st.base else ()))
        self._linked.add(ident.node)
        st.note_join(ident.node, ident.host, "node", now)
        ni = st.node(ident.node)
        ni.connected = True
        ni.left_at = None
        if ident.nproc is not None:
            ni.nproc = ident.nproc
        delay = now - st.settings.started_at
        late = delay > st.settings.late_join_s and not rejoin
        self.log(f"node {ident.node} ({ident.host or '?'}) " + ("joined again" if rejoin else "joined")
                 + (f" late, {delay:.1f} s after the start" if late else ""))
        st.dirty = True
        return evict

    # --- group relays ------------------------------------------------------------------------
    def group_joined(self, link: Any, ident: Identity) -> None:
        """A group relay connected; its nodes follow in ``node`` frames."""
        self.groups[link] = {}
        self.log(f"the group relay of nodes {ident.node}..{self._group_end(ident) - 1} "
                 f"({ident.host or '?'}) joined")

    def _group_end(self, ident: Identity) -> int:
        return min(ident.node + max(1, self.state.settings.relay_fan_in), self.state.settings.nnodes)

    def group_frame(self, link: Any, ident: Identity, msg: dict[str, Any], now: float, *,
                    finishing: bool) -> None:
        """One validated frame from a group relay: a ``node`` frame (a node of the group came or
        went: like a node link opening or closing), or a frame of one of its nodes, applied as if
        that node's own link carried it."""
        subs = self.groups.setdefault(link, {})
        if msg["t"] == "node":
            n = msg["node"]
            if not ident.node <= n < self._group_end(ident):
                raise ProtocolError(f"group relay of node {ident.node} announced node {n}, not one of its group's")
            old = subs.pop(n, None)
            if old is not None:
                self.link_closed(old, old.ident, now, finishing=finishing)
            if not msg["gone"]:
                sub = subs[n] = SubLink(link, Identity("node", n, -1, msg["host"], None, nproc=msg["nproc"]))
                self.node_joined(sub, sub.ident, now)
            return
        if "rank" in msg:
            node = msg["rank"] // self.state.settings.nproc_per_node if type(msg["rank"]) is int else -1
        else:  # system samples and a node launcher's own end say their node
            node = msg.get("node")
        sub = subs.get(node) if type(node) is int else None
        if sub is None:
            raise ProtocolError(f"relayed {msg['t']!r} frame for node {node}, which this group relay "
                                "does not carry")
        self.node_frame(sub, sub.ident, msg)

    def group_closed(self, link: Any, now: float, *, finishing: bool) -> None:
        """A group relay's connection ended: each node it carried, as if its link ended."""
        for sub in self.groups.pop(link, {}).values():
            self.link_closed(sub, sub.ident, now, finishing=finishing)

    def links(self) -> list[Any]:
        """The open connections that carry nodes (node relays', group relays'), once each."""
        out: dict[int, Any] = {}
        for links in self.node_links.values():
            for c in links:
                conn = c.conn if isinstance(c, SubLink) else c
                out[id(conn)] = conn
        for conn in self.groups:
            out[id(conn)] = conn
        return list(out.values())

    def control_joined(self, link: Any, ident: Identity, now: float) -> Optional[Any]:
        """Node 0's launcher connected. Returns its previous control link to close, if any."""
        st = self.state
        old = self.control if self.control is not None and self.control is not link else None
        if old is not None:
            st.counters["replaced"] += 1
        self.control = link
        self.control_seen = True
        st.note_join(0, ident.host, "control", now)
        st.node(0).connected = True
        st.dirty = True
        return old

    def link_closed(self, link: Any, ident: Identity, now: float, *, finishing: bool) -> bool:
        """A link ended. True when it was the control link (the server decides what that means)."""
        if ident.kind == "control":
            if self.control is not link:
                return False
            self.control = None
            self._presence_changed(0, now, finishing)
            return True
        for rank in list(self.carried.pop(link, ())):
            if self.route.get(rank) is link:
                self._rank_closed(rank, now)
        links = self.node_links.get(ident.node, [])
        if link in links:
            links.remove(link)
            self._presence_changed(ident.node, now, finishing)
        return False

    def _presence_changed(self, node: int, now: float, finishing: bool) -> None:
        """A node is present while any of its links (or, for node 0, the control link) is open;
        the last one closing before the run's end, without the node's ``bye``, means it was lost."""
        st = self.state
        ni = st.node(node)
        present = bool(self.node_links.get(node)) or (node == 0 and self.control is not None)
        if present or not ni.connected:
            return
        ni.connected = False
        st.dirty = True
        if ni.bye is None and st.finish is None and not finishing:
            ni.left_at = now
            self.log(f"node {node} ({ni.host or '?'}) left before the run finished")

    def open_ranks(self) -> bool:
        return bool(self.route)

    def nodes_pending(self) -> list[int]:
        """Nodes other than 0 whose link is open and whose launcher has not said ``bye`` yet
        (node 0's launcher drains its relay before it sends ``finish``)."""
        st = self.state
        return [n for n, links in self.node_links.items()
                if n != 0 and links and st.node(n).bye is None]

    # --- frames from a node's relay --------------------------------------------------------------
    def node_frame(self, link: Any, ident: Identity, msg: dict[str, Any]) -> None:
        """One validated frame from a node link. A frame about a rank outside the world, or not
        carried by this link, is a :class:`ProtocolError` (the server counts and skips it)."""
        t = msg["t"]
        st = self.state
        if t == "system":
            self.system(ident, msg)
            return
        rank = msg.get("rank")
        if rank is None:  # the node launcher's own end (bye without a rank), with its worker report
            st.node(ident.node).bye = _launch_end(msg, status=msg.get("status"))
            st.node(ident.node).lifecycle = _lifecycle(msg)
            st.dirty = True
            return
        if not 0 <= rank < st.settings.world_size:
            raise ProtocolError(f"relayed {t!r} frame for rank {rank} outside the world")
        if rank // st.settings.nproc_per_node != ident.node:
            # a node's link speaks for that node's ranks only (torchrun's static layout)
            raise ProtocolError(f"relayed {t!r} frame for rank {rank}, not one of node {ident.node}'s")
        if t == "join":
            self._join(link, ident, st.rank(rank), msg)
            return
        if self.route.get(rank) not in (link, None) and t != "gone":
            raise ProtocolError(f"relayed {t!r} frame for rank {rank}, which another link carries")
        rs = st.rank(rank)
        if t == "fold":
            if msg.get("open") is not None:
                rs.last_open = msg["open"]
            st.records += rs.ingest_fold(msg)
            rs.last_seen = time.time()
        elif t == "tail":
            rs.note_tail(msg)
        elif t == "gone" or t == "dropped":
            self._loss(rs, msg)
            if t == "gone" and self.route.get(rank) is link:
                self.carried.get(link, set()).discard(rank)
                self._rank_closed(rank, time.time())
        elif t == "bye":
            self._rank_bye(rs, msg)
        elif t == "event":
            if msg["kind"] == "step_source":
                rs.step_source = None if msg["source"] is None else decode(StepSource, msg["source"])
            elif msg["kind"] in FACT_KINDS:  # a checkpoint span, progress, declared work
                if msg.get("fact") is not None:
                    rs.facts.apply(msg["kind"], msg["fact"])
            else:
                rs.note_event(msg["kind"], msg["text"], msg["ts"] or time.time())
        elif t == "resp":
            self.resp(rs, msg)
        st.dirty = True

    def _join(self, link: Any, ident: Identity, rs: RankState, msg: dict[str, Any]) -> None:
        now = time.time()
        if rs.node is not None and rs.node != ident.node and rs.connected:
            raise ProtocolError(f"rank {rs.rank} joined from node {ident.node} while connected "
                                f"through node {rs.node}")
        rs.node = ident.node
        # the node's host as its relay (its launcher, authenticated for that node) said: a rank
        # reaches its relay on loopback, so it runs there, whatever its own hello claims
        rs.host = ident.host or msg["host"] or ""
        rs.pid = msg["pid"]
        rs.local_rank = msg["local_rank"]
        if msg.get("seq_end") is not None and msg["seq_end"] > rs.relay_seq_end:
            rs.relay_seq_end = msg["seq_end"]  # a re-announce: how far the rank's records went
        rs.connected = True
        # a re-announce (new false) is no new connection, unless this is the first this process
        # and the checkpoint it resumed from know of the rank (its join died with a predecessor)
        if msg["new"] or (rs.connections == 0 and rs.joined_at is None):
            rs.connections += 1
        if rs.joined_at is None:
            rs.joined_at = now
        rs.last_seen = now
        old = self.route.get(rs.rank)
        if old is not None and old is not link:
            self.carried.get(old, set()).discard(rs.rank)
        self.route[rs.rank] = link
        self.carried.setdefault(link, set()).add(rs.rank)
        self.state.note_join(ident.node, rs.host, "rank", now)
        self.state.dirty = True

    def _rank_closed(self, rank: int, now: float) -> None:
        """A rank's connection ended (its relay said ``gone``, or the relay's link closed)."""
        self.route.pop(rank, None)
        st = self.state
        rs = st.ranks.get(rank)
        if rs is None:
            return
        rs.connected = False
        rs.closed_at = now
        st.dirty = True

    @staticmethod
    def _loss(rs: RankState, msg: dict[str, Any]) -> None:
        if msg["relay_dropped"] > rs.relay_dropped:
            rs.relay_dropped = msg["relay_dropped"]
        if msg["seq_end"] > rs.relay_seq_end:
            rs.relay_seq_end = msg["seq_end"]
        if msg.get("open") is not None:
            rs.open_bound = msg["open"]

    def _rank_bye(self, rs: RankState, msg: dict[str, Any]) -> None:
        dropped = msg.get("dropped")
        if dropped is not None and dropped > rs.client_dropped:
            rs.client_dropped = dropped
        rs.bye = RankBye(msg["status"], msg.get("steps"), msg.get("error"), time.time(), msg["fail_step"],
                         msg["fail_in_step"])

    def resp(self, rs: RankState, msg: dict[str, Any]) -> None:
        """A rank's answer to a request (see wire/frames.REQUESTS)."""
        if msg["kind"] == "counts":
            rs.counts = dict(msg["data"], at=time.time())
        elif msg["kind"] == "stacks" and self.autopsy is not None and msg["id"] == self.autopsy.req_id:
            self.autopsy.add(rs.rank, msg["data"])

    def median_step_ms(self, every_s: float = 30.0) -> Optional[float]:
        """The run's median step (every step of every rank: the ranks' step-time sketches merged,
        as the summary's ``steps.median_ms``), refreshed at most every ``every_s``."""
        at, value = self._median_step
        now = time.monotonic()
        if value is None or now - at >= every_s:
            ranks = list(self.state.ranks.values())
            if ranks:
                p50 = merged_quantiles((rs.stats.sketch("step_ns") for rs in ranks), (0.5,))[0]
                value = None if p50 is None else round(p50 / 1e6, 4)
            self._median_step = (now, value)
        return value

    def expected_ranks(self) -> dict[int, tuple[Optional[int], str, Optional[int]]]:
        """The ranks a hang report covers: every rank still carried by a relay (node, host, the
        steps it recorded so far)."""
        out = {}
        for rank in sorted(self.route):
            rs = self.state.ranks.get(rank)
            if rs is not None:
                out[rank] = (rs.node, rs.host or "", rs.next_seq)
        return out

    def system(self, ident: Identity, msg: dict[str, Any]) -> None:
        if msg["node"] != ident.node:
            raise ProtocolError(f"system frame for node {msg['node']!r} on node {ident.node}'s link")
        self.state.node_system(ident.node).ingest(msg.get("host") or ident.host, msg.get("samples"))
        self.state.dirty = True

    # --- the launcher ----------------------------------------------------------------------------
    def finish(self, msg: dict[str, Any]) -> None:
        self.state.finish = _launch_end(msg, interrupted=msg["interrupted"], reason=msg["reason"],
                                        failed_nodes=msg["failed_nodes"], source="launcher")
        self.state.node(0).lifecycle = _lifecycle(msg)
        self.state.dirty = True

    def status(self, checkpoint_s: float) -> dict[str, Any]:
        """The ``status`` answer to the launcher's ``query``."""
        st = self.state
        return {"t": "status",
                "nodes_joined": sorted(n for n, ni in st.nodes.items() if ni.joined_at is not None),
                "ranks_connected": len(self.route),
                "ranks_seen": len(st.ranks), "records": st.records,
                "nodes_lost": sorted(n for n, ni in st.nodes.items()
                                     if ni.left_at is not None and ni.bye is None),
                "nodes_failed": {str(n): ni.bye.exit_code for n, ni in st.nodes.items()
                                 if ni.bye is not None
                                 and ni.bye.status not in ("clean", "interrupted", None)},
                "hosts": {str(n): ni.host for n, ni in st.nodes.items() if ni.host},
                "checkpoint_s": round(checkpoint_s, 4), "refused": st.counters["refused"],
                "silent": self.silent_ranks(), "median_step_ms": self.median_step_ms()}

    def silent_ranks(self, limit: int = 8) -> list[list[Any]]:
        """The longest-silent ranks that should still be stepping, for the launcher's hang watchdog:
        ``[rank, seconds since its last steps frame, records received so far (its step count),
        node, host]``, longest first. Only ranks that have sent steps, have not said ``bye`` and
        are still carried by an open link count, so a broken telemetry connection is never
        mistaken for a hung rank."""
        now = time.time()
        out = []
        for rank in self.route:
            rs = self.state.ranks.get(rank)
            if rs is None or rs.bye is not None or rs.received <= 0 or rs.last_seen is None:
                continue
            out.append([rs.rank, round(now - rs.last_seen, 3), rs.next_seq, rs.node, rs.host])
        out.sort(key=lambda x: -x[1])
        return out[:limit]
