"""The aggregator's network loop: one epoll/selectors loop, non-blocking sockets, no thread per peer.

Defences (issue 9): a hello must arrive within ``handshake_timeout_s`` and fit in
:data:`MAX_HELLO` bytes; at most ``max_pending_handshakes`` connections may wait for their hello
(the oldest is dropped past that, so a flood of idle sockets cannot lock real ranks out); a frame
longer than its limit, undecodable bytes or wrong types inside a frame close that one connection
and are counted; the bytes buffered over all connections are capped. Nothing a peer sends can
raise out of the loop.

Ending (whichever comes first):

* ``finish`` from the launcher: read what is still in flight for up to ``drain_s`` (or until every
  rank connection closed), write the summary, answer ``finished``, exit 0;
* SIGTERM/SIGINT: checkpoint and write a provisional summary at once, then wait up to
  ``term_grace_s`` for the launcher's ``finish`` (a second signal ends the wait);
* every expected rank said ``bye`` and no launcher is connected;
* the launcher's connection dropped without ``finish``: wait up to ``launcher_lost_grace_s`` for
  the ranks to close, then finish with what we have.
"""

from __future__ import annotations

import errno
import ipaddress
import resource
import signal
import socket
import sys
import time
from typing import Any, Callable, Optional

from ..options import BY_KEY
from ..wire.framing import split_frames
from ..wire.protocol import (MAX_FRAME, MAX_HELLO, PROTOCOL_VERSION, RECV_SIZE, ProtocolError, encode,
                             step_source, worker_report)
from .handshake import Identity, NonceCache, check_hello
from .poller import READ, WRITE, Poller
from .persist import CHECKPOINT_NAME, RunDir, pack_checkpoint, write_file
from .rankstate import RankState
from .settings import AggregatorSettings
from .state import RunState

#: connections one node's launcher may hold at once (presence link, system sampler, relay)
MAX_NODE_CONNS = 4
TICK_S = 0.2
#: pending step records are turned into statistics at least this often
FLUSH_S = 1.0
#: the largest share of wall-clock time spent writing checkpoints (the interval stretches)
CHECKPOINT_SHARE = 0.02
_BYE_STATUSES = ("clean", "error", "interrupted")
#: frames a node's relay forwards or writes for one of its ranks (they carry ``rank``)
_RELAYED = frozenset(("steps", "event", "bye", "join", "gone", "dropped"))
#: relayed frames rejected as malformed are logged this many times, then every 1,000th
_RELAY_ERROR_LOGS = 20


def log(msg: str) -> None:
    try:
        sys.stderr.write(f"traceml-aggregator: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Conn:
    __slots__ = ("sock", "fd", "addr", "buf", "out", "ident", "rs", "deadline", "closed", "bye",
                 "relayed")

    def __init__(self, sock: socket.socket, addr: Any, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.buf = bytearray()
        self.out = bytearray()
        self.ident: Optional[Identity] = None
        self.rs: Optional[RankState] = None
        self.deadline = deadline
        self.closed = False
        self.bye = False  # a node connection's launcher said bye
        self.relayed: Optional[set[int]] = None  # node connection: ranks its relay announced

    def label(self) -> str:
        peer = f"{self.addr[0]}:{self.addr[1]}" if isinstance(self.addr, tuple) else str(self.addr)
        i = self.ident
        if i is None:
            return f"connection from {peer}"
        who = f"rank {i.rank}" if i.kind == "rank" else f"{i.kind} (node {i.node})"
        return f"{who} from {peer}"


class BindError(Exception):
    """The listening socket could not be opened; ``str()`` is the user-facing paragraph."""


def port_clash_hint(settings: AggregatorSettings) -> str:
    """The rest of the port-in-use sentence, fitting where the port came from."""
    src, multi = settings.port_source, settings.nnodes > 1
    same = " (the same on every node of the job)" if multi else ""
    if src.startswith("slurm:"):
        return ("probably by another job on this node whose job id is a multiple of 1,024 away "
                "(job-derived ports repeat every 1,024 jobs), or a previous run still shutting down. "
                f"Pass a free port with --aggregator-port PORT (or TRACEML_AGGREGATOR_PORT){same}.")
    if src == "default":
        fix = "--standalone (free local ports) or " if not multi else ""
        return ("probably by another `traceml run` on this machine using the same default port, or a "
                f"previous run still shutting down. Use {fix}--aggregator-port PORT with a free port"
                f"{same}.")
    unset = (" or unset it so the job-derived port is used" if settings.job_id
             else f" or unset it to use the default ({BY_KEY['aggregator_port'].default})")
    return ("probably by another job or a previous run still shutting down. Pass another free port "
            f"with --aggregator-port PORT (or TRACEML_AGGREGATOR_PORT){same},{unset}.")


def open_listener(settings: AggregatorSettings) -> socket.socket:
    host = settings.bind_host
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, settings.port))
        sock.listen(min(socket.SOMAXCONN, 4096) if socket.SOMAXCONN > 128 else 4096)
    except OSError as exc:
        sock.close()
        where = f"{host}:{settings.port}"
        src = f" (from {settings.port_source})" if settings.port_source != "default" else ""
        if exc.errno == errno.EADDRINUSE:
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: port {settings.port}{src} is "
                f"already in use on this node, {port_clash_hint(settings)}") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: {host} is not an address of "
                "this node. Set --aggregator-bind-host (or TRACEML_AGGREGATOR_BIND_HOST) to an "
                "interface address of node 0, or 0.0.0.0.") from None
        if exc.errno == errno.EACCES:
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: permission denied (ports below "
                "1024 need root). Choose --aggregator-port above 1024.") from None
        raise BindError(f"The TraceML aggregator cannot listen on {where}: {exc.strerror}. "
                        "Check --aggregator-bind-host and --aggregator-port.") from None
    sock.setblocking(False)
    return sock


def raise_fd_limit() -> None:
    """Thousands of ranks need thousands of sockets; lift the soft limit to the hard one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass


class Server:
    def __init__(self, settings: AggregatorSettings, listener: socket.socket, run_dir: RunDir,
                 finalize: Callable[["Server", dict[str, Any], bool], dict[str, Any]]) -> None:
        self.settings = settings
        self.listener = listener
        self.port = listener.getsockname()[1]
        self.run_dir = run_dir
        self.state = RunState(settings)
        self.state.run_dir_note = run_dir.note
        self._finalize_cb = finalize
        self.poller = Poller()
        self.poller.register(listener.fileno(), READ, None)
        self.nonces = NonceCache()
        self.pending: dict[Conn, None] = {}  # waiting for their hello, oldest first
        self.rank_conns: dict[int, Conn] = {}
        #: ranks connected through a node's relay (announced by ``join``, not yet ``gone``)
        self.relayed: dict[int, Conn] = {}
        self._relay_errors = 0
        #: per node, its launcher's connections (a presence link and, e.g., a system sampler)
        self.node_conns: dict[int, list[Conn]] = {}
        self.control: Optional[Conn] = None
        self.control_seen = False
        self.buffered = 0
        self._scratch = bytearray(RECV_SIZE)
        self._scratch_view = memoryview(self._scratch)
        #: ranks holding frames whose statistics are not computed yet (see RankState.flush)
        self.unflushed: set[RankState] = set()
        self._next_flush = 0.0
        self.done = False
        self.result: Optional[dict[str, Any]] = None
        # ending state
        self.finish_conn: Optional[Conn] = None
        self.drain_until: Optional[float] = None
        self.signals = 0
        self.term_until: Optional[float] = None
        self.launcher_lost_until: Optional[float] = None
        now = time.monotonic()
        self._next_checkpoint = now + settings.checkpoint_interval_s
        self._next_tick = now + TICK_S
        self._refusal_logs = 0
        self._listener_paused_until: Optional[float] = None
        self._world_warned = False
        self.checkpoint_seconds = 0.0

    # --- loop --------------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            self.signals += 1
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for name in ("SIGUSR1", "SIGUSR2", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)

    def serve_forever(self) -> dict[str, Any]:
        while not self.done:
            self.step(TICK_S)
        return self.result or {}

    def step(self, timeout: float) -> None:
        """One turn of the loop: serve ready sockets, then the periodic work when due."""
        for conn, readable, writable in self.poller.poll(timeout):
            if conn is None:
                self._accept()
                continue
            if readable and not conn.closed:
                self._read(conn)
            if writable and not conn.closed:
                self._flush(conn)
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            self._tick(now)

    def _tick(self, now: float) -> None:
        if self._listener_paused_until is not None and now >= self._listener_paused_until:
            self._listener_paused_until = None
            self.poller.register(self.listener.fileno(), READ, None)
        # slowloris: pending connections past their deadline
        while self.pending:
            c = next(iter(self.pending))
            if c.deadline > now:
                break
            self.state.counters["handshake_timeouts"] += 1
            self._close(c)
        if now >= self._next_flush:
            self.flush_ranks()
            self._next_flush = now + FLUSH_S
        if self.signals:
            self._on_signal(now)
        if self._should_finalize(now):
            self.finalize()
            return
        if now >= self._next_checkpoint:
            self.checkpoint()

    def _on_signal(self, now: float) -> None:
        if self.term_until is None:
            self.term_until = now + self.settings.term_grace_s
            log("SIGTERM: writing a provisional summary, then waiting "
                f"{self.settings.term_grace_s:.0f} s for the launcher's exit report")
            self.signals = 1
            try:
                self.write_outputs(provisional=True)
            except Exception as exc:  # never die here: the final write may still succeed
                log(f"could not write the provisional summary: {exc}")
        elif self.signals > 1:
            log("second signal: finishing now")
            self.term_until = now

    def _should_finalize(self, now: float) -> bool:
        st = self.state
        if self.drain_until is not None:
            open_ranks = bool(self.relayed) or any(not c.closed for c in self.rank_conns.values())
            # a node launcher still connected will send its bye with its worker report (which
            # rank failed, with what signal): wait for it too, within the same bound
            open_nodes = any(conns and st.node(n).bye is None
                             for n, conns in self.node_conns.items() if n != 0)
            return not (open_ranks or open_nodes) or now >= self.drain_until
        if self.term_until is not None and (now >= self.term_until or
                                            (self.control is None and self.control_seen)):
            if st.finish is None:
                st.finish = {"exit_code": None, "interrupted": True,
                             "reason": "the aggregator received SIGTERM (scancel or time limit?) "
                                       "and the launcher sent no exit report", "failed_nodes": [],
                             "source": "aggregator"}
            return True
        if self.launcher_lost_until is not None:
            open_ranks = bool(self.relayed) or any(not c.closed for c in self.rank_conns.values())
            if not open_ranks or now >= self.launcher_lost_until:
                if st.finish is None:
                    st.finish = {"exit_code": None, "interrupted": False,
                                 "reason": "the launcher's connection to the aggregator closed "
                                           "without an exit report (launcher killed?)",
                                 "failed_nodes": [], "source": "aggregator"}
                return True
            return False
        if self.control is None and len(st.ranks) >= self.settings.world_size:
            byes = [rs.bye for rs in st.ranks.values()]
            if all(byes):
                if st.finish is None:
                    failed = any(b["status"] != "clean" for b in byes)  # type: ignore[index]
                    st.finish = {"exit_code": None, "interrupted": False,
                                 "reason": "every rank ended (" + ("some with an error" if failed
                                                                   else "all cleanly") + ")",
                                 "failed_nodes": [], "source": "ranks"}
                return True
        return False

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    if self.pending:
                        # out of descriptors: make room by dropping the oldest unauthenticated peer
                        self.state.counters["evicted"] += 1
                        self._close(next(iter(self.pending)))
                        continue
                    # nothing to drop: stop accepting for a moment instead of spinning on it
                    log("out of file descriptors: not accepting new connections for 1 s")
                    self.poller.unregister(self.listener.fileno())
                    self._listener_paused_until = time.monotonic() + 1.0
                    return
                log(f"accept failed: {exc}")
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.state.counters["connections"] += 1
            if len(self.pending) >= self.settings.max_pending_handshakes:
                self.state.counters["evicted"] += 1
                self._close(next(iter(self.pending)))
            c = Conn(sock, addr, time.monotonic() + self.settings.handshake_timeout_s)
            self.pending[c] = None
            self.poller.register(c.fd, READ, c)

    def _close(self, c: Conn) -> None:
        if c.closed:
            return
        c.closed = True
        self.buffered -= len(c.buf)
        c.buf = bytearray()
        self.pending.pop(c, None)
        self.poller.unregister(c.fd)
        try:
            c.sock.close()
        except OSError:
            pass
        i = c.ident
        if i is None:
            return
        now = time.time()
        if i.kind == "rank":
            if self.rank_conns.get(i.rank) is c:
                del self.rank_conns[i.rank]
                rs = c.rs
                if rs is not None:
                    if rs.pending:
                        self.unflushed.discard(rs)
                        rejected = rs.flush()  # the connection is gone anyway
                        if rejected:
                            self.state.records -= rejected
                            self.state.counters["malformed"] += 1
                    rs.connected = False
                    rs.closed_at = now
                    self.state.dirty = True
        elif i.kind == "node":
            conns = self.node_conns.get(i.node, [])
            if c.relayed:  # the relay's link is gone: so are the rank connections it carried
                for rank in list(c.relayed):
                    if self.relayed.get(rank) is c:
                        self._relayed_closed(rank, now)
                c.relayed = None
            if c in conns:
                conns.remove(c)
                self._node_presence_changed(i.node, now)
        elif i.kind == "control" and self.control is c:
            self.control = None
            self._node_presence_changed(0, now)
            if self.state.finish is None and self.drain_until is None and self.term_until is None:
                self.launcher_lost_until = time.monotonic() + self.settings.launcher_lost_grace_s
                log("the launcher's control connection closed without an exit report; "
                    f"finishing within {self.settings.launcher_lost_grace_s:.0f} s")

    def _node_presence_changed(self, node: int, now: float) -> None:
        """A node is present while any of its launcher's connections (or, for node 0, the control
        connection) is open; the last one closing before the run's end, without the node's
        ``bye``, means the node was lost."""
        ni = self.state.node(node)
        present = bool(self.node_conns.get(node)) or (node == 0 and self.control is not None)
        if present or not ni.connected:
            return
        ni.connected = False
        self.state.dirty = True
        if ni.bye is None and self.state.finish is None and self.drain_until is None:
            ni.left_at = now
            log(f"node {node} ({ni.host or '?'}) left before the run finished")

    def _malformed(self, c: Conn, why: str) -> None:
        self.state.counters["malformed"] += 1
        log(f"closing {c.label()}: {why}")
        self._close(c)

    def _send(self, c: Conn, msg: dict[str, Any]) -> None:
        data = encode(msg)
        if c.out:
            c.out += data
            return
        try:
            sent = c.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(c)
            return
        if sent < len(data):
            c.out += data[sent:]
            self.poller.modify(c.fd, READ | WRITE)

    def _flush(self, c: Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        del c.out[:sent]
        if not c.out:
            self.poller.modify(c.fd, READ)

    def _read(self, c: Conn) -> None:
        try:
            got = c.sock.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        if not got:
            self._close(c)
            return
        before = len(c.buf)
        if before:
            self.buffered += got   # split_frames appends them to c.buf; _close uncounts c.buf
        why = split_frames(c, self._scratch_view, got, MAX_FRAME if c.ident is not None else MAX_HELLO,
                           self._on_frame)
        if why is not None:
            self._malformed(c, why)
            return
        if c.closed:
            return
        self.buffered += len(c.buf) - (before + got if before else 0)
        if c.buf and self.buffered > self.settings.max_buffered_bytes:
            self.state.counters["overload"] += 1
            log(f"closing {c.label()}: aggregator buffers full ({self.buffered} bytes)")
            self._close(c)

    def _on_frame(self, c: Conn, msg: dict[str, Any], _data: Any, _off: int, _end: int) -> int:
        return MAX_FRAME if self._dispatch(c, msg) else 0

    # --- frames -------------------------------------------------------------------------------
    def _dispatch(self, c: Conn, msg: dict[str, Any]) -> bool:
        """Handle one frame; False when the connection was closed."""
        i = c.ident
        if i is None:
            return self._hello(c, msg)
        t = msg.get("t")
        try:
            if i.kind == "rank":
                if t == "steps":
                    if msg.get("rank") != i.rank:
                        raise ProtocolError(f"steps for rank {msg.get('rank')!r} on rank {i.rank}'s connection")
                    rs = c.rs
                    self.state.records += rs.ingest_steps(msg)  # type: ignore[union-attr]
                    if rs.pending:  # type: ignore[union-attr]
                        self.unflushed.add(rs)  # type: ignore[arg-type]
                    rs.last_seen = time.time()  # type: ignore[union-attr]
                    self.state.dirty = True
                elif t == "bye":
                    self._rank_bye(c.rs, msg)  # type: ignore[arg-type]
                elif t == "event":
                    self._event(c.rs, msg)  # type: ignore[arg-type]
                elif t == "system":
                    self._system(i, msg)
                else:
                    self.state.counters["ignored_frames"] += 1
            elif i.kind == "node":
                rank = msg.get("rank")
                if type(rank) is int and t in _RELAYED:
                    self._relayed_frame(c, i, rank, t, msg)
                elif t == "system":
                    self._system(i, msg)
                elif t == "bye":  # the node's launcher ends (no "rank": not a relayed rank bye)
                    code = msg.get("exit_code")
                    status = msg.get("status")
                    c.bye = True
                    self.state.node(i.node).bye = {
                        "status": status if isinstance(status, str) else None,
                        "exit_code": code if type(code) is int else None, "at": time.time(),
                        **worker_report(msg)}
                    self.state.dirty = True
                else:
                    self.state.counters["ignored_frames"] += 1
            else:  # control
                if t == "finish":
                    self._finish(c, msg)
                elif t == "query":
                    self._send(c, self.status_frame())
                elif t == "snapshot":  # live views (views/snapshot.py; never raises)
                    from ..views.snapshot import snapshot_frame
                    self._send(c, snapshot_frame(self, msg))
                elif t == "system":
                    self._system(i, msg)
                else:
                    self.state.counters["ignored_frames"] += 1
        except ProtocolError as exc:
            self._malformed(c, str(exc))
            return False
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError) as exc:
            self._malformed(c, f"bad {str(t)[:20]!r} frame ({type(exc).__name__}: {str(exc)[:120]})")
            return False
        return not c.closed

    def _hello(self, c: Conn, msg: dict[str, Any]) -> bool:
        now = time.time()
        result = check_hello(msg, self.settings, self.nonces, now)
        if isinstance(result, str):
            self.state.counters["refused"] += 1
            self._refusal_logs += 1
            n = self._refusal_logs
            if n <= 50 or n % 100 == 0:
                log(f"refused {c.label()}: {result}" + (f" ({n} refusals so far)" if n > 50 else ""))
            self._send(c, {"t": "refused", "reason": result})
            self._close(c)
            return False
        self.pending.pop(c, None)
        c.ident = result
        st = self.state
        if result.kind == "rank":
            world = msg.get("world")
            if type(world) is int and world > 0 and world != self.settings.world_size \
                    and not self._world_warned:
                self._world_warned = True
                log(f"rank {result.rank} reports a world of {world} processes, but this run was "
                    f"launched for {self.settings.world_size} ({self.settings.nnodes} node(s) x "
                    f"{self.settings.nproc_per_node}); ranks beyond that are refused")
            old = self.rank_conns.get(result.rank)
            if old is not None and old is not c:
                st.counters["replaced"] += 1
                log(f"rank {result.rank} reconnected; closing its previous connection")
                self.rank_conns.pop(result.rank, None)
                self._close(old)
            rs = st.rank(result.rank)
            rs.node = result.node
            rs.host = result.host
            rs.pid = result.pid
            rs.local_rank = result.local_rank
            rs.connected = True
            rs.connections += 1
            if rs.joined_at is None:
                rs.joined_at = now
            rs.last_seen = now
            c.rs = rs
            self.rank_conns[result.rank] = c
            st.note_join(result.node, result.host, "rank", now)
        elif result.kind == "node":
            conns = self.node_conns.setdefault(result.node, [])
            if len(conns) >= MAX_NODE_CONNS:  # a reconnect storm: keep the newest few
                st.counters["replaced"] += 1
                self._close(conns[0])
            conns.append(c)
            st.note_join(result.node, result.host, "node", now)
            ni = st.node(result.node)
            ni.connected = True
            ni.left_at = None
            if result.nproc is not None:
                ni.nproc = result.nproc
            delay = now - self.settings.started_at
            late = delay > self.settings.late_join_s
            log(f"node {result.node} ({result.host or '?'}) joined"
                + (f" late, {delay:.1f} s after the start" if late else ""))
        else:
            if self.control is not None and self.control is not c:
                st.counters["replaced"] += 1
                old, self.control = self.control, None
                self._close(old)
            self.control = c
            self.control_seen = True
            self.launcher_lost_until = None
            st.note_join(0, result.host, "control", now)
            st.node(0).connected = True
        st.dirty = True
        self._send(c, {"t": "welcome", "v": PROTOCOL_VERSION, "server_time": now})
        return not c.closed

    def _relayed_frame(self, c: Conn, i: Identity, rank: int, t: str, msg: dict[str, Any]) -> None:
        """A frame a node's relay sent for one of its ranks. A bad one is counted and skipped:
        the link carries the node's other ranks, so it is not closed for it (the relay checks
        every frame before forwarding it; see launcher/relayframes.py)."""
        try:
            if not 0 <= rank < self.settings.world_size:
                raise ProtocolError(f"relayed frame for rank {rank} outside the world")
            st = self.state
            if t == "steps":
                rs = st.rank(rank)
                st.records += rs.ingest_steps(msg)
                if rs.pending:
                    self.unflushed.add(rs)
                rs.last_seen = time.time()
            elif t == "join":
                self._relayed_join(c, i, st.rank(rank), msg)
            elif t == "gone" or t == "dropped":
                rs = st.rank(rank)
                dropped, seq_end = msg.get("relay_dropped"), msg.get("seq_end")
                if type(dropped) is not int or type(seq_end) is not int:
                    raise ProtocolError(f"{t}: relay_dropped and seq_end must be integers")
                if dropped > rs.relay_dropped:
                    rs.relay_dropped = dropped
                if seq_end > rs.relay_seq_end:
                    rs.relay_seq_end = seq_end
                if t == "gone" and self.relayed.get(rank) is c:
                    self._relayed_closed(rank, time.time())
            elif t == "bye":
                self._rank_bye(st.rank(rank), msg)
            else:
                self._event(st.rank(rank), msg)
            st.dirty = True
        except (ProtocolError, TypeError, ValueError, KeyError, AttributeError, OverflowError,
                IndexError) as exc:
            self.state.counters["malformed"] += 1
            self._relay_errors += 1
            n = self._relay_errors
            if n <= _RELAY_ERROR_LOGS or n % 1000 == 0:
                log(f"{c.label()}: skipped a bad relayed {t!r} frame for rank {rank}: "
                    f"{str(exc)[:200]}" + (f" ({n} so far)" if n > _RELAY_ERROR_LOGS else ""))

    def _relayed_join(self, c: Conn, i: Identity, rs: RankState, msg: dict[str, Any]) -> None:
        """A node's relay accepted this rank's hello (checked exactly as here); ``new`` is false
        when the relay only re-announces it after re-establishing its own link."""
        now = time.time()
        host, pid, local_rank = msg.get("host"), msg.get("pid"), msg.get("local_rank")
        rs.node = i.node
        rs.host = host[:255] if isinstance(host, str) else i.host
        rs.pid = pid if type(pid) is int else None
        rs.local_rank = local_rank if type(local_rank) is int else None
        rs.connected = True
        if msg.get("new", True) or rs.connections == 0:
            rs.connections += 1
        if rs.joined_at is None:
            rs.joined_at = now
        rs.last_seen = now
        old = self.relayed.get(rs.rank)
        if old is not None and old is not c and old.relayed:
            old.relayed.discard(rs.rank)
        self.relayed[rs.rank] = c
        if c.relayed is None:
            c.relayed = set()
        c.relayed.add(rs.rank)
        self.state.note_join(i.node, rs.host, "rank", now)

    def _relayed_closed(self, rank: int, now: float) -> None:
        """A relayed rank's connection ended (its relay said ``gone``, or the relay's link closed):
        the same as a direct rank connection closing."""
        c = self.relayed.pop(rank, None)
        if c is not None and c.relayed:
            c.relayed.discard(rank)
        rs = self.state.ranks.get(rank)
        if rs is None:
            return
        if rs.pending:
            self.unflushed.discard(rs)
            self._flush_rank(rs)
        rs.connected = False
        rs.closed_at = now
        self.state.dirty = True

    def _rank_bye(self, rs: RankState, msg: dict[str, Any]) -> None:
        status = msg.get("status")
        steps = msg.get("steps")
        dropped = msg.get("dropped")
        error = msg.get("error")
        if status not in _BYE_STATUSES:
            raise ProtocolError(f"bye: unknown status {str(status)[:20]!r}")
        if steps is not None and type(steps) is not int:
            raise ProtocolError("bye: steps must be an integer")
        if type(dropped) is int and dropped > rs.client_dropped:
            rs.client_dropped = dropped
        if rs.pending:
            self.unflushed.discard(rs)
            self._flush_rank(rs)
        fail_step = msg.get("fail_step")
        rs.bye = {"status": status, "steps": steps,
                  "error": error[:4000] if isinstance(error, str) else None, "at": time.time(),
                  "fail_step": fail_step if type(fail_step) is int and fail_step >= 0 else None,
                  "fail_in_step": msg.get("fail_in_step") is True}
        self.state.dirty = True

    def _event(self, rs: RankState, msg: dict[str, Any]) -> None:
        kind, text, ts = msg.get("kind"), msg.get("text"), msg.get("ts")
        if not isinstance(kind, str) or not isinstance(text, str):
            raise ProtocolError("event: kind and text must be strings")
        if kind == "step_source":
            rs.step_source = step_source(text)
        else:
            rs.note_event(kind, text, float(ts) if type(ts) in (int, float) else time.time())
        self.state.dirty = True

    def _system(self, i: Identity, msg: dict[str, Any]) -> None:
        node = msg.get("node", i.node)
        if node != i.node:
            raise ProtocolError(f"system frame for node {node!r} on node {i.node}'s connection")
        self.state.node_system(i.node).ingest(msg.get("host") or i.host, msg.get("samples"))
        self.state.dirty = True

    def _finish(self, c: Conn, msg: dict[str, Any]) -> None:
        code = msg.get("exit_code")
        failed = msg.get("failed_nodes") or []
        reason = msg.get("reason") or ""
        if code is not None and type(code) is not int:
            raise ProtocolError("finish: exit_code must be an integer")
        if type(failed) is not list or not all(type(n) is int for n in failed):
            raise ProtocolError("finish: failed_nodes must be a list of node ranks")
        self.state.finish = {"exit_code": code, "interrupted": bool(msg.get("interrupted")),
                             "reason": str(reason)[:500], "failed_nodes": failed[:100000],
                             "source": "launcher", "at": time.time(), **worker_report(msg)}
        self.finish_conn = c
        self.drain_until = time.monotonic() + self.settings.drain_s
        self.state.dirty = True

    def status_frame(self) -> dict[str, Any]:
        st = self.state
        return {"t": "status",
                "nodes_joined": sorted(n for n, ni in st.nodes.items() if ni.joined_at is not None),
                "ranks_connected": sum(1 for c in self.rank_conns.values() if not c.closed)
                + len(self.relayed),
                "ranks_seen": len(st.ranks), "records": st.records,
                "nodes_lost": sorted(n for n, ni in st.nodes.items()
                                     if ni.left_at is not None and ni.bye is None),
                "nodes_failed": {str(n): ni.bye.get("exit_code") for n, ni in st.nodes.items()
                                 if ni.bye is not None
                                 and ni.bye.get("status") not in ("clean", "interrupted", None)},
                "hosts": {str(n): ni.host for n, ni in st.nodes.items() if ni.host},
                "checkpoint_s": round(self.checkpoint_seconds, 4),
                "silent": self.silent_ranks()}

    def silent_ranks(self, limit: int = 8) -> list[list[Any]]:
        """The longest-silent ranks that should still be stepping, for the launcher's hang watchdog:
        ``[rank, seconds since its last steps frame, records received so far (its step count),
        node, host]``, longest first.

        Only ranks that have sent steps, have not said ``bye`` and are still reachable (their own
        connection, or their node's launcher connection, is open) count, so a broken telemetry
        connection is never mistaken for a hung rank.
        """
        now = time.time()
        out = []
        for rs in self.state.ranks.values():
            if rs.bye is not None or rs.received <= 0 or rs.last_seen is None:
                continue
            if not (rs.connected or self.node_conns.get(rs.node)):
                continue
            out.append([rs.rank, round(now - rs.last_seen, 3), rs.next_seq, rs.node, rs.host])
        out.sort(key=lambda x: -x[1])
        return out[:limit]

    def flush_ranks(self) -> None:
        """Compute pending statistics; close connections whose frames proved malformed."""
        todo, self.unflushed = self.unflushed, set()
        for rs in todo:
            self._flush_rank(rs)

    def _flush_rank(self, rs: RankState) -> None:
        rejected = rs.flush()
        if rejected:
            self.state.records -= rejected
            self.state.counters["malformed"] += 1
            c = self.rank_conns.get(rs.rank)
            log(f"rank {rs.rank}: {rejected} step records rejected (malformed values)"
                + ("; closing its connection" if c is not None else ""))
            if c is not None:
                self._close(c)

    # --- persistence and the end ----------------------------------------------------------------
    def checkpoint(self, *, final: bool = False,
                   data: Optional[dict[str, Any]] = None) -> Optional[float]:
        """Write the aggregate state atomically; returns the seconds it took (None = skipped)."""
        now = time.monotonic()
        if not self.state.dirty and not final and data is None:
            self._next_checkpoint = now + self.settings.checkpoint_interval_s
            return None
        t0 = time.perf_counter()
        if data is None:
            self.flush_ranks()
        try:
            blob = pack_checkpoint(data if data is not None else self.state.to_data(), final=final)
            write_file(self.run_dir, self.settings.run_name, CHECKPOINT_NAME, blob, sync=final)
            self.state.run_dir_note = self.run_dir.note
            self.state.dirty = False
        except OSError as exc:
            log(f"could not write the checkpoint: {exc}")
        dt = time.perf_counter() - t0
        self.checkpoint_seconds += dt
        # never spend more than ~2 % of the wall clock on checkpoints: at 4,096 ranks one takes
        # ~0.4 s and would otherwise be most of the ingest CPU (a rebuild after a SIGKILL then
        # misses at most ~20 s of statistics; small runs keep checkpoint_interval_s)
        self._next_checkpoint = time.monotonic() + max(self.settings.checkpoint_interval_s,
                                                       dt / CHECKPOINT_SHARE)
        return dt

    def write_outputs(self, *, provisional: bool = False) -> dict[str, Any]:
        self.flush_ranks()
        data = self.state.to_data()
        self.checkpoint(final=not provisional, data=data)
        data["run_dir_note"] = self.run_dir.note
        return self._finalize_cb(self, data, provisional)

    def finalize(self) -> None:
        try:
            result = self.write_outputs()
        except Exception as exc:  # the summary must never take the loop down silently
            log(f"could not write the final summary: {type(exc).__name__}: {exc}")
            result = {"summary_json": None, "summary_txt": None,
                      "error": f"{type(exc).__name__}: {exc}"}
        self.result = result
        reply = {"t": "finished", "summary_json": result.get("summary_json"),
                 "summary_txt": result.get("summary_txt"), "rebuilt": False}
        if result.get("error"):
            reply["error"] = result["error"]
        target = self.finish_conn if self.finish_conn is not None and not self.finish_conn.closed \
            else self.control
        if target is not None and not target.closed:
            self._send(target, reply)
            self._drain_writes(target, 2.0)
        node_conns = [c for conns in self.node_conns.values() for c in conns]
        for c in list(self.rank_conns.values()) + node_conns + list(self.pending):
            self._close(c)
        if self.control is not None:
            self._close(self.control)
        self.done = True

    def _drain_writes(self, c: Conn, timeout: float) -> None:
        end = time.monotonic() + timeout
        while c.out and not c.closed and time.monotonic() < end:
            self._flush(c)
            if c.out:
                time.sleep(0.005)

    def close(self) -> None:
        self.poller.unregister(self.listener.fileno())
        self.listener.close()
        self.poller.close()


__all__ = ["Server", "BindError", "open_listener", "raise_fd_limit", "log", "MAX_HELLO"]
