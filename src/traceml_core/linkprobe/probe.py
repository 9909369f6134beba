"""Measuring the links between nodes: one TCP stream per pair, between the nodes' launchers.

Every node runs a :class:`ProbeServer` (the wire/ transport's framed server: hello checked against
the run's token for endpoint ``probe:<node>``, pending connections capped). A coordinator (node
0's launcher, or the doctor) connects to each node's server with a ``probe.ctl`` link and, round by
round (:func:`.analysis.schedule`), tells nodes to send to their peers; each node streams at most
``nbytes`` to the peer's server for at most ``seconds`` and answers what it managed. The coordinator
judges the transfers with :func:`.analysis.analyse`.

On the connection (after ``welcome``), frames of wire/protocol.py, then raw bytes:

``probe.ctl``     coordinator -> node, node 0 only: this link carries commands. Then
                  ``probe.send {"id","dst","host","port","nbytes","seconds"}``, answered by
                  ``probe.sent {"id","dst","nbytes","seconds","error"}``; ``probe.end`` closes it.
``probe.stream``  sender -> receiver: a stream follows. The receiver answers ``probe.ready``; the
                  sender then writes chunks, each a 4-byte big-endian length and that many bytes,
                  and a zero length at the end; the receiver answers ``probe.got {"nbytes"}``.

The sender's clock decides the rate: from the first chunk to ``probe.got`` (one round trip more
than the bytes themselves: nothing for megabytes). The cost is bounded by ``nbytes`` and
``seconds`` per transfer; every wait has a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..wire.auth import Endpoint, NonceCache, check_hello, make_hello
from ..wire.client import Link, LinkError, LinkRefused
from ..wire.frames import MAX_PROBE_NODES
from ..wire.protocol import HEADER
from ..wire.server import Conn, FramedServer, Handler, Limits, listen
from .analysis import Pair, analyse, confirm, failed, schedule

HELLO_KIND = "probe"
#: what one chunk of the stream carries (large: fewer system calls, the rate is the link's)
CHUNK = 1 << 20
#: defaults: at most this many bytes and seconds per transfer
DEFAULT_BYTES = 32 * 1000 * 1000
DEFAULT_SECONDS = 1.0
#: seconds a single socket operation of the probe may block
IO_TIMEOUT_S = 10.0
#: a round's answers are due ``seconds`` + this (connecting, the last bytes, the answer itself)
ROUND_SLACK_S = 15.0
#: the most the rounds may take once the nodes are connected (whatever the nodes or the links do)
ROUNDS_BUDGET_S = 30.0
#: the most nodes one probe covers (its result must pass the ``probe`` frame's bounds)
MAX_NODES = MAX_PROBE_NODES
#: command links made at once
CONNECT_THREADS = 64
#: commands a command link may send before the server handed it over to its thread
MAX_EARLY = 16


def probe_aud(node: int) -> str:
    return f"probe:{node}"


@dataclass(frozen=True)
class ProbeRun:
    """Who takes part: the run's identity and token, the nodes' hosts and the probe port."""

    token: str
    run: str
    job: Optional[str]
    nnodes: int
    port: int

    def endpoint(self, node: int) -> Endpoint:
        return Endpoint(aud=probe_aud(node), run=self.run, job=self.job, keys={HELLO_KIND: self.token},
                        nnodes=self.nnodes, nproc_per_node=1)

    def hello(self, *, to: int, me: int) -> Callable[[], dict[str, Any]]:
        return lambda: make_hello(self.token, aud=probe_aud(to), run=self.run, job=self.job, node=me,
                                  rank=-1, kind=HELLO_KIND, host=socket.gethostname())


# ---- the receiving / commanded side ------------------------------------------------------------------

class _Gate(Handler):
    def __init__(self, run: ProbeRun, node: int) -> None:
        self.endpoint = run.endpoint(node)
        self.nonces = NonceCache()
        self.ready: list[tuple[Conn, str]] = []
        #: frames a command link sent before it was handed over (see on_frame)
        self.early: dict[Conn, list[dict[str, Any]]] = {}

    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Any:
        return check_hello(msg, self.endpoint, self.nonces)

    def on_accept(self, conn: Conn) -> None:
        pass

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        from ..wire.protocol import ProtocolError

        kind = msg.get("t")
        if conn.user == "ctl" and len(self.early.setdefault(conn, [])) < MAX_EARLY:
            # commands that came in the same read as probe.ctl: the command thread gets them first
            self.early[conn].append(msg)
            return
        if conn.user is not None:
            raise ProtocolError("nothing is expected before the handover")
        if kind == "probe.stream":
            conn.user = "stream"
        elif kind == "probe.ctl":
            if conn.ident is None or conn.ident.node != 0:
                raise ProtocolError("probe commands come from node 0 only")
            conn.user = "ctl"
        else:
            raise ProtocolError(f"unexpected {str(kind)[:20]!r} frame")
        self.ready.append((conn, conn.user))

    def on_close(self, conn: Conn) -> None:
        self.early.pop(conn, None)


class ProbeServer:
    """One node's side of the probe: receives streams and, from node 0, send commands.

    Serves in a daemon thread until :meth:`close`; handed-over connections run in their own
    daemon threads, each bounded by deadlines. Only a peer holding the run's token gets past the
    hello, only node 0 may command, and a stream is sent only after the receiving probe server
    answered its own hello, so a command cannot turn a node into a sender of bytes to anything
    but another node's probe server."""

    def __init__(self, run: ProbeRun, node: int, *, bind: str = "0.0.0.0", port: Optional[int] = None,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.run = run
        self.node = node
        self.log = log
        self._gate = _Gate(run, node)
        self._net = FramedServer(listen(bind, run.port if port is None else port, backlog=64),
                                 self._gate, counters={}, log=log, name=f"probe:{node}",
                                 limits=Limits(hello_timeout_s=5.0, max_pending=64,
                                               max_buffered=4 << 20, max_out=1 << 20))
        self.port = self._net.port
        self._stop = threading.Event()
        self.ended = threading.Event()     # node 0 said probe.end (or closed its command link)
        self._thread = threading.Thread(target=self._serve, name=f"traceml-probe-{node}", daemon=True)

    def start(self) -> "ProbeServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _serve(self) -> None:
        try:
            while not self._stop.is_set() and not self.ended.is_set():
                self._net.step(0.1)
                while self._gate.ready:
                    conn, kind = self._gate.ready.pop()
                    if conn.closed:
                        continue
                    early = self._gate.early.pop(conn, [])
                    sock, rest = self._net.detach(conn)
                    if kind == "stream":
                        target, args = _receive, (sock, rest)
                    else:
                        target, args = self._commands, (sock, rest, early)
                    threading.Thread(target=target, args=args, daemon=True,
                                     name=f"traceml-probe-{kind}").start()
        finally:
            for c in list(self._net.pending) + list(self._net.conns):
                self._net.close(c)
            self._net.close_all()
            self._net.poller.close()

    def _commands(self, sock: socket.socket, rest: bytes, early: Sequence[dict[str, Any]] = ()) -> None:
        link = Link(sock, "probe-ctl", rest)
        link.ready.extendleft(reversed(early))
        try:
            while True:
                msg = link.recv(600.0)
                if msg.get("t") == "probe.end":
                    break
                if msg.get("t") != "probe.send":
                    break
                link.send(self._send(msg))
        except LinkError:
            pass
        finally:
            link.close()
            self.ended.set()

    def _send(self, msg: dict[str, Any]) -> dict[str, Any]:
        rid, dst = msg.get("id"), msg.get("dst")
        host, port = msg.get("host"), msg.get("port")
        nbytes, seconds = msg.get("nbytes"), msg.get("seconds")
        ok = (type(dst) is int and 0 <= dst < self.run.nnodes and dst != self.node
              and isinstance(host, str) and 0 < len(host) < 256 and type(port) is int
              and 0 < port < 65536
              and type(nbytes) is int and 0 < nbytes <= 1 << 32
              and type(seconds) in (int, float) and 0 < seconds <= 60)
        if not ok:
            return {"t": "probe.sent", "id": rid, "dst": dst, "nbytes": 0, "seconds": 0.0,
                    "error": "refused: malformed command"}
        pair = send_stream(self.run, self.node, dst, host, port, nbytes, float(seconds))
        return {"t": "probe.sent", "id": rid, "dst": dst, "nbytes": pair.nbytes,
                "seconds": pair.seconds, "error": pair.error}


def _receive(sock: socket.socket, rest: bytes) -> None:
    """Answer ``probe.ready``, read chunks until the zero length, answer ``probe.got``."""
    link = Link(sock, "probe-stream", b"")
    total = 0
    try:
        if rest:
            return      # the sender must wait for probe.ready: anything earlier is a broken peer
        link.send({"t": "probe.ready"})
        sock.settimeout(IO_TIMEOUT_S)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        head = bytearray(HEADER.size)
        while True:
            _read_exactly(sock, memoryview(head), HEADER.size)
            (n,) = HEADER.unpack(head)
            if n == 0:
                break
            if n > CHUNK:
                return
            _read_exactly(sock, view, n)
            total += n
        link.send({"t": "probe.got", "nbytes": total})
    except (OSError, LinkError):
        pass
    finally:
        link.close()


def _read_exactly(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n], n - got)
        if not k:
            raise OSError("the peer closed the stream")
        got += k


# ---- the sending side ---------------------------------------------------------------------------

def send_stream(run: ProbeRun, src: int, dst: int, host: str, port: int, nbytes: int,
                seconds: float) -> Pair:
    """Stream up to ``nbytes`` to node ``dst``'s probe server for at most ``seconds``."""
    try:
        link = Link.connect(host, port, run.hello(to=dst, me=src), timeout=IO_TIMEOUT_S,
                            wait_s=2.0, name=f"probe:{dst}")
    except LinkError as exc:
        return Pair(src, dst, error=str(exc)[:300])
    sock = link.sock
    try:
        link.send({"t": "probe.stream"})
        ready = link.recv(IO_TIMEOUT_S)
        if ready.get("t") != "probe.ready":
            return Pair(src, dst, error=f"unexpected answer {str(ready.get('t'))[:20]!r}")
        chunk = memoryview(HEADER.pack(CHUNK) + bytes(CHUNK))
        sock.settimeout(IO_TIMEOUT_S)
        sent = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while sent < nbytes and (sent == 0 or time.perf_counter() < deadline):
            size = min(CHUNK, nbytes - sent)
            if size == CHUNK:
                sock.sendall(chunk)
            else:
                sock.sendall(HEADER.pack(size) + bytes(size))
            sent += size
        sock.sendall(HEADER.pack(0))
        got = link.recv(IO_TIMEOUT_S + seconds)
        t1 = time.perf_counter()
        if got.get("t") != "probe.got" or got.get("nbytes") != sent:
            return Pair(src, dst, error=f"the receiver counted {got.get('nbytes')} of {sent} bytes")
        return Pair(src, dst, nbytes=sent, seconds=round(t1 - t0, 6))
    except (OSError, LinkError) as exc:
        return Pair(src, dst, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        link.close()


# ---- the coordinator ------------------------------------------------------------------------------

def coordinate(run: ProbeRun, hosts: Sequence[str], *, ports: Optional[Sequence[int]] = None,
               nbytes: int = DEFAULT_BYTES, seconds: float = DEFAULT_SECONDS, wait_s: float = 30.0,
               budget_s: float = ROUNDS_BUDGET_S, log: Callable[[str], None] = lambda s: None,
               stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Run the probe as node 0 (node 0's launcher, or the doctor's coordinator): connect to every
    node's server (``ports[i]``, else the run's probe port; waiting up to ``wait_s`` for late
    ones), run the rounds, end every command link, and return :func:`.analysis.analyse`'s section
    (or :func:`.analysis.failed`'s). Never raises.

    Bounded whatever the nodes do: the connections are made in parallel and all within
    ``wait_s`` (+ one socket timeout); each round within ``seconds`` + :data:`ROUND_SLACK_S`, and
    all rounds (the confirmation included) within ``budget_s``; ``stop()`` (a SIGTERM in the
    launcher) is checked at least once a second and ends it early."""
    t0 = time.monotonic()
    user_stop = stop
    rounds_end = [float("inf")]

    def stop() -> bool:
        return user_stop() or time.monotonic() > rounds_end[0]

    def ended() -> dict[str, Any]:
        if user_stop():
            return failed("interrupted")
        return failed(f"the transfers took longer than the probe's bound ({budget_s:.0f} s)")

    n = len(hosts)
    ports = list(ports) if ports is not None else [run.port] * n
    if n > MAX_NODES:
        return failed(f"{n} nodes: the probe runs for at most {MAX_NODES}")
    links: dict[int, Link] = {}
    try:
        links = _connect_all(run, hosts, ports, wait_s, log, stop)
        if stop():
            return ended()
        rounds_end[0] = time.monotonic() + budget_s
        if len(links) < 2:
            return failed(f"only {len(links)} of {n} nodes' launchers answered the probe")
        ids = iter(range(1, 1 << 30))

        def run_round(rnd: Sequence[tuple[int, int]]) -> list[Pair]:
            out, asked = [], []
            for src, dst in rnd:
                if src not in links or dst not in links:
                    out.append(Pair(src, dst, error="a node of this pair did not answer the probe"))
                    continue
                rid = next(ids)
                try:
                    links[src].send({"t": "probe.send", "id": rid, "dst": dst, "host": hosts[dst],
                                     "port": ports[dst], "nbytes": nbytes, "seconds": seconds})
                    asked.append((src, dst, rid))
                except LinkError as exc:
                    out.append(Pair(src, dst, error=str(exc)[:300]))
            # every sender of the round works at the same time; one deadline for all answers
            deadline = time.monotonic() + seconds + ROUND_SLACK_S
            for src, dst, want in asked:
                out.append(_answer(links[src], src, dst, want, deadline, stop))
            return out

        pairs: list[Pair] = []
        for rnd in schedule(n):
            pairs += run_round(rnd)
            if stop():
                return ended()
        def judge(measured: Sequence[Pair]) -> dict[str, Any]:
            return analyse(measured, hosts, bytes_per_pair=nbytes, seconds=time.monotonic() - t0)

        def again(pair: tuple[int, int]) -> Optional[Pair]:
            got = run_round([pair])[0]   # one at a time: the transfer has the link alone
            return None if stop() else got

        # confirm before naming anyone: the suspect's transfers again (analysis.confirm)
        section = confirm(pairs, judge, again)
        return ended() if section is None else section
    except Exception as exc:   # never into the launcher
        return failed(f"{type(exc).__name__}: {exc}")
    finally:
        for link in links.values():
            try:
                link.send({"t": "probe.end"})
            except LinkError:
                pass
            link.close()


def _connect_all(run: ProbeRun, hosts: Sequence[str], ports: Sequence[int], wait_s: float,
                 log: Callable[[str], None], stop: Callable[[], bool]) -> dict[int, Link]:
    """A command link to every node's server, made in parallel (at most :data:`CONNECT_THREADS`
    at once), each retried until ``wait_s`` from now; the ones not made by then are left out."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + wait_s

    def one(node: int) -> Optional[Link]:
        last: Optional[BaseException] = None
        while True:   # slices of a second, so stop() is heard
            left = deadline - time.monotonic()
            if stop() or left < 0:
                break
            try:
                link = Link.connect(hosts[node], ports[node], run.hello(to=node, me=0),
                                    timeout=min(IO_TIMEOUT_S, max(1.0, left)),
                                    wait_s=min(1.0, left), name=f"probe:{node}")
            except LinkRefused as exc:
                last = exc
                break       # the hello was refused (another token, another run): no retry
            except (LinkError, OSError) as exc:
                last = exc
                continue
            try:
                link.send({"t": "probe.ctl"})
                return link
            except LinkError as exc:
                link.close()
                last = exc
                break
        log(f"link probe: node {node} ({hosts[node]}) not reachable: {last or 'interrupted'}")
        return None

    with ThreadPoolExecutor(max_workers=min(CONNECT_THREADS, max(1, len(hosts))),
                            thread_name_prefix="traceml-probe-connect") as pool:
        made = list(pool.map(one, range(len(hosts))))
    return {node: link for node, link in enumerate(made) if link is not None}


def _answer(link: Link, src: int, dst: int, want: int, deadline: float,
            stop: Callable[[], bool]) -> Pair:
    """Node ``src``'s answer to command ``want``, read by ``deadline``."""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or stop():
                return Pair(src, dst, error="no answer in time")
            try:
                ans = link.recv(min(1.0, left))
                break
            except LinkError:
                if link.closed:
                    raise       # else: no answer yet within this slice
        if ans.get("t") != "probe.sent" or ans.get("id") != want:
            raise LinkError(f"unexpected answer {str(ans.get('t'))[:20]!r}")
        err = ans.get("error")
        return Pair(src, dst, nbytes=int(ans.get("nbytes") or 0), seconds=float(ans.get("seconds") or 0.0),
                    error=str(err)[:300] if err else None)
    except (LinkError, TypeError, ValueError) as exc:
        return Pair(src, dst, error=str(exc)[:300])


# ---- in traceml run ----------------------------------------------------------------------------------

class NodeProbe:
    """The link probe as one node's ``traceml run`` runs it: every node serves (from the moment it
    joins until node 0 ends the probe, or the launcher ends); node 0 runs the rounds before its
    workers start (the other nodes' workers wait in torchrun's rendezvous meanwhile)."""

    def __init__(self, *, token: str, run_name: str, job_id: Optional[str], nnodes: int, node: int,
                 port: int, nbytes: int, log: Callable[[str], None]) -> None:
        self.run = ProbeRun(token=token, run=run_name, job=job_id, nnodes=nnodes, port=port)
        self.node = node
        self.nbytes = nbytes
        self.log = log
        self.server: Optional[ProbeServer] = None

    def serve(self) -> bool:
        """Listen on the probe port; False (logged) when it cannot."""
        try:
            self.server = ProbeServer(self.run, self.node, log=lambda m: None).start()
            return True
        except OSError as exc:
            self.log(f"warning: link probe: cannot listen on port {self.run.port} ({exc}); this "
                     "node is left out of it")
            return False

    def measure(self, hosts: Sequence[str], wait_s: float,
                stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Node 0: run the probe over ``hosts`` (by node rank); logs one line, returns the section."""
        t0 = time.monotonic()
        out = coordinate(self.run, hosts, nbytes=self.nbytes, seconds=DEFAULT_SECONDS,
                         wait_s=wait_s, log=self.log, stop=stop)
        took = time.monotonic() - t0
        if out.get("error"):
            self.log(f"warning: link probe: {out['error']} ({took:.1f} s)")
            return out
        rates = ", ".join(f"node {n['node']} {n['gbps']:.3g}" if n["gbps"] is not None
                          else f"node {n['node']} -" for n in out["nodes"])
        line = f"link probe ({took:.1f} s): best send rate per node in GB/s: {rates}"
        slow, link = out.get("slow_node"), out.get("slow_link")
        if slow:
            line += (f"; SLOW: node {slow['node']} ({slow['host']}) {slow['direction']}s at "
                     f"{slow['gbps']:.3g} GB/s, the others {slow['others_gbps']:.3g}")
        elif link:
            line += (f"; SLOW: node {link['src']} -> node {link['dst']} at {link['gbps']:.3g} GB/s, "
                     f"the other way {link['others_gbps']:.3g}")
        self.log(line)
        return out

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
