"""The client side of the wire: one background sender, one blocking link, one backoff.

:class:`TelemetryClient` is a daemon thread that owns one TCP connection. Training ranks use it
(hello kind ``rank``, to their node's relay: step batches from a :class:`RecordSource`, events, a
final ``bye``, answers to requests); each node's relay uses it for its one connection up to the
aggregator (kind ``node``: the relay is its :class:`RecordSource`). What it guarantees to the
process that uses it:

* **never blocks the caller**: :meth:`~TelemetryClient.submit` appends to a deque and returns;
  all socket work (connect, handshake, send, receive) happens on the daemon thread;
* **bounded memory**: at most ``max_frames`` submitted frames wait; step records are bounded by
  the source's own pool; anything beyond is dropped and *counted*, never silently lost;
* **bounded waits**: :meth:`~TelemetryClient.wait_connected` and :meth:`~TelemetryClient.close`
  take a timeout and return within it (plus a few milliseconds);
* **connect, then reconnect** with :class:`Backoff` (exponential, full jitter, so a restarted
  server is not hit by every peer at the same instant); each connection starts with a fresh
  ``hello`` (fresh nonce, so no endpoint's replay check ever refuses a reconnect), then the frames
  ``on_connect`` returns (a relay re-announces its ranks), then what was pending;
* **refused means quiet**: a ``refused`` answer is logged once with the server's reason and the
  client stops trying for the rest of the process (a wrong token does not improve by retrying);
  everything pending is discarded and counted;
* **downstream frames** (``req``) are validated (wire/frames.py) and handed to ``on_frame`` on
  the client thread;
* **exact accounting**: a frame counts as sent once all of its bytes were accepted by the kernel;
  a frame cut by a broken connection is re-sent whole on the next connection (the server discards
  the truncated copy), so the client never loses or duplicates a frame it knows about. Bytes the
  kernel accepted just before the peer died cannot be known to be lost; the receiver finds those
  as gaps in the per-rank ``seq`` numbers.

:class:`Link` is the blocking request/response connection of node 0's launcher (kind
``control``) and of the doctor's agents. Both open a connection with :func:`handshake`.
"""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Protocol, Union

from .auth import make_hello
from .frames import validate
from .protocol import MAX_FRAME, FrameBuffer, ProtocolError, encode

log = logging.getLogger("traceml")

#: the most bytes gathered into one ``send`` round
_SEND_CHUNK = 1 << 20
#: a blocked send wakes this often to check close()'s deadline
_SEND_SLICE = 0.05


class Backoff:
    """Exponential backoff with full jitter: the one retry schedule of every TraceML client."""

    def __init__(self, initial: float = 0.05, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def reset(self) -> None:
        self._next = self.initial

    def delay(self) -> float:
        """The next wait: uniform in [d/2, d], then d doubles up to the maximum."""
        d = self._next
        self._next = min(d * 2.0, self.maximum)
        return d * random.uniform(0.5, 1.0)


class RecordSource(Protocol):
    """Where step batches come from (the SDK's recorder, a relay's outgoing queue).

    ``ready`` says how many batches wait; ``pop`` returns the oldest or ``None``; the client then either ``recycle``s it
    (sent), ``unpop``s it (connection broke before it was fully sent; it goes back to the front)
    or ``discard``s it (refused / shutdown deadline; the source counts the records as lost).
    ``lost`` is the source's total of records known lost (its own drops plus discards).
    """

    def ready(self) -> int: ...
    def pop(self) -> Optional[Any]: ...
    def unpop(self, batch: Any) -> None: ...
    def frame(self, batch: Any) -> Union[dict[str, Any], bytes]: ...  # bytes: already encoded
    def records(self, batch: Any) -> int: ...
    def recycle(self, batch: Any) -> None: ...
    def discard(self, batch: Any) -> None: ...
    @property
    def lost(self) -> int: ...


@dataclass
class ClientStats:
    """The client's counters (:meth:`TelemetryClient.stats`: a copy for tests, logs and the summary)."""

    kind: str = "rank"
    connected: bool = False
    connects: int = 0                # successful handshakes (1 + reconnects)
    connect_failures: int = 0        # attempts that did not end in a welcome
    refused: Optional[str] = None    # the server's reason, once refused
    frames_sent: int = 0             # all frames fully handed to the kernel (steps, system, event, bye)
    records_sent: int = 0            # step records inside the sent ``steps`` frames
    frames_dropped: int = 0          # submitted frames dropped (queue full, refused, unencodable, deadline)
    records_lost: int = 0            # step records known lost (source drops + discards)
    bytes_sent: int = 0
    bye_sent: bool = False
    last_error: Optional[str] = None


@dataclass(frozen=True)
class ClientConfig:
    """Where a :class:`TelemetryClient` connects, who it says it is (its hello), and its pace."""

    host: str
    port: int
    token: str
    #: the hello: the endpoint it is for (``wire.auth.relay_aud``...), the run and who this is
    aud: str
    run: str
    job: Optional[str] = None
    node: int = 0
    rank: int = -1
    kind: str = "rank"
    world: int = 0
    #: this machine's name in the hello (None: socket.gethostname())
    hostname: Optional[str] = None
    extra: Optional[dict[str, Any]] = None
    #: submitted frames that may wait; beyond, they are dropped and counted
    max_frames: int = 1024
    poll_interval: float = 0.1
    connect_timeout: float = 2.0
    handshake_timeout: float = 5.0
    #: a server that accepts nothing this long is treated as gone
    send_timeout: float = 10.0
    backoff_initial: float = 0.05
    backoff_max: float = 5.0
    #: the thread's name, and how log lines name the server
    name: str = "traceml-client"
    peer: str = "the aggregator"
    #: a fixed send buffer (tests: make a stalled server felt sooner)
    sndbuf: Optional[int] = None

    def hello(self) -> dict[str, Any]:
        """A fresh hello (fresh nonce: no endpoint's replay check ever refuses a reconnect)."""
        return make_hello(self.token, aud=self.aud, run=self.run, job=self.job, node=self.node,
                          rank=self.rank, kind=self.kind, world=self.world, extra=self.extra,
                          host=self.hostname if self.hostname is not None else socket.gethostname())


class LinkError(Exception):
    """The server could not be reached or answered wrongly; ``str()`` says what happened."""


class LinkRefused(LinkError):
    """The server refused our hello; ``reason`` is its reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the connection was refused: {reason}")
        self.reason = reason


def handshake(sock: socket.socket, hello: dict[str, Any], frames: FrameBuffer) -> None:
    """Send ``hello`` on a connected socket and read the answer (the socket's timeout bounds the
    wait); returns once welcomed, what came after the welcome left in ``frames``. Raises
    :class:`LinkRefused` with the server's reason, :class:`LinkError` for any other answer, OSError
    or ProtocolError from the connection."""
    sock.sendall(encode(hello))
    while True:
        data = sock.recv(65536)
        if not data:
            raise LinkError("the server closed the connection during the handshake")
        for reply in frames.feed(data):
            if reply.get("t") == "welcome":
                return
            if reply.get("t") == "refused":
                raise LinkRefused(str(reply.get("reason", "no reason given")))
            raise LinkError(f"unexpected answer to hello: {reply.get('t')!r}")


_live_clients: "weakref.WeakSet[TelemetryClient]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker) inherits the socket but not the thread: make every client
    # inert there so nothing in the child ever writes into the parent's connection.
    for client in list(_live_clients):
        client._forked_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class TelemetryClient:
    """Background sender for one process. See the module docstring for the guarantees.

    Typical use (rank)::

        c = TelemetryClient(ClientConfig(relay_host, relay_port, token, aud=relay_aud(node),
                                         run=run, job=job, node=node, rank=rank, world=world,
                                         extra={"local_rank": lr}),
                            source=recorder, on_frame=answer)
        c.start(); c.wait_connected(2.0)
        ...
        c.close(timeout=2.0, bye=lambda: {...})

    ``source`` gives the step batches; ``on_refused`` (the server's reason), ``on_connect`` (the
    frames that go first on each connection) and ``on_frame`` (a checked ``req``) run on the
    client thread.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        source: Optional[RecordSource] = None,
        on_refused: Optional[Callable[[str], None]] = None,
        on_connect: Optional[Callable[[], list[Union[dict[str, Any], bytes]]]] = None,
        on_frame: Optional[Callable[[dict[str, Any]], None]] = None,
    ) -> None:
        self.config = config
        self.host, self.port, self.peer = config.host, int(config.port), config.peer
        self.source = source
        self.backoff = Backoff(config.backoff_initial, config.backoff_max)
        self._on_refused = on_refused
        self._on_connect = on_connect
        self._on_frame = on_frame
        self._down = FrameBuffer(MAX_FRAME)

        self._frames: deque[Union[dict[str, Any], bytes]] = deque()
        self._periodic: list[list[Any]] = []     # [fn, interval_s, next_due]
        self._wake = threading.Event()
        self._settled = threading.Event()        # set on welcome or refusal
        self._thread: Optional[threading.Thread] = None
        self._sock: Optional[socket.socket] = None
        self._poller: Any = None
        self._closing = False
        self._deadline = 0.0
        self._flush_deadline = 0.0
        self._bye: Optional[Union[dict[str, Any], Callable[[], dict[str, Any]]]] = None
        self._dead = False                       # forked child or finished
        self._ended = False                      # the server said the run is over: no reconnect

        self._c = ClientStats(kind=config.kind)
        self._warned_lost = False
        _live_clients.add(self)

    # ---- caller side (never blocks) -----------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self._dead:
            return
        self._thread = threading.Thread(target=self._run, name=self.config.name, daemon=True)
        self._thread.start()

    def submit(self, frame: Union[dict[str, Any], bytes]) -> bool:
        """Queue one frame (``system``, ``event``..., or its encoded bytes). False (and counted) if
        it had to be dropped."""
        if self._dead or self._c.refused is not None or self._closing or len(self._frames) >= self.config.max_frames:
            self._c.frames_dropped += 1
            return False
        self._frames.append(frame)
        return True

    def ending(self) -> None:
        """The run is over: the server will close the connection; do not warn or reconnect then
        (what is still pending at :meth:`close` is discarded and counted)."""
        self._ended = True

    def wake(self) -> None:
        """Ask the thread to send now rather than at its next poll (e.g. a backlog is building)."""
        self._wake.set()

    def add_periodic(self, fn: Callable[[], None], interval_s: float) -> None:
        """Run ``fn`` on the client thread about every ``interval_s`` (cheap work only)."""
        self._periodic.append([fn, float(interval_s), 0.0])

    def wait_connected(self, timeout: float) -> bool:
        """Wait at most ``timeout`` s for the first welcome; True if connected now."""
        if timeout > 0 and not self._dead:
            self._settled.wait(timeout)
        return self._c.connected

    def close(
        self,
        timeout: float = 2.0,
        bye: Optional[Union[dict[str, Any], Callable[[], dict[str, Any]]]] = None,
    ) -> bool:
        """Flush what is pending, send ``bye`` (a frame, or a callable building it at send time so
        its counts are final), and stop, all within ``timeout`` seconds. Whatever could not be sent
        in time is discarded and counted. Returns True if everything, bye included, was sent.
        Safe to call twice and from ``atexit``."""
        if self._dead:
            return False
        thread = self._thread
        self._bye = bye
        timeout = max(0.0, timeout)
        self._deadline = time.monotonic() + timeout
        # keep the last part of the window for the bye, so a slow flush still ends with one
        self._flush_deadline = self._deadline - min(0.25, timeout / 4)
        self._closing = True
        self._wake.set()
        if thread is None:
            self._discard_all()
            self._dead = True
            return False
        if thread is not threading.current_thread():
            thread.join(max(0.0, timeout) + 0.5)
        ok = not thread.is_alive() and self._c.bye_sent == (bye is not None) and not self._frames
        return ok

    # ---- counters -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._c.connected

    @property
    def refused_reason(self) -> Optional[str]:
        return self._c.refused

    def stats(self) -> ClientStats:
        return replace(self._c, records_lost=self.source.lost if self.source is not None else 0)

    # ---- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_attempt = 0.0
        close_attempted = False
        try:
            while True:
                now = time.monotonic()
                self._run_periodic(now)
                if self._c.refused is not None:
                    self._discard_all()
                    if self._closing:
                        return
                    self._sleep(0.5)
                    continue
                if self._sock is None and self._ended:
                    self._discard_all()
                    if self._closing:
                        return
                    self._sleep(0.5)
                    continue
                if self._sock is None:
                    if self._closing:
                        # one last attempt inside the deadline (for what is pending, or just
                        # the bye: it is how the aggregator tells a clean end from a crash)
                        left = self._deadline - now
                        if close_attempted or left <= 0 or (
                                not self._has_pending() and self._bye is None):
                            return
                        close_attempted = True
                        self._connect(min(self.config.connect_timeout, left))
                        if self._sock is None:
                            return
                    elif now >= next_attempt:
                        if self._connect(self.config.connect_timeout):
                            self.backoff.reset()
                        else:
                            next_attempt = time.monotonic() + self.backoff.delay()
                    if self._sock is None:
                        self._sleep(max(0.0, min(self.config.poll_interval, next_attempt - time.monotonic())))
                        continue
                if not self._peer_alive():
                    self._lost_connection(f"{self.peer} closed the connection")
                    continue
                self._pump()
                if self._closing:
                    if self._sock is None:
                        continue    # the connection broke mid-flush: one reconnect attempt above
                    if not self._has_pending() or time.monotonic() >= self._flush_deadline:
                        self._discard_all()     # counted; the bye then carries final numbers
                        self._send_bye()
                        return
                    continue
                self._sleep(self.config.poll_interval)
        except Exception as exc:  # the thread must never die noisily inside a user's job
            self._c.last_error = f"client thread: {type(exc).__name__}: {exc}"
            log.warning("traceml: telemetry client stopped after an internal error: %s", exc)
        finally:
            self._discard_all()
            self._drop_socket()
            self._c.connected = False
            self._dead = True
            self._settled.set()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and not self._closing:
            self._wake.wait(seconds)
            self._wake.clear()

    def _run_periodic(self, now: float) -> None:
        for entry in self._periodic:
            if now >= entry[2]:
                entry[2] = now + entry[1]
                try:
                    entry[0]()
                except Exception:
                    pass

    def _has_pending(self) -> bool:
        src = self.source
        return bool(self._frames) or (src is not None and src.ready() > 0)

    # ---- connection ---------------------------------------------------------------------------

    def _connect(self, timeout: float) -> bool:
        sock: Optional[socket.socket] = None
        try:
            sock = socket.create_connection((self.host, self.port), timeout=max(0.01, timeout))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.config.sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.sndbuf)
            hs_timeout = self.config.handshake_timeout
            if self._closing:
                hs_timeout = min(hs_timeout, max(0.01, self._deadline - time.monotonic()))
            sock.settimeout(hs_timeout)
            self._down = FrameBuffer(MAX_FRAME)
            handshake(sock, self.config.hello(), self._down)
            sock.settimeout(_SEND_SLICE)
            self._sock = sock
            if hasattr(select, "poll"):
                self._poller = select.poll()
                self._poller.register(sock, select.POLLIN | select.POLLPRI)
            self._c.connected = True
            self._c.connects += 1
            if self._on_connect is not None:
                try:
                    first = self._on_connect()
                except Exception as exc:
                    first = []
                    self._c.last_error = f"on_connect: {exc}"
                for frame in reversed(first):
                    self._frames.appendleft(frame)
            self._settled.set()
            if self._down.pending:
                self._handle_down(b"")   # a bad frame shows again at the next read
            return True
        except LinkRefused as exc:
            self._refuse(exc.reason)
        except (OSError, ProtocolError, LinkError) as exc:
            self._c.last_error = f"{type(exc).__name__}: {exc}"
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        self._c.connect_failures += 1
        return False

    def _refuse(self, reason: str) -> None:
        self._c.refused = reason
        log.warning(
            "traceml: %s at %s:%d refused this %s: %s -- telemetry is off for this "
            "process (training continues)", self.peer, self.host, self.port, self.config.kind, reason,
        )
        if self._on_refused is not None:
            try:
                self._on_refused(reason)
            except Exception:
                pass
        self._settled.set()      # after the callback: a waiter sees the refusal fully applied

    def _peer_alive(self) -> bool:
        """Read what the server sent (``req`` frames, a late ``refused``); False once it closed."""
        sock = self._sock
        if sock is None:
            return False
        while True:
            # a zero-timeout readiness check (not recv(MSG_DONTWAIT): on a socket with a timeout,
            # Python waits for readability *before* calling recv, i.e. it would block)
            try:
                readable = (select.select([sock], [], [], 0)[0] if self._poller is None
                            else self._poller.poll(0))
            except (OSError, ValueError):
                return True
            if not readable:
                return True
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError, socket.timeout):
                return True
            except OSError as exc:
                self._c.last_error = f"{type(exc).__name__}: {exc}"
                return False
            if not data:
                return False
            if not self._handle_down(data):
                return False

    def _handle_down(self, data: bytes) -> bool:
        try:
            for msg in self._down.feed(data):
                if msg.get("t") == "refused":
                    self._drop_socket()
                    self._refuse(str(msg.get("reason", "no reason given")))
                    return False
                checked = validate("down", msg)
                if checked is not None and self._on_frame is not None:
                    self._on_frame(checked)
        except ProtocolError as exc:
            self._c.last_error = f"bad frame from the server: {exc}"
            return False
        return True

    def _lost_connection(self, why: str) -> None:
        self._drop_socket()
        if self._c.refused is None and not self._warned_lost and not self._closing and not self._ended:
            self._warned_lost = True
            log.warning(
                "traceml: lost the connection to %s at %s:%d (%s); reconnecting in the "
                "background -- steps are buffered, and counted as lost if the buffer fills",
                self.peer, self.host, self.port, why,
            )

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        self._c.connected = False
        self._poller = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _forked_child(self) -> None:
        self._dead = True
        self._closing = True
        sock, self._sock = self._sock, None
        self._thread = None
        if sock is not None:
            try:
                sock.detach()   # never close/shutdown: the parent still owns the connection
            except OSError:
                pass

    # ---- sending ------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Send everything pending, in rounds of at most ~1 MiB."""
        while self._sock is not None:
            items: list[tuple[str, Any, int, int]] = []   # (kind, obj, records, end offset)
            chunks: list[bytes] = []
            size = 0
            while size < _SEND_CHUNK and self._frames:
                frame = self._frames.popleft()
                try:
                    data = frame if type(frame) is bytes else encode(frame)  # type: ignore[arg-type]
                except Exception as exc:
                    self._c.frames_dropped += 1
                    self._c.last_error = f"unencodable {frame.get('t')!r} frame: {exc}"  # type: ignore[union-attr]
                    continue
                chunks.append(data)
                size += len(data)
                items.append(("frame", frame, 0, size))
            src = self.source
            while src is not None and size < _SEND_CHUNK:
                batch = src.pop()
                if batch is None:
                    break
                try:
                    f = src.frame(batch)
                    data = f if type(f) is bytes else encode(f)  # type: ignore[arg-type]
                except Exception as exc:
                    self._c.last_error = f"unencodable steps frame: {exc}"
                    src.discard(batch)
                    continue
                chunks.append(data)
                size += len(data)
                items.append(("batch", batch, src.records(batch), size))
            if not items:
                return
            sent, err = self._send(b"".join(chunks))
            requeue: list[tuple[str, Any]] = []
            for kind, obj, nrec, end in items:
                if end <= sent:
                    self._c.frames_sent += 1
                    if kind == "batch":
                        self._c.records_sent += nrec
                        src.recycle(obj)  # type: ignore[union-attr]
                else:
                    requeue.append((kind, obj))
            for kind, obj in reversed(requeue):
                if kind == "batch":
                    src.unpop(obj)  # type: ignore[union-attr]
                else:
                    self._frames.appendleft(obj)
            if err is not None:
                self._lost_connection(err)
                return

    def _send(self, data: bytes) -> tuple[int, Optional[str]]:
        """Send ``data``; returns (bytes accepted by the kernel, error or None).

        The socket waits in short slices so that a server which stops reading cannot hold this
        thread past ``close()``'s deadline; a server that accepts nothing for ``send_timeout``
        seconds is treated as gone."""
        sock = self._sock
        assert sock is not None
        view = memoryview(data)
        sent = 0
        stalled_since = time.monotonic()
        try:
            while sent < len(data):
                try:
                    n = sock.send(view[sent:])
                except socket.timeout:
                    now = time.monotonic()
                    if self._closing and now >= self._deadline:
                        return sent, f"close deadline reached while {self.peer} was not reading"
                    if now - stalled_since >= self.config.send_timeout:
                        return sent, f"{self.peer} accepted nothing for {self.config.send_timeout:.0f}s"
                    continue
                if n <= 0:
                    return sent, "send returned 0"
                sent += n
                self._c.bytes_sent += n
                stalled_since = time.monotonic()
        except OSError as exc:
            self._c.last_error = f"{type(exc).__name__}: {exc}"
            return sent, f"{type(exc).__name__}: {exc}"
        return sent, None

    def _send_bye(self) -> None:
        bye = self._bye
        if bye is None or self._sock is None:
            return
        try:
            frame = bye() if callable(bye) else bye
            sent, err = self._send(encode(frame))
        except Exception as exc:
            self._c.last_error = f"bye: {exc}"
            return
        if err is None:
            self._c.frames_sent += 1
            self._c.bye_sent = True

    def _discard_all(self) -> None:
        while self._frames:
            try:
                self._frames.popleft()
            except IndexError:
                break
            self._c.frames_dropped += 1
        src = self.source
        if src is None:
            return
        while True:
            batch = src.pop()
            if batch is None:
                return
            src.discard(batch)


# --- the blocking link ------------------------------------------------------------------------------
class Link:
    """A blocking framed connection for request/response outside any hot path: node 0's launcher
    (kind ``control``: ``finish``/``query``/``snapshot``) and the doctor's agents."""

    def __init__(self, sock: socket.socket, name: str = "?", data: bytes = b"") -> None:
        self.sock = sock
        self.name = name
        self._frames = FrameBuffer(MAX_FRAME)
        self.ready: deque[dict[str, Any]] = deque(self._frames.feed(data) if data else ())
        self.closed = False
        self._req_id = 0

    @classmethod
    def connect(cls, host: str, port: int, hello: Callable[[], dict[str, Any]], *,
                timeout: float = 5.0, wait_s: float = 0.0, name: str = "?") -> "Link":
        """Connect and complete the handshake (``hello()`` builds a fresh hello per attempt),
        retrying refused TCP connects with :class:`Backoff` for ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError as exc:
                delay = backoff.delay()
                if time.monotonic() + delay > deadline:
                    raise LinkError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
                time.sleep(delay)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        link = cls(sock, name)
        try:
            sock.settimeout(timeout)
            handshake(sock, hello(), link._frames)
        except (OSError, ProtocolError, LinkError) as exc:
            link.close()
            if isinstance(exc, LinkError):
                raise
            raise LinkError(f"no welcome from {host}:{port}: {exc}") from None
        link.ready.extend(link._frames.feed(b""))
        return link

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.settimeout(10.0)
            self.sock.sendall(encode(msg))
        except OSError as exc:
            self.closed = True
            raise LinkError(f"lost the connection: {exc}") from None

    def pump(self) -> None:
        """Read what is available now (the socket is readable) into :attr:`ready`."""
        self.sock.settimeout(0.0)
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        try:
            self.ready.extend(self._frames.feed(data))
        except ProtocolError:
            self.closed = True

    def recv(self, timeout: float) -> dict[str, Any]:
        """The next frame; raises :class:`LinkError` on timeout or a closed connection."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError(f"no answer within {timeout:.1f} s")
            if self.closed:
                raise LinkError("the connection is closed")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as exc:
                self.closed = True
                raise LinkError(f"lost the connection: {exc}") from None
            if not data:
                self.closed = True
                raise LinkError("the server closed the connection")
            try:
                self.ready.extend(self._frames.feed(data))
            except ProtocolError as exc:
                self.closed = True
                raise LinkError(f"bad frame from the server: {exc}") from None
        return self.ready.popleft()

    def request(self, msg: dict[str, Any], want: str, timeout: float) -> dict[str, Any]:
        """Send ``msg`` with a fresh ``id``; the ``want`` reply carrying that id (replies to
        earlier, timed-out requests are skipped)."""
        self._req_id += 1
        rid = self._req_id
        self.send({**msg, "id": rid})
        deadline = time.monotonic() + timeout
        while True:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
            if reply.get("t") == want and reply.get("id", rid) == rid:
                return reply

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
