"""The per-node relay: this node's ranks send to it over loopback; it forwards one stream to node 0.

Why: with thousands of ranks, node 0's aggregator would otherwise hold one connection per rank
and pay its per-frame cost (a wake-up, a ``recv``, a dispatch) for every small batch. Through the
relays its fan-in is the number of nodes, and each ``recv`` carries many ranks' frames, merged.

What it is: a thread of the node's ``traceml run`` launcher with its own epoll loop (the
aggregator's :class:`~traceml_core.aggregator.poller.Poller`), listening on ``127.0.0.1`` on an
ephemeral port that the launcher hands the workers in ``RunInfo``. Guarantees:

* **authentication as at the aggregator**: a rank's ``hello`` goes through the aggregator's own
  :func:`~traceml_core.aggregator.handshake.check_hello` (version, run, kind, HMAC, freshness,
  nonce replay, job, node and rank ranges); the relay further accepts only kind ``rank`` of its
  own node. Once accepted, every frame on that connection must name that rank
  (:func:`~.relayframes.check_rank_frame`); a frame that does not closes that rank's connection
  only;
* **rank identity and endings survive the hop**: the relay announces each accepted rank
  (``join``), forwards its frames in order, and reports the end of its connection (``gone``,
  after its ``bye`` or without one: a crash); see the relay frames in wire/protocol.py;
* **bounded memory, exact loss**: the bytes it holds (waiting to be merged, or to be sent) are
  capped by ``budget_bytes``; beyond it incoming ``steps`` frames are dropped and counted per
  rank, and the counts (with the end of the ``seq`` range the rank produced) go upstream in
  ``dropped``/``gone`` frames as soon as the upstream can take them, so the summary's loss counts
  them; ranks are never slowed: the relay always reads them;
* **one stream up, re-established**: on node k > 0 the relay owns the node's ``node`` link (the
  launcher's ``system`` frames and final ``bye`` go through it, after every rank's frames); if it
  breaks the relay reconnects in the background with backoff, re-sends a frame cut in the middle
  whole, and re-announces its connected ranks (the aggregator counts any overlap as duplicates).
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import msgpack

from ..aggregator.control import LinkRefused
from ..aggregator.handshake import NonceCache, check_hello
from ..aggregator.poller import READ, WRITE, Poller
from ..aggregator.settings import AggregatorSettings
from ..wire.framing import split_frames
from ..wire.protocol import HEADER, MAX_FRAME, MAX_HELLO, PROTOCOL_VERSION, RECV_SIZE, encode
from .relayframes import check_rank_frame, encode_frame, merge_into, steps_frame

log = logging.getLogger("traceml.relay")

#: default cap on the bytes the relay holds for its upstream (per node)
DEFAULT_BUDGET = 64 * 1024 * 1024
#: frames of a rank wait this long to be merged before they go upstream (the added latency). A
#: second: multi-node runs are summary-only, and bigger frames are what makes node 0's aggregator
#: cheap per record (benchmarks/README.md); live views (one node) use LIVE_FLUSH_S
FLUSH_S = 1.0
LIVE_FLUSH_S = 0.1
#: ... or until this many bytes wait
FLUSH_BYTES = 1 << 20
SEND_CHUNK = 1 << 20
MAX_IOV = 512
HANDSHAKE_TIMEOUT_S = 10.0
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0

_STEPS, _RAW, _JOIN, _GONE = range(4)
_unpackb = msgpack.unpackb
_unpack_header = HEADER.unpack_from
_LISTENER = object()
_WAKE = object()
_UP = object()


@dataclass(frozen=True)
class RelayStats:
    """Counters of one relay (the launcher logs them; tests read them)."""

    ranks_connected: int
    ranks_seen: int
    records_in: int          # step records received from ranks
    records_forwarded: int   # ... handed to the upstream socket in full frames
    frames_in: int           # steps frames received from ranks
    frames_forwarded: int    # steps frames handed to the upstream socket (fewer: merged)
    records_dropped: int     # ... dropped because the byte budget was full (reported upstream)
    records_unsent: int      # ... still held when the relay closed (upstream gone at the end)
    events_dropped: int
    malformed: int           # rank connections closed for a bad frame
    refused: int             # rank hellos refused
    upstream_connects: int
    upstream_connected: bool
    upstream_refused: Optional[str]
    queued_bytes: int
    peak_queued_bytes: int


class _Lane:
    """One rank as the relay sees it: its current connection and what waits to go upstream."""

    __slots__ = ("rank", "conn", "items", "seen_end", "dropped", "reported", "host", "pid",
                 "local_rank")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.conn: Optional[_RankConn] = None
        self.items: list[tuple[int, Any, Optional[bytes], int]] = []  # (kind, msg, raw, size)
        self.seen_end = 0  # seq after the last record received from the rank (kept or dropped)
        self.dropped = 0   # records dropped here (cumulative)
        self.reported = 0  # ... of which the upstream has been told
        self.host = ""
        self.pid: Optional[int] = None
        self.local_rank: Optional[int] = None

    def join_frame(self, new: bool) -> dict[str, Any]:
        return {"t": "join", "rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                "pid": self.pid, "new": new}

    def loss_frame(self, t: str) -> dict[str, Any]:
        self.reported = self.dropped
        return {"t": t, "rank": self.rank, "relay_dropped": self.dropped, "seq_end": self.seen_end}


class _RankConn:
    __slots__ = ("sock", "fd", "buf", "lane", "deadline", "closed")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.lane: Optional[_Lane] = None
        self.deadline = deadline
        self.closed = False


class Relay:
    """See the module docstring. ``connect`` opens an authenticated upstream (a socket after the
    aggregator's ``welcome``; it may raise ``LinkRefused``, ``LinkError`` or ``OSError``) and is
    called on a helper thread; ``upstream`` is an already joined socket to start with."""

    def __init__(self, *, token: str, run_name: str, job_id: Optional[str], node: int, nnodes: int,
                 nproc_per_node: int, connect: Callable[[], socket.socket],
                 upstream: Optional[socket.socket] = None, budget_bytes: int = DEFAULT_BUDGET,
                 flush_s: float = FLUSH_S, bind_host: str = "127.0.0.1", port: int = 0,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self.node = node
        self._warn = warn or (lambda msg: log.warning("traceml: %s", msg))
        self._auth = AggregatorSettings(run_name=run_name, token=token, run_dir=Path("."),
                                        job_id=job_id, nnodes=nnodes, nproc_per_node=nproc_per_node)
        self._nonces = NonceCache()
        self._connect_fn = connect
        self.budget = max(1 << 16, int(budget_bytes))
        self.flush_s = max(0.0, flush_s)
        self.handshake_timeout_s = handshake_timeout_s
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, port))   # 0: any (the task layout fixes it: launcher/task.py)
        self._listener.listen(min(socket.SOMAXCONN, 1024))
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller = Poller()
        self._poller.register(self._listener.fileno(), READ, _LISTENER)
        self._poller.register(self._wake_r.fileno(), READ, _WAKE)
        self._scratch = bytearray(RECV_SIZE)
        self._view = memoryview(self._scratch)

        self._lanes: dict[int, _Lane] = {}
        self._dirty: dict[_Lane, None] = {}
        self._pending_conns: dict[_RankConn, None] = {}
        self._rank_conns: set[_RankConn] = set()
        self._node_items: deque[dict[str, Any]] = deque()   # from other threads (system frames)
        self._outq: deque[list[Any]] = deque()               # [bytes, rank, records]
        self._out_off = 0
        self._pending_bytes = 0   # raw bytes of frames waiting in lanes
        self._out_bytes = 0       # encoded bytes waiting in _outq
        self._next_flush = 0.0

        self._up: Optional[socket.socket] = None
        self._up_wants_write = False
        self._connecting = False
        self._conn_result: deque[Any] = deque()
        self._next_connect = 0.0
        self._backoff = BACKOFF_INITIAL_S
        self._initial_up = upstream

        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._close_deadline = 0.0
        self._bye: Optional[dict[str, Any]] = None
        self._bye_by = 0.0
        self._finished = threading.Event()
        self._drained = threading.Event()
        self._draining = 0

        # counters
        self._records_in = 0
        self._records_forwarded = 0
        self._frames_in = 0
        self._frames_forwarded = 0
        self._records_dropped = 0
        self._records_unsent = 0
        self._events_dropped = 0
        self._malformed = 0
        self._refused = 0
        self._up_connects = 0
        self._up_refused: Optional[str] = None
        self._peak = 0
        self._lost_logged = False
        self._up_ending = False

    # ---- other threads ----------------------------------------------------------------------
    def start(self) -> "Relay":
        if self._initial_up is not None:
            self._adopt(self._initial_up)
            self._initial_up = None
        self._thread = threading.Thread(target=self._run, name=f"traceml-relay-{self.node}",
                                        daemon=True)
        self._thread.start()
        return self

    def submit(self, frame: dict[str, Any]) -> bool:
        """Queue a node-level frame (``system``) for upstream. Never blocks."""
        if self._closing or len(self._node_items) >= 1024:
            return False
        self._node_items.append(frame)
        self._wake()
        return True

    def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every rank connection has closed and everything
        received went to the upstream socket; True if so."""
        self._drained.clear()
        self._draining += 1
        self._wake()
        try:
            return self._drained.wait(timeout)
        finally:
            self._draining -= 1

    def upstream_ending(self) -> None:
        """Node 0, before ``finish``: the aggregator will close this link; do not reconnect."""
        self._up_ending = True

    def close(self, timeout: float = 2.0, bye: Optional[dict[str, Any]] = None) -> RelayStats:
        """Forward what is left, then ``bye`` (the node launcher's own end) last, all within
        ``timeout`` s; then stop. Records still held at the deadline are counted unsent."""
        self._bye = bye
        now = time.monotonic()
        self._close_deadline = now + max(0.0, timeout)
        self._bye_by = now + max(0.0, timeout) / 2
        self._closing = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout) + 1.0)
        return self.stats()

    def stats(self) -> RelayStats:
        return RelayStats(
            ranks_connected=len(self._rank_conns), ranks_seen=len(self._lanes),
            records_in=self._records_in, records_forwarded=self._records_forwarded,
            frames_in=self._frames_in, frames_forwarded=self._frames_forwarded,
            records_dropped=self._records_dropped, records_unsent=self._records_unsent,
            events_dropped=self._events_dropped, malformed=self._malformed, refused=self._refused,
            upstream_connects=self._up_connects, upstream_connected=self._up is not None,
            upstream_refused=self._up_refused, queued_bytes=self._pending_bytes + self._out_bytes,
            peak_queued_bytes=self._peak)

    def dropped_by_rank(self) -> dict[int, int]:
        return {r: ln.dropped for r, ln in self._lanes.items() if ln.dropped}

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                timeout = max(0.0, min(0.05, self._next_flush - time.monotonic())) \
                    if (self._dirty or self._node_items) else 0.05
                for obj, readable, writable in self._poller.poll(timeout):
                    if obj is _LISTENER:
                        self._accept()
                    elif obj is _WAKE:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    elif obj is _UP:
                        if readable:
                            self._read_up()
                        if writable and self._up is not None:
                            self._send_up()
                    elif readable and not obj.closed:
                        self._read(obj)
                now = time.monotonic()
                self._upstream_tick(now)
                self._handshake_timeouts(now)
                urgent = self._closing or self._draining
                if urgent or now >= self._next_flush or self._pending_bytes >= FLUSH_BYTES:
                    self._flush(now)
                if self._up is not None and self._outq:
                    self._send_up()
                if self._draining and not self._rank_conns and not self._pending_conns \
                        and not self._dirty and not self._outq:
                    self._drained.set()
                if self._closing and self._close_done(now):
                    return
        except Exception as exc:  # never take the launcher down; ranks then see a closed relay
            self._warn(f"the node relay stopped after an internal error: {type(exc).__name__}: {exc}")
        finally:
            self._shutdown()

    def _close_done(self, now: float) -> bool:
        if self._bye is not None and (not self._rank_conns or now >= self._bye_by):
            # ranks still connected this late (a stuck process) are reported gone: the node's
            # own bye must reach node 0 before the deadline, and after every rank's frames
            for c in list(self._rank_conns):
                self._close_conn(c)
            self._flush(now)
            self._outq.append([encode(self._bye), -1, 0])
            self._out_bytes += len(self._outq[-1][0])
            self._bye = None
            if self._up is not None:
                self._send_up()
        if now >= self._close_deadline:
            return True
        return not self._rank_conns and not self._dirty and not self._outq and self._bye is None

    def _shutdown(self) -> None:
        unsent = sum(item[2] for item in self._outq)
        for ln in self._lanes.values():
            unsent += sum(msg["n"] for kind, msg, _raw, _size in ln.items if kind == _STEPS)
        self._records_unsent = unsent
        for c in list(self._pending_conns) + list(self._rank_conns):
            self._close_conn(c, report=False)
        self._drop_up(reconnect=False)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        self._poller.close()
        self._finished.set()
        self._drained.set()
        if unsent:
            self._warn(f"the node relay closed with {unsent} step records not forwarded (node 0 "
                       "unreachable at the end)")

    # ---- rank connections ------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._closing:
                sock.close()
                continue
            sock.setblocking(False)
            c = _RankConn(sock, time.monotonic() + self.handshake_timeout_s)
            self._pending_conns[c] = None
            self._poller.register(c.fd, READ, c)

    def _handshake_timeouts(self, now: float) -> None:
        while self._pending_conns:
            c = next(iter(self._pending_conns))
            if c.deadline > now:
                return
            self._close_conn(c)

    def _close_conn(self, c: _RankConn, report: bool = True) -> None:
        if c.closed:
            return
        c.closed = True
        self._pending_conns.pop(c, None)
        self._rank_conns.discard(c)
        self._poller.unregister(c.fd)
        try:
            c.sock.close()
        except OSError:
            pass
        lane = c.lane
        if lane is not None and lane.conn is c:
            lane.conn = None
            if report:
                lane.items.append((_GONE, None, None, 0))
                self._dirty[lane] = None

    def _send_small(self, c: _RankConn, msg: dict[str, Any]) -> None:
        try:
            c.sock.send(encode(msg))
        except OSError:
            pass

    def _read(self, c: _RankConn) -> None:
        try:
            got = c.sock.recv_into(self._scratch)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(c)
            return
        if not got:
            self._close_conn(c)
            return
        why = split_frames(c, self._view, got, MAX_FRAME if c.lane is not None else MAX_HELLO, self._on_frame)
        if why is not None:
            self._bad(c, why)

    def _on_frame(self, c: _RankConn, msg: dict[str, Any], data: Any, off: int, end: int) -> int:
        if c.lane is None:
            return MAX_FRAME if self._hello(c, msg) else 0
        return MAX_FRAME if self._frame(c, c.lane, msg, data, off, end) else 0

    def _bad(self, c: _RankConn, why: str) -> None:
        self._malformed += 1
        who = f"rank {c.lane.rank}" if c.lane is not None else "an unauthenticated connection"
        self._warn(f"node relay: closing {who}: {why}")
        self._close_conn(c)

    def _hello(self, c: _RankConn, msg: dict[str, Any]) -> bool:
        now = time.time()
        if self._up_refused is not None:
            result: Any = f"node 0 refused this node's relay: {self._up_refused}"
        else:
            result = check_hello(msg, self._auth, self._nonces, now)
            if not isinstance(result, str):
                if result.kind != "rank":
                    result = (f"this is node {self.node}'s relay: only training processes connect "
                              f"here (got a {result.kind!r} hello)")
                elif result.node != self.node:
                    result = (f"hello for node {result.node} at node {self.node}'s relay (check "
                              "--node-rank on this node)")
        if isinstance(result, str):
            self._refused += 1
            if self._refused <= 20:
                self._warn(f"node relay refused a connection: {result}")
            self._send_small(c, {"t": "refused", "reason": result})
            self._close_conn(c)
            return False
        self._pending_conns.pop(c, None)
        lane = self._lanes.get(result.rank)
        if lane is None:
            lane = self._lanes[result.rank] = _Lane(result.rank)
        old = lane.conn
        if old is not None and old is not c:
            lane.conn = None       # replaced: the new connection's join says so upstream
            self._close_conn(old, report=False)
        lane.conn = c
        lane.host, lane.pid, lane.local_rank = result.host, result.pid, result.local_rank
        c.lane = lane
        self._rank_conns.add(c)
        lane.items.append((_JOIN, None, None, 0))
        self._dirty[lane] = None
        self._send_small(c, {"t": "welcome", "v": PROTOCOL_VERSION, "server_time": now})
        return not c.closed

    def _frame(self, c: _RankConn, lane: _Lane, msg: dict[str, Any], data: Any, off: int,
               end: int) -> bool:
        err = check_rank_frame(msg, lane.rank, self.node)
        if err is not None:
            self._bad(c, err)
            return False
        t = msg["t"]
        size = end - off
        if t == "steps":
            n = msg["n"]
            last = msg["seq"] + n
            if last > lane.seen_end:
                lane.seen_end = last
            self._records_in += n
            self._frames_in += 1
            queued = self._pending_bytes + self._out_bytes + size
            if queued > self.budget:
                lane.dropped += n
                self._records_dropped += n
                self._dirty[lane] = None
                return True
            lane.items.append((_STEPS, msg, bytes(data[off:end]), size))
        elif t == "event":
            queued = self._pending_bytes + self._out_bytes + size
            if queued > self.budget:
                self._events_dropped += 1
                return True
            lane.items.append((_RAW, None, bytes(data[off:end]), size))
        else:  # bye, system: small, always kept
            lane.items.append((_RAW, None, bytes(data[off:end]), size))
        self._pending_bytes += size
        self._dirty[lane] = None
        q = self._pending_bytes + self._out_bytes
        if q > self._peak:
            self._peak = q
        return True

    # ---- merging and sending ----------------------------------------------------------------
    def _flush(self, now: float) -> None:
        self._next_flush = now + self.flush_s
        out = self._outq
        added = 0
        while self._node_items:
            try:
                data = encode(self._node_items.popleft())
            except Exception:  # an unencodable or oversized sample: skip it
                continue
            out.append([data, -1, 0])
            added += len(data)
        connected = self._up is not None
        for lane in self._dirty:
            cur: Optional[dict[str, Any]] = None  # steps frame being merged
            cur_raw: Optional[bytes] = None       # its bytes while nothing was merged into it
            gone = False
            for kind, msg, raw, size in lane.items:
                self._pending_bytes -= size
                if kind == _STEPS:
                    if cur is not None:
                        if cur_raw is not None:
                            cur = steps_frame(cur)
                        if merge_into(cur, msg):
                            cur_raw = None
                            continue
                        data = cur_raw if cur_raw is not None else encode_frame(cur)
                        out.append([data, lane.rank, cur["n"]])
                        added += len(data)
                    cur, cur_raw = msg, raw
                    continue
                if cur is not None:
                    data = cur_raw if cur_raw is not None else encode_frame(cur)
                    out.append([data, lane.rank, cur["n"]])
                    added += len(data)
                    cur = cur_raw = None
                if kind == _RAW:
                    data = raw  # type: ignore[assignment]
                elif kind == _JOIN:
                    data = encode_frame(lane.join_frame(True))
                else:
                    data = encode_frame(lane.loss_frame("gone"))
                    gone = True
                out.append([data, -1, 0])
                added += len(data)
            if cur is not None:
                data = cur_raw if cur_raw is not None else encode_frame(cur)
                out.append([data, lane.rank, cur["n"]])
                added += len(data)
            lane.items = []
            if not gone and lane.dropped > lane.reported and connected:
                data = encode_frame(lane.loss_frame("dropped"))
                out.append([data, -1, 0])
                added += len(data)
        self._dirty = {}
        self._out_bytes += added

    def _send_up(self) -> None:
        up = self._up
        out = self._outq
        while out and up is not None:
            bufs: list[Any] = []
            total = 0
            for item in itertools.islice(out, MAX_IOV):
                b = item[0]
                if not bufs and self._out_off:
                    b = memoryview(b)[self._out_off:]
                bufs.append(b)
                total += len(b)
                if total >= SEND_CHUNK:
                    break
            try:
                sent = up.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._lost_up(f"{type(exc).__name__}: {exc}")
                return
            left = sent
            while left > 0:
                item = out[0]
                rest = len(item[0]) - self._out_off
                if left >= rest:
                    left -= rest
                    self._out_off = 0
                    out.popleft()
                    self._out_bytes -= len(item[0])
                    if item[2]:
                        self._records_forwarded += item[2]
                        self._frames_forwarded += 1
                else:
                    self._out_off += left
                    left = 0
            if sent < total:
                if not self._up_wants_write:
                    self._up_wants_write = True
                    self._poller.modify(up.fileno(), READ | WRITE)
                return
        if self._up_wants_write and up is not None:
            self._up_wants_write = False
            self._poller.modify(up.fileno(), READ)

    # ---- the upstream -----------------------------------------------------------------------
    def _adopt(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._up = sock
        self._up_wants_write = False
        self._poller.register(sock.fileno(), READ, _UP)
        self._up_connects += 1
        self._backoff = BACKOFF_INITIAL_S
        if self._up_connects > 1:
            self._warn("node relay reconnected to the aggregator")
            # re-announce the ranks connected now, ahead of everything queued
            for lane in sorted(self._lanes.values(), key=lambda ln: -ln.rank):
                if lane.conn is not None:
                    data = encode_frame(lane.join_frame(False))
                    self._outq.appendleft([data, -1, 0])
                    self._out_bytes += len(data)
                if lane.dropped > lane.reported:  # what was dropped while it was gone
                    self._dirty[lane] = None
            self._out_off = 0

    def _read_up(self) -> None:
        up = self._up
        if up is None:
            return
        try:
            data = up.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost_up(f"{type(exc).__name__}: {exc}")
            return
        if not data:
            self._lost_up("the aggregator closed the connection")
            return
        # the aggregator sends nothing after welcome but a late refusal
        try:
            if len(data) > 4:
                msg = _unpackb(data[4:4 + _unpack_header(data, 0)[0]], raw=False)
                if isinstance(msg, dict) and msg.get("t") == "refused":
                    self._up_refused = str(msg.get("reason"))
                    self._lost_up(f"refused: {self._up_refused}")
        except Exception:
            pass

    def _lost_up(self, why: str) -> None:
        if self._up_ending:
            self._drop_up(reconnect=False)
            self._up_refused = "the run finished"
            return
        if not self._lost_logged and not self._closing:
            self._lost_logged = True
            self._warn(f"node relay lost its connection to the aggregator ({why}); reconnecting in "
                       f"the background, holding up to {self.budget >> 20} MB and counting what "
                       "it must drop")
        self._drop_up(reconnect=True)

    def _drop_up(self, reconnect: bool) -> None:
        up, self._up = self._up, None
        if up is not None:
            self._poller.unregister(up.fileno())
            try:
                up.close()
            except OSError:
                pass
        self._out_off = 0  # a frame cut in the middle is re-sent whole
        if reconnect:
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _upstream_tick(self, now: float) -> None:
        while self._conn_result:
            res = self._conn_result.popleft()
            self._connecting = False
            if isinstance(res, socket.socket):
                if self._closing and now >= self._close_deadline:
                    res.close()
                else:
                    self._adopt(res)
            elif isinstance(res, LinkRefused):
                self._up_refused = res.reason
                self._warn(f"node 0's aggregator refused this node's relay: {res.reason}; "
                           "telemetry from this node is off")
            else:
                self._next_connect = now + self._backoff
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        if (self._up is None and not self._connecting and self._up_refused is None
                and now >= self._next_connect
                and not (self._closing and not self._outq and self._bye is None)):
            self._connecting = True
            threading.Thread(target=self._connect_thread, name="traceml-relay-connect",
                             daemon=True).start()

    def _connect_thread(self) -> None:
        try:
            res: Any = self._connect_fn()
        except Exception as exc:
            res = exc
        self._conn_result.append(res)
        self._wake()


__all__ = ["Relay", "RelayStats", "DEFAULT_BUDGET", "FLUSH_S", "LIVE_FLUSH_S"]
