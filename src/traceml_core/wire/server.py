"""The one framed server: what every TraceML listener does before and around its own logic.

Used by the aggregator (node 0), each node's relay, the doctor's coordinator and the test sink.
A :class:`Handler` supplies the endpoint's rules (who may connect, what a frame does); this module
owns everything a listener exposed to a network must get right once:

* **accept** in batches from a non-blocking listener; on fd exhaustion (EMFILE/ENFILE) evict the
  oldest unauthenticated connection, or stop listening for a second: never spin;
* **before the hello**: at most :attr:`Limits.max_pending` connections wait, each for at most
  :attr:`Limits.hello_timeout_s`, and at most :data:`~.protocol.MAX_HELLO` bytes are read or held
  from one (a length prefix over it closes the connection); past the pending cap the oldest is
  evicted, so a flood of idle or trickling sockets costs bounded memory and cannot lock real peers
  out: memory before authentication is at most ``max_pending x (MAX_HELLO + ~2 KiB)``;
* **after it**: frames up to :data:`~.protocol.MAX_FRAME`; the bytes held in partial frames over all
  connections are capped (:attr:`Limits.max_buffered`), and so is each connection's write queue
  (:attr:`Limits.max_out`); undecodable bytes, a bad frame or a closed peer end that connection only;
* **logging**: every per-connection event (refused, malformed, hello timeout, evicted, overload)
  is counted exactly in ``counters`` and logged through :class:`EventLog`, which writes the first
  few of each kind and then one line per thousand, with the running count: a flood of 20,000
  connections writes a few dozen lines, not 20,000.

Nothing a peer sends can raise out of :meth:`FramedServer.step`.
"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

from .auth import Identity
from .framing import split_frames
from .poller import READ, WRITE, Poller
from .protocol import MAX_FRAME, MAX_HELLO, PROTOCOL_VERSION, RECV_SIZE, ProtocolError, encode

#: per-connection event counters every server keeps (the aggregator's summary reports them)
SERVER_COUNTERS = (
    "connections",          # TCP connections accepted
    "refused",              # hellos refused (bad token, run, version, replay, ...)
    "malformed",            # connections closed (or relayed frames skipped) for a bad frame
    "handshake_timeouts",   # connections that sent no complete hello in time (slowloris)
    "evicted",              # unauthenticated connections dropped: too many pending, or out of fds
    "overload",             # connections cut because buffers or a write queue were full
    "ignored_frames",       # frames of a type this connection does not send (newer peer), skipped
    "replaced",             # connections superseded by a reconnect of the same peer
)


@dataclass(frozen=True)
class Limits:
    hello_timeout_s: float = 10.0
    max_pending: int = 1024
    #: bytes held in partial frames over all authenticated connections
    max_buffered: int = 512 * 1024 * 1024
    #: bytes queued for sending on one connection
    max_out: int = 64 * 1024 * 1024
    #: seconds the listener pauses when the process is out of file descriptors
    fd_pause_s: float = 1.0


class EventLog:
    """Rate-limited log lines per event kind: the first ``first``, then every ``every``-th."""

    def __init__(self, emit: Callable[[str], None], first: int = 20, every: int = 1000) -> None:
        self.emit = emit
        self.first = first
        self.every = every
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str, text: str) -> None:
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        if n <= self.first:
            self.emit(text + (" (further such lines are rate-limited)" if n == self.first else ""))
        elif n % self.every == 0:
            self.emit(f"{text} ({n:,} {kind} so far)")


class Conn:
    """One accepted connection. ``ident`` is set once its hello is accepted; ``user`` is the
    handler's own per-connection object."""

    __slots__ = ("sock", "fd", "addr", "buf", "out", "ident", "deadline", "closed", "user",
                 "wants_write", "held")

    def __init__(self, sock: socket.socket, addr: Any, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.buf = bytearray()
        self.out = bytearray()
        self.ident: Optional[Identity] = None
        self.deadline = deadline
        self.closed = False
        self.user: Any = None
        self.wants_write = False
        self.held = 0   # len(buf) as counted in the server's ``buffered`` (authenticated only)

    def label(self) -> str:
        a = self.addr
        peer = f"{a[0]}:{a[1]}" if isinstance(a, tuple) and len(a) >= 2 else str(a or "?")
        return f"{self.ident.label()} from {peer}" if self.ident is not None else f"connection from {peer}"


class Handler(Protocol):
    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Union[Identity, str]:
        """The connection's identity, or the reason to refuse it (sent to the peer)."""

    def on_accept(self, conn: Conn) -> None:
        """Called after ``welcome`` was queued."""

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        """One frame after the hello (``data[off:end]`` is its raw bytes, header included).
        Raise :class:`ProtocolError` to close the connection as malformed."""

    def on_close(self, conn: Conn) -> None:
        """An accepted connection ended (either side)."""


class FramedServer:
    def __init__(self, listener: socket.socket, handler: Handler, *, counters: dict[str, int],
                 log: Callable[[str], None], limits: Limits = Limits(), name: str = "server",
                 poller: Optional[Poller] = None) -> None:
        self.listener = listener
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self.handler = handler
        self.limits = limits
        self.counters = counters
        for key in SERVER_COUNTERS:
            counters.setdefault(key, 0)
        self.log = log
        self.events = EventLog(log)
        self.name = name
        self.prefix = f"{name}: " if name else ""
        self.poller = poller or Poller()
        self.poller.register(listener.fileno(), READ, self)
        self.pending: dict[Conn, None] = {}   # waiting for their hello, oldest first
        self.conns: set[Conn] = set()         # accepted
        self.buffered = 0
        self._scratch = bytearray(RECV_SIZE)
        self._view = memoryview(self._scratch)
        self._paused_until: Optional[float] = None
        self._extra: dict[int, Callable[[bool, bool], None]] = {}
        self.closed = False

    # --- the loop ----------------------------------------------------------------------------
    def add_fd(self, fd: int, callback: Callable[[bool, bool], None], events: int = READ) -> None:
        """Serve another file descriptor in the same loop (a wake-up pipe, an upstream socket):
        ``callback(readable, writable)``."""
        self._extra[fd] = callback
        self.poller.register(fd, events, callback)

    def modify_fd(self, fd: int, events: int) -> None:
        self.poller.modify(fd, events)

    def remove_fd(self, fd: int) -> None:
        self._extra.pop(fd, None)
        self.poller.unregister(fd)

    def step(self, timeout: float) -> None:
        """Serve what is ready (at most ``timeout`` s of waiting), then expire late hellos."""
        for obj, readable, writable in self.poller.poll(timeout):
            if obj is self:
                self._accept()
            elif type(obj) is Conn:
                if readable and not obj.closed:
                    self._read(obj)
                if writable and not obj.closed:
                    self._flush(obj)
            else:
                obj(readable, writable)
        self.expire(time.monotonic())

    def expire(self, now: float) -> None:
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self.poller.register(self.listener.fileno(), READ, self)
        while self.pending:
            c = next(iter(self.pending))
            if c.deadline > now:
                break
            self.counters["handshake_timeouts"] += 1
            self.events("handshake_timeouts", f"{self.prefix}closing {c.label()}: no complete hello "
                        f"within {self.limits.hello_timeout_s:.0f} s")
            self.close(c)

    # --- connections -------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self.pending:  # make room: drop the oldest unauthenticated peer
                        self.counters["evicted"] += 1
                        self.events("evicted", f"{self.prefix}out of file descriptors: dropping the "
                                    "oldest connection still waiting for its hello")
                        self.close(next(iter(self.pending)))
                        continue
                    # nothing to drop: stop accepting for a moment instead of spinning on it
                    self.events("fd_pause", f"{self.prefix}out of file descriptors: not accepting "
                                f"new connections for {self.limits.fd_pause_s:g} s")
                    self.poller.unregister(self.listener.fileno())
                    self._paused_until = time.monotonic() + self.limits.fd_pause_s
                    return
                self.events("accept_error", f"{self.prefix}accept failed: {exc}")
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.counters["connections"] += 1
            if len(self.pending) >= self.limits.max_pending:
                self.counters["evicted"] += 1
                old = next(iter(self.pending))
                self.events("evicted", f"{self.prefix}more than {self.limits.max_pending} connections "
                            f"waiting for their hello: dropping the oldest ({old.label()})")
                self.close(old)
            c = Conn(sock, addr, time.monotonic() + self.limits.hello_timeout_s)
            self.pending[c] = None
            self.poller.register(c.fd, READ, c)

    def close(self, c: Conn) -> None:
        """Close one connection (the handler hears of an accepted one through ``on_close``)."""
        if c.closed:
            return
        c.closed = True
        self.buffered -= c.held
        c.held = 0
        c.buf = bytearray()
        c.out = bytearray()
        self.pending.pop(c, None)
        self.poller.unregister(c.fd)
        try:
            c.sock.close()
        except OSError:
            pass
        if c in self.conns:
            self.conns.discard(c)
            try:
                self.handler.on_close(c)
            except Exception as exc:  # the handler's bug must not take the loop down
                self.log(f"{self.prefix}internal error closing {c.label()}: {type(exc).__name__}: {exc}")

    def detach(self, c: Conn, timeout: float = 2.0) -> tuple[socket.socket, bytes]:
        """Hand an accepted connection over to blocking code (the doctor's request/response
        phases): its socket, in blocking mode, and the bytes already read past the last frame.
        Its write queue is flushed first (at most ``timeout``)."""
        self.drain_writes(c, timeout)
        self.conns.discard(c)
        self.poller.unregister(c.fd)
        self.buffered -= c.held
        c.held = 0
        rest, c.buf = bytes(c.buf), bytearray()
        c.closed = True
        c.sock.setblocking(True)
        return c.sock, rest

    def malformed(self, c: Conn, why: str) -> None:
        self.counters["malformed"] += 1
        self.events("malformed", f"{self.prefix}closing {c.label()}: {why}")
        self.close(c)

    def close_all(self) -> None:
        for c in list(self.pending) + list(self.conns):
            self.close(c)
        for fd in list(self._extra):
            self.remove_fd(fd)
        if not self.closed:
            self.closed = True
            self.poller.unregister(self.listener.fileno())
            try:
                self.listener.close()
            except OSError:
                pass

    # --- sending -----------------------------------------------------------------------------
    def send(self, c: Conn, msg: dict[str, Any]) -> None:
        self.send_raw(c, encode(msg))

    def send_raw(self, c: Conn, data: bytes) -> None:
        if c.closed:
            return
        if c.out:
            if len(c.out) + len(data) > self.limits.max_out:
                self.counters["overload"] += 1
                self.events("overload", f"{self.prefix}closing {c.label()}: it does not read "
                            f"(more than {self.limits.max_out >> 20} MiB queued)")
                self.close(c)
                return
            c.out += data
            return
        try:
            sent = c.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close(c)
            return
        if sent < len(data):
            c.out += data[sent:]
            c.wants_write = True
            self.poller.modify(c.fd, READ | WRITE)

    def _flush(self, c: Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close(c)
            return
        del c.out[:sent]
        if not c.out and c.wants_write:
            c.wants_write = False
            self.poller.modify(c.fd, READ)

    def drain_writes(self, c: Conn, timeout: float) -> None:
        """Block (at most ``timeout``) until ``c``'s write queue is empty (used at the very end)."""
        end = time.monotonic() + timeout
        while c.out and not c.closed and time.monotonic() < end:
            self._flush(c)
            if c.out:
                time.sleep(0.005)

    # --- reading -----------------------------------------------------------------------------
    def _read(self, c: Conn) -> None:
        try:
            got = c.sock.recv_into(self._scratch, RECV_SIZE if c.ident is not None else MAX_HELLO + 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close(c)
            return
        if not got:
            self.close(c)
            return
        authed = c.ident is not None
        why = split_frames(c, self._view, got, MAX_FRAME if authed else MAX_HELLO, self._on_frame)
        if why is not None:
            if c.ident is None:
                self.counters["refused"] += 1
                self.events("refused", f"{self.prefix}refused {c.label()}: {why}")
                self.close(c)
            else:
                self.malformed(c, why)
            return
        if c.closed or c.ident is None:
            return
        held = len(c.buf)
        self.buffered += held - c.held
        c.held = held
        if c.buf and self.buffered > self.limits.max_buffered:
            self.counters["overload"] += 1
            self.events("overload", f"{self.prefix}closing {c.label()}: buffers full "
                        f"({self.buffered:,} bytes held in partial frames)")
            self.close(c)

    def _on_frame(self, c: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> int:
        if c.ident is None:
            return MAX_FRAME if self._hello(c, msg) else 0
        try:
            self.handler.on_frame(c, msg, data, off, end)
        except ProtocolError as exc:
            self.malformed(c, str(exc))
            return 0
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError) as exc:
            self.malformed(c, f"bad {str(msg.get('t'))[:20]!r} frame "
                              f"({type(exc).__name__}: {str(exc)[:120]})")
            return 0
        return 0 if c.closed else MAX_FRAME

    def _hello(self, c: Conn, msg: dict[str, Any]) -> bool:
        try:
            result = self.handler.on_hello(c, msg)
        except Exception as exc:
            result = f"bad hello ({type(exc).__name__})"
        if isinstance(result, str):
            self.counters["refused"] += 1
            self.events("refused", f"{self.prefix}refused {c.label()}: {result}")
            try:  # best effort, never blocking: the peer may not read
                c.sock.send(encode({"t": "refused", "reason": result}))
            except OSError:
                pass
            self.close(c)
            return False
        self.pending.pop(c, None)
        c.ident = result
        self.conns.add(c)
        self.send(c, {"t": "welcome", "v": PROTOCOL_VERSION, "server_time": time.time()})
        if c.closed:
            return False
        self.handler.on_accept(c)
        return not c.closed


class Waker:
    """Wakes a :class:`FramedServer`'s loop from another thread (a socket pair it also serves):
    a relay's client thread has frames from upstream, or a close was asked for."""

    def __init__(self, net: FramedServer) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        net.add_fd(self._r.fileno(), self._drain)

    def wake(self) -> None:
        try:
            self._w.send(b"\0")
        except OSError:
            pass

    def _drain(self, _r: bool, _w: bool) -> None:
        try:
            while self._r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        for s in (self._r, self._w):
            try:
                s.close()
            except OSError:
                pass


def listen(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """A non-blocking listening TCP socket (IPv6 when ``host`` is an IPv6 address). Raises OSError."""
    import ipaddress

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(min(socket.SOMAXCONN, backlog) if socket.SOMAXCONN > 128 else backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
