"""A minimal protocol-v1 receiver, for exercising senders without the aggregator.

Not the aggregator: no statistics, no summary. It does what the protocol requires of a server
(hello checked with :func:`~traceml_core.wire.protocol.verify_hello_mac`, version, run name and
nonce replay; ``welcome`` or ``refused``; frames decoded with
:class:`~traceml_core.wire.protocol.FrameBuffer`; a bad frame closes that connection) and records
what arrived, per rank: records, sequence gaps, the last ``dropped`` value, events and ``bye``.
Tests run it in a thread; benchmarks run it as a separate process so it does not share the
sender's GIL::

    python -m traceml_core.wire.sink --token T --run R [--port 0] [--expect-byes N] [--timeout S]

prints ``PORT <n>`` once listening, and one JSON line of totals when done (after ``N`` byes, the
timeout, SIGTERM or end of stdin).
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .protocol import (
    HELLO_WINDOW_S, PROTOCOL_VERSION, FrameBuffer, ProtocolError, encode, verify_hello_mac,
)


@dataclass
class RankLog:
    """What one rank (or node client) delivered."""

    records: int = 0
    frames: int = 0
    next_seq: int = 0
    gaps: int = 0            # records skipped in the sequence (counted from seq jumps)
    duplicates: int = 0      # records whose seq was already received
    dropped: int = 0         # the client's latest cumulative drop count
    bye: Optional[dict[str, Any]] = None
    events: list[dict[str, Any]] = field(default_factory=list)
    hellos: int = 0
    hello: dict[str, Any] = field(default_factory=dict)     # the latest accepted hello
    columns: dict[str, list[int]] = field(default_factory=dict)


class SinkServer:
    """Selector-based single-thread receiver; see the module docstring."""

    def __init__(
        self,
        token: str,
        run: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        refuse: Optional[str] = None,
        keep_columns: bool = True,
    ) -> None:
        self.token = token
        self.run = run
        self.refuse = refuse
        self.keep_columns = keep_columns
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((host, port))
        self._lsock.listen(512)
        self._lsock.setblocking(False)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ, None)
        self._conns: dict[socket.socket, dict[str, Any]] = {}
        self._nonces: set[bytes] = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.ranks: dict[int, RankLog] = {}
        self.system: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.bad_frames = 0
        self.connections = 0

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "SinkServer":
        self._thread = threading.Thread(target=self.serve, name="traceml-sink", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every socket (clients see the connection close)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._close_all()

    def serve(self, until: Optional[float] = None, expect_byes: int = 0) -> None:
        while not self._stop.is_set():
            if until is not None and time.monotonic() >= until:
                break
            if expect_byes and self.byes() >= expect_byes:
                break
            for key, _ in self._sel.select(timeout=0.05):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
        if self._thread is None:
            self._close_all()

    def _close_all(self) -> None:
        for sock in list(self._conns):
            self._drop(sock)
        try:
            self._sel.unregister(self._lsock)
        except (KeyError, ValueError):
            pass
        self._lsock.close()

    # ---- connections ------------------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _ = self._lsock.accept()
        except OSError:
            return
        sock.setblocking(False)
        self._conns[sock] = {"fb": FrameBuffer(), "hello": None}
        self._sel.register(sock, selectors.EVENT_READ, "conn")
        self.connections += 1

    def _drop(self, sock: socket.socket) -> None:
        self._conns.pop(sock, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        try:
            sock.close()
        except OSError:
            pass

    def _read(self, sock: socket.socket) -> None:
        state = self._conns.get(sock)
        if state is None:
            return
        try:
            data = sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sock)
            return
        if not data:
            self._drop(sock)
            return
        try:
            for msg in state["fb"].feed(data):
                if state["hello"] is None:
                    if not self._handshake(sock, state, msg):
                        return
                else:
                    self._handle(state["hello"], msg)
        except ProtocolError:
            with self.lock:
                self.bad_frames += 1
            self._drop(sock)

    def _handshake(self, sock: socket.socket, state: dict[str, Any], hello: dict[str, Any]) -> bool:
        reason = None
        if hello.get("t") != "hello":
            reason = "the first frame must be a hello"
        elif hello.get("v") != PROTOCOL_VERSION:
            reason = f"protocol version {hello.get('v')} is not {PROTOCOL_VERSION}"
        elif hello.get("run") != self.run:
            reason = f"run name {hello.get('run')!r} is not this run ({self.run!r})"
        elif not verify_hello_mac(self.token, hello):
            reason = "the token does not match this run's token"
        elif abs(float(hello.get("ts", 0)) - time.time()) > HELLO_WINDOW_S:
            reason = "the hello's timestamp is outside the accepted clock window"
        elif bytes(hello.get("nonce", b"")) in self._nonces:
            reason = "replayed hello (nonce already seen)"
        elif self.refuse is not None:
            reason = self.refuse
        if reason is not None:
            with self.lock:
                self.refused.append(reason)
            try:
                sock.setblocking(True)
                sock.settimeout(1.0)
                sock.sendall(encode({"t": "refused", "reason": reason}))
            except OSError:
                pass
            self._drop(sock)
            return False
        self._nonces.add(bytes(hello["nonce"]))
        state["hello"] = hello
        try:
            sock.setblocking(True)
            sock.settimeout(1.0)
            sock.sendall(encode({"t": "welcome", "v": PROTOCOL_VERSION, "server_time": time.time()}))
            sock.setblocking(False)
        except OSError:
            self._drop(sock)
            return False
        with self.lock:
            log = self._rank(int(hello.get("rank", -1)))
            log.hellos += 1
            log.hello = {k: v for k, v in hello.items() if k not in ("mac", "nonce")}
        return True

    def _rank(self, rank: int) -> RankLog:
        log = self.ranks.get(rank)
        if log is None:
            log = self.ranks[rank] = RankLog()
        return log

    def _handle(self, hello: dict[str, Any], msg: dict[str, Any]) -> None:
        t = msg.get("t")
        with self.lock:
            if t == "steps":
                log = self._rank(int(msg["rank"]))
                seq, n = int(msg["seq"]), int(msg["n"])
                if seq > log.next_seq:
                    log.gaps += seq - log.next_seq
                elif seq < log.next_seq:
                    log.duplicates += min(n, log.next_seq - seq)
                log.next_seq = max(log.next_seq, seq + n)
                log.records += n
                log.frames += 1
                log.dropped = int(msg.get("dropped", 0))
                if self.keep_columns:
                    for name, values in msg["cols"].items():
                        log.columns.setdefault(name, []).extend(values)
            elif t == "system":
                self.system.append(msg)
            elif t == "event":
                self._rank(int(msg.get("rank", hello.get("rank", -1)))).events.append(msg)
            elif t == "bye":
                self._rank(int(msg.get("rank", hello.get("rank", -1)))).bye = msg

    # ---- queries --------------------------------------------------------------------------------

    def byes(self) -> int:
        with self.lock:
            return sum(1 for log in self.ranks.values() if log.bye is not None)

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if predicate(self):
                    return True
            time.sleep(0.01)
        with self.lock:
            return bool(predicate(self))

    def totals(self) -> dict[str, Any]:
        with self.lock:
            return {
                "connections": self.connections, "bad_frames": self.bad_frames,
                "refused": list(self.refused), "system_frames": len(self.system),
                "ranks": {
                    str(r): {
                        "records": log.records, "frames": log.frames, "gaps": log.gaps,
                        "duplicates": log.duplicates, "dropped": log.dropped,
                        "next_seq": log.next_seq, "hellos": log.hellos,
                        "bye": {k: v for k, v in (log.bye or {}).items() if k != "t"} or None,
                    }
                    for r, log in sorted(self.ranks.items())
                },
            }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traceml_core.wire.sink", description=__doc__)
    ap.add_argument("--token", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--expect-byes", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    server = SinkServer(args.token, args.run, host=args.host, port=args.port, keep_columns=False)
    signal.signal(signal.SIGTERM, lambda *_: server._stop.set())
    print(f"PORT {server.port}", flush=True)
    server.serve(until=time.monotonic() + args.timeout, expect_byes=args.expect_byes)
    server._close_all()
    print(json.dumps(server.totals()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
