"""The per-node relay: this node's ranks send to it over loopback; it forwards one stream to node 0.

Why: node 0 then holds one connection per node, whatever the number of ranks, and each of its
reads carries many ranks' frames, merged. It is the only route from a rank to the aggregator.

What it is: a thread of the node's ``traceml run`` launcher serving a
:class:`~traceml_core.wire.server.FramedServer` on ``127.0.0.1`` (an ephemeral port the launcher
hands the workers in ``RunInfo``), and a :class:`~traceml_core.wire.client.TelemetryClient` of
kind ``node`` for its one connection up to the aggregator (the relay is that client's
:class:`~traceml_core.wire.client.RecordSource`). Guarantees:

* **the trust boundary for its ranks**: a hello is checked by :func:`~traceml_core.wire.auth.
  check_hello` for endpoint ``relay:<node>`` (kind ``rank`` of this node only); every frame is
  checked once here (:func:`~traceml_core.wire.frames.validate`) and must name the rank whose
  connection carried it; a bad frame closes that rank's connection only;
* **rank identity and endings survive the hop**: it announces each accepted rank (``join``),
  forwards its frames in order, and reports the end of its connection (``gone``, after its ``bye``
  or without one: a crash, with what the rank last said it held unsent);
* **bounded memory, exact loss**: the bytes it holds (waiting to be merged, or to be sent) are
  capped by ``budget_bytes``; beyond it incoming ``steps`` frames are dropped and counted per rank,
  and the counts (with the end of the ``seq`` range the rank produced) go upstream in
  ``dropped``/``gone`` frames, so the summary's loss counts them; ranks are never slowed: the
  relay always reads them;
* **one stream up, re-established**: the client reconnects with its backoff, re-sends a frame cut
  in the middle whole, and first re-announces the connected ranks; on nodes other than 0 it is
  the node's link (the launcher's ``system`` samples and final ``bye`` go through it, the bye last);
* **downstream**: ``req`` frames from the aggregator go to the matching ranks; their ``resp``
  answers come back up like events;
* **a clean end is quiet**: the aggregator says ``end`` before it closes the links after writing
  the summary (node 0's launcher also calls :meth:`Relay.run_ended`), so that close is not logged
  as a lost connection; records that still could not be forwarded are counted and logged as what
  they are: not in the summary.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ..statistics.window import WindowStats
from ..wire.auth import AGGREGATOR, Endpoint, Identity, NonceCache, check_hello, relay_aud
from ..wire.client import ClientConfig, TelemetryClient
from ..wire.fold import fold_frame, tail_frame
from ..wire.frames import bind_rank, validate
from ..wire.protocol import ProtocolError, encode
from ..wire.server import Conn, FramedServer, Handler, Limits, Waker, listen
from .outqueue import OutQueue, Outgoing
from .relayframes import merge_into, steps_frame

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
HANDSHAKE_TIMEOUT_S = 10.0
#: connections that may wait for their hello at a relay (a node runs a handful of ranks; more is
#: hostile): the relay's memory before authentication is at most this x (MAX_HELLO + ~2 KiB)
MAX_PENDING = 256

_STEPS, _RAW, _JOIN, _GONE = range(4)


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
    dropped_untold: int      # dropped records whose count never reached node 0
    events_dropped: int
    malformed: int           # rank connections closed for a bad frame
    refused: int             # rank hellos refused
    upstream_connects: int
    upstream_connected: bool
    upstream_refused: Optional[str]
    queued_bytes: int
    peak_queued_bytes: int
    answers_in: int = 0        # answers to requests (``resp``) received from ranks
    answers_dropped: int = 0   # ... dropped because the byte budget was full (a stack is up to 64 KiB)


class _Lane:
    """One rank as the relay sees it: its current connection and what waits to go upstream."""

    __slots__ = ("rank", "conn", "items", "seen_end", "dropped", "reported", "told", "host", "pid",
                 "local_rank", "open", "first_seq", "first_t", "last_t", "said_bye", "peak_rate")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.conn: Optional[Conn] = None
        self.items: list[tuple[int, Any, Optional[bytes], int]] = []  # (kind, msg, raw, size)
        self.seen_end = 0  # seq after the last record received from the rank (kept or dropped)
        self.dropped = 0   # records dropped here (cumulative)
        self.reported = 0  # ... of which a loss frame was queued for the upstream
        self.told = 0      # ... of which such a frame was handed to the upstream socket
        self.host = ""
        self.pid: Optional[int] = None
        self.local_rank: Optional[int] = None
        self.open: Optional[int] = None  # records the rank last said it held unsent
        self.said_bye = False              # on its current connection
        self.first_seq = -1                # for its step rate: first seq and time, latest time
        self.first_t = 0.0
        self.last_t = 0.0
        #: the fastest the rank has stepped, on its own clock (steps/s over one frame's records)
        self.peak_rate = 0.0

    def note_steps(self, seq: int, end: int, open_: Optional[int], now: float,
                   t_end_ns: Optional[list[int]] = None) -> None:
        if self.first_seq < 0:
            self.first_seq, self.first_t = seq, now
        self.last_t = now
        if end > self.seen_end:
            self.seen_end = end
        if open_ is not None:
            self.open = open_
        if t_end_ns is not None and len(t_end_ns) >= 2 and t_end_ns[-1] > t_end_ns[0]:
            rate = (len(t_end_ns) - 1) * 1e9 / (t_end_ns[-1] - t_end_ns[0])
            if rate > self.peak_rate:
                self.peak_rate = rate

    def unsent_bound(self, now: float) -> Optional[int]:
        """At a close without ``bye``: what the rank last said it held unsent, plus the records it
        can have produced since it last spoke, at the fastest rate it ever stepped. A rank
        speaks at least every second while its client thread lives (a stalled training thread
        included: sdk/recorder.py), so the second part is about a second of steps, not the
        length of a hang."""
        if self.first_seq < 0:
            return None
        span = self.last_t - self.first_t
        rate = max((self.seen_end - self.first_seq) / span if span > 0 else 0.0, self.peak_rate)
        return (self.open or 0) + math.ceil(rate * max(0.0, now - self.last_t))

    def join_frame(self, new: bool) -> dict[str, Any]:
        frame = {"t": "join", "rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                 "pid": self.pid, "new": new}
        if not new:  # a re-announce to a (maybe restarted) aggregator: how far the rank went
            frame["seq_end"] = self.seen_end
        return frame

    def loss_frame(self, t: str) -> dict[str, Any]:
        self.reported = self.dropped
        frame = {"t": t, "rank": self.rank, "relay_dropped": self.dropped, "seq_end": self.seen_end}
        if t == "gone":
            frame["open"] = self.open
        return frame


class Relay(Handler):
    """See the module docstring. ``upstream`` is the aggregator's ``(host, port)``; ``hostname``
    and ``nproc`` go into the relay's own hello."""

    def __init__(self, *, token: str, run_name: str, job_id: Optional[str], node: int, nnodes: int,
                 nproc_per_node: int, upstream: tuple[str, int], hostname: str = "",
                 budget_bytes: int = DEFAULT_BUDGET, flush_s: float = FLUSH_S,
                 bind_host: str = "127.0.0.1", handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 warn: Optional[Callable[[str], None]] = None,
                 client_options: Optional[dict[str, Any]] = None,
                 port: int = 0, tail: bool = False,
                 upstream_aud: str = AGGREGATOR) -> None:
        self.node = node
        #: besides each window's statistics (``fold``), send its last records (``tail``): the
        #: live views (one node) show them
        self.tail = tail
        self._warn = warn or (lambda msg: log.warning("traceml: %s", msg))
        self.endpoint = Endpoint(aud=relay_aud(node), run=run_name, job=job_id, keys={"rank": token},
                                 nnodes=nnodes, nproc_per_node=nproc_per_node, node=node)
        self._nonces = NonceCache()
        self.budget = max(1 << 16, int(budget_bytes))
        self.flush_s = max(0.0, flush_s)
        self.counters: dict[str, int] = {}
        self.net = FramedServer(listen(bind_host, port, 1024), self, counters=self.counters,
                                log=self._warn, name=f"node {node}'s relay",
                                limits=Limits(hello_timeout_s=handshake_timeout_s,
                                              max_pending=MAX_PENDING,
                                              max_buffered=self.budget, max_out=1 << 20))
        self.host, self.port = self.net.listener.getsockname()[:2]
        self._waker = Waker(self.net)

        self._lanes: dict[int, _Lane] = {}
        self._dirty: dict[_Lane, None] = {}
        self._node_items: deque[dict[str, Any]] = deque()   # from other threads (system frames)
        self._down: deque[dict[str, Any]] = deque()         # req frames from the client thread
        self._retell: deque[_Lane] = deque()                 # lanes whose drops node 0 may not know
        self.out = OutQueue(on_told=self._told)
        self._pending_bytes = 0   # raw bytes of frames waiting in lanes (relay thread)
        self._next_flush = 0.0

        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._close_deadline = 0.0
        self._bye_by = 0.0
        self._stopped = threading.Event()
        self._drained = threading.Event()
        self._draining = 0
        self._run_ended = False

        # counters
        self._records_in = 0
        #: when the first step records from a rank reached this relay (epoch s; the launch
        #: lifecycle's first step), None before
        self.first_steps_at: Optional[float] = None
        self._frames_in = 0
        self._events_dropped = 0
        self._answers_in = 0
        self._answers_dropped = 0
        self._peak = 0

        host, port = upstream
        opts = {"backoff_initial": 0.1, "poll_interval": 0.05, **(client_options or {})}
        self.client = TelemetryClient(
            ClientConfig(host, port, token, aud=upstream_aud, run=run_name, job=job_id, node=node, rank=-1,
                         kind="node", hostname=hostname or socket.gethostname(), extra={"nproc": nproc_per_node},
                         peer="node 0's aggregator", name=f"traceml-relay-up-{node}", **opts),
            source=self.out, on_connect=self._reannounce, on_frame=self._from_upstream)

    # ---- other threads ----------------------------------------------------------------------
    def start(self) -> "Relay":
        self.client.start()
        self._thread = threading.Thread(target=self._run, name=f"traceml-relay-{self.node}",
                                        daemon=True)
        self._thread.start()
        return self

    def wait_connected(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) for the link to the aggregator; True if it is up."""
        return self.client.wait_connected(timeout)

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

    def run_ended(self) -> None:
        """The run is over (node 0 finished, or is finishing): the aggregator will close this
        link; that is the end, not a failure to report or reconnect after."""
        self._run_ended = True
        self.client.ending()

    def close(self, timeout: float = 2.0, bye: Optional[dict[str, Any]] = None) -> RelayStats:
        """Forward what is left, then ``bye`` (the node launcher's own end) last, all within
        ``timeout`` s; then stop. Records still held at the deadline are counted unsent."""
        now = time.monotonic()
        timeout = max(0.0, timeout)
        self._close_deadline = now + timeout
        self._bye_by = now + timeout / 2
        self._closing = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout / 2 + 1.0)
        left = max(0.1, self._close_deadline - time.monotonic())
        self.client.close(left, bye=bye)
        self._finish_counts()
        return self.stats()

    def stats(self) -> RelayStats:
        cs = self.client.stats()
        return RelayStats(
            ranks_connected=sum(1 for ln in self._lanes.values() if ln.conn is not None),
            ranks_seen=len(self._lanes),
            records_in=self._records_in, records_forwarded=self.out.records_forwarded,
            frames_in=self._frames_in, frames_forwarded=self.out.frames_forwarded,
            records_dropped=self.out.records_dropped, records_unsent=self.out.records_unsent,
            dropped_untold=self.dropped_untold(), events_dropped=self._events_dropped, malformed=self.counters.get("malformed", 0),
            refused=self.counters.get("refused", 0), upstream_connects=cs.connects,
            upstream_connected=cs.connected, upstream_refused=cs.refused,
            queued_bytes=self._pending_bytes + self.out.queued, peak_queued_bytes=self._peak,
            answers_in=self._answers_in, answers_dropped=self._answers_dropped)

    def dropped_by_rank(self) -> dict[int, int]:
        return {r: ln.dropped for r, ln in self._lanes.items() if ln.dropped}

    def dropped_untold(self) -> int:
        """Records this relay dropped that node 0 was never told of (its link was gone)."""
        return sum(ln.dropped - ln.told for ln in self._lanes.values())

    def _wake(self) -> None:
        self._waker.wake()

    def _told(self, rank: int, count: int) -> None:
        """(client thread) A loss frame reached the upstream socket: node 0 knows this lane's
        drops up to ``count``."""
        lane = self._lanes.get(rank)
        if lane is not None and count > lane.told:
            lane.told = count

    @property
    def lost(self) -> int:
        return self.out.lost

    def _reannounce(self) -> list[Union[dict[str, Any], bytes]]:
        """Client thread, after each welcome: the connected ranks first (node 0 forgot them when
        the previous link closed), then the losses it has not been told of."""
        frames: list[Union[dict[str, Any], bytes]] = []
        for lane in sorted(list(self._lanes.values()), key=lambda ln: ln.rank):
            # a lane whose (new) join still waits in its queue is announced by that join: a
            # re-announce ahead of it would count the rank's connection twice
            items = lane.items  # the relay loop replaces the list, never empties this one
            joining = bool(items) and items[0][0] == _JOIN
            if (lane.conn is not None or items) and not joining:
                frames.append(lane.join_frame(False))
            if lane.dropped > lane.told:
                self._retell.append(lane)   # the relay loop queues its loss frame again
        self._wake()
        return frames

    def _from_upstream(self, msg: dict[str, Any]) -> None:
        """Client thread: a validated downstream frame; the relay loop hands it to the ranks."""
        if msg["t"] == "end":
            self.run_ended()
            return
        self._down.append(msg)
        self._wake()

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                timeout = max(0.0, min(0.05, self._next_flush - time.monotonic())) \
                    if (self._dirty or self._node_items) else 0.05
                self.net.step(timeout)
                while self._down:
                    self._downstream(self._down.popleft())
                while self._retell:
                    lane = self._retell.popleft()
                    lane.reported = min(lane.reported, lane.told)
                    self._dirty[lane] = None
                now = time.monotonic()
                urgent = self._closing or self._draining
                if urgent or now >= self._next_flush or self._pending_bytes >= FLUSH_BYTES:
                    self._flush(now)
                if self._draining and not self.net.conns and not self.net.pending \
                        and not self._dirty and not len(self.out):
                    self._drained.set()
                if self._closing and self._close_done(now):
                    return
        except Exception as exc:  # never take the launcher down; ranks then see a closed relay
            self._warn(f"the node relay stopped after an internal error: {type(exc).__name__}: {exc}")
        finally:
            self._shutdown()

    def _close_done(self, now: float) -> bool:
        if self.net.conns and now < self._bye_by:
            return False
        # ranks still connected this late (a stuck process) are reported gone: the node's own
        # bye must reach node 0 before the deadline, and after every rank's frames
        for c in list(self.net.conns):
            self.net.close(c)
        self._flush(now)
        return True

    def _shutdown(self) -> None:
        self.net.close_all()
        self.net.poller.close()
        self._waker.close()
        self._stopped.set()
        self._drained.set()

    def _finish_counts(self) -> None:
        """After the client stopped: what it could not send was discarded (counted unsent);
        records never merged (the loop died) are unsent too."""
        for ln in self._lanes.values():
            self.out.records_unsent += sum(msg["n"] for kind, msg, _raw, _size in ln.items
                                           if kind == _STEPS)
            ln.items = []
        unsent = self.out.records_unsent
        if unsent:
            why = ("node 0 had already written the summary" if self._run_ended
                   else "node 0's aggregator was unreachable at the end")
            self._warn(f"this node's relay could not forward {unsent:,} step records ({why}); "
                       "the summary does not include them")

    # ---- rank connections (the handler) ------------------------------------------------------
    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Union[Identity, str]:
        refused = self.client.refused_reason
        if refused is not None:
            return f"node 0 refused this node's relay: {refused}"
        if self._closing:
            return "this node's launcher is shutting down"
        return check_hello(msg, self.endpoint, self._nonces)

    def on_accept(self, conn: Conn) -> None:
        i = conn.ident
        assert i is not None
        lane = self._lanes.get(i.rank)
        if lane is None:
            lane = self._lanes[i.rank] = _Lane(i.rank)
        old = lane.conn
        if old is not None and old is not conn:
            lane.conn = None       # replaced: the new connection's join says so upstream
            old.user = None
            self.counters["replaced"] = self.counters.get("replaced", 0) + 1
            self.net.close(old)
        lane.conn = conn
        lane.said_bye = False
        lane.host, lane.pid, lane.local_rank = i.host, i.pid, i.local_rank
        conn.user = lane
        lane.items.append((_JOIN, None, None, 0))
        self._dirty[lane] = None

    def on_close(self, conn: Conn) -> None:
        lane = conn.user
        if lane is not None and lane.conn is conn:
            lane.conn = None
            lane.open = 0 if lane.said_bye else lane.unsent_bound(time.monotonic())
            lane.items.append((_GONE, None, None, 0))
            self._dirty[lane] = None

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        lane: _Lane = conn.user
        bind_rank(msg, lane.rank)
        checked = validate("rank", msg)
        if checked is None:
            raise ProtocolError(f"a rank does not send {str(msg.get('t'))[:20]!r} frames")
        t = checked["t"]
        size = end - off
        if t == "steps":
            n = checked["n"]
            lane.note_steps(checked["seq"], checked["seq"] + n, checked.get("open"), time.monotonic(),
                            checked["cols"].get("t_end_ns"))
            self._records_in += n
            self._frames_in += 1
            if self.first_steps_at is None and n:
                self.first_steps_at = time.time()
            if self._pending_bytes + self.out.queued + size > self.budget:
                lane.dropped += n
                self.out.records_dropped += n
                self._dirty[lane] = None
                return
            lane.items.append((_STEPS, checked, None, size))
        elif t == "event":
            if self._pending_bytes + self.out.queued + size > self.budget:
                self._events_dropped += 1
                return
            lane.items.append((_RAW, None, bytes(data[off:end]), size))
        elif t == "resp":  # an answer can carry a 64 KiB stack: within the budget like events
            self._answers_in += 1
            if self._pending_bytes + self.out.queued + size > self.budget:
                self._answers_dropped += 1
                return
            lane.items.append((_RAW, None, bytes(data[off:end]), size))
        else:  # bye: small, always kept
            if t == "bye":
                lane.open = 0
                lane.said_bye = True
            lane.items.append((_RAW, None, bytes(data[off:end]), size))
        self._pending_bytes += size
        self._dirty[lane] = None
        q = self._pending_bytes + self.out.queued
        if q > self._peak:
            self._peak = q

    def _downstream(self, msg: dict[str, Any]) -> None:
        if msg["t"] != "req":
            return
        ranks = msg.get("ranks")
        data = encode({k: msg[k] for k in ("t", "id", "kind", "args")})
        for rank, lane in list(self._lanes.items()):
            if lane.conn is not None and (ranks is None or rank in ranks):
                self.net.send_raw(lane.conn, data)
        if msg["kind"] == "stacks":
            # the hang autopsy: each rank's interpreter answers with its stacks; this relay adds
            # what the kernel knows of each process (stopped, its CPU time and I/O), which needs
            # nothing of the rank: a rank that cannot answer is still described
            pids = {r: ln.pid for r, ln in self._lanes.items()
                    if ln.pid is not None and ln.conn is not None and (ranks is None or r in ranks)}
            if pids:
                threading.Thread(target=self._proc_states, args=(msg["id"], pids),
                                 name=f"traceml-procstate-{self.node}", daemon=True).start()

    def _proc_states(self, req_id: int, pids: dict[int, int]) -> None:
        """(a thread: ``/proc`` of a process in the kernel's uninterruptible sleep can be slow)
        Each rank's process state goes up as this relay's ``stacks`` answer for the rank."""
        from .procstate import read

        for rank, pid in sorted(pids.items()):
            try:
                st = read(pid)
            except Exception:  # never take the relay down
                continue
            self.submit({"t": "resp", "id": req_id, "rank": rank, "kind": "stacks",
                         "data": {"source": "relay", "pid": st.pid, "gone": st.gone, "state": st.state,
                                  "wchan": st.wchan, "main_cpu_ns": st.main_cpu_ns,
                                  "proc_cpu_ns": st.proc_cpu_ns, "children_cpu_ns": st.children_cpu_ns,
                                  "io_bytes": st.io_bytes, "at_ns": time.monotonic_ns()}})

    # ---- merging ----------------------------------------------------------------------------
    def _window(self, out: OutQueue, msg: dict[str, Any]) -> int:
        """Queue one merged run of a rank's records: its statistics (``fold``), and in the live
        modes its last records (``tail``). Returns the bytes queued."""
        n = msg["n"]
        if not n:
            return 0
        try:
            value = WindowStats.of_columns(msg["seq"], msg["cols"])
        except ValueError:  # sums past what a window holds (values near their bounds): in halves
            half = n // 2
            cols = msg["cols"]
            first = dict(msg, n=half, cols={k: c[:half] for k, c in cols.items()})
            first.pop("open", None)
            return self._window(out, first) + self._window(
                out, dict(msg, seq=msg["seq"] + half, n=n - half, cols={k: c[half:] for k, c in cols.items()}))
        data = encode(fold_frame(msg["rank"], value, msg.get("dropped", 0), msg.get("open")))
        size = out.put(Outgoing(data, msg["rank"], msg["n"]))
        if self.tail:
            size += out.put(Outgoing(encode(tail_frame(msg["rank"], msg["seq"], msg["n"], msg["cols"]))))
        return size

    def _flush(self, now: float) -> None:
        self._next_flush = now + self.flush_s
        out = self.out
        added = 0
        while self._node_items:
            try:
                data = encode(self._node_items.popleft())
            except Exception:  # an unencodable or oversized sample: skip it
                continue
            added += out.put(Outgoing(data))
        for lane in self._dirty:
            cur: Optional[dict[str, Any]] = None  # the steps frame being merged (ours)
            gone = False
            for kind, msg, raw, size in lane.items:
                self._pending_bytes -= size
                if kind == _STEPS:
                    if cur is not None and merge_into(cur, msg):
                        continue
                    if cur is not None:
                        added += self._window(out, cur)
                    cur = steps_frame(msg)
                    continue
                if cur is not None:
                    added += self._window(out, cur)
                    cur = None
                if kind == _RAW:
                    data = raw  # type: ignore[assignment]
                elif kind == _JOIN:
                    data = encode(lane.join_frame(True))
                else:
                    data = encode(lane.loss_frame("gone"))
                    gone = True
                    added += out.put(Outgoing(data, lane.rank, 0, lane.dropped))
                    continue
                added += out.put(Outgoing(data))
            if cur is not None:
                added += self._window(out, cur)
            lane.items = []
            if not gone and lane.dropped > lane.reported:
                added += out.put(Outgoing(encode(lane.loss_frame("dropped")), lane.rank, 0, lane.dropped))
        self._dirty = {}
        if added:
            self.client.wake()


__all__ = ["Relay", "RelayStats", "DEFAULT_BUDGET", "FLUSH_S", "LIVE_FLUSH_S"]
