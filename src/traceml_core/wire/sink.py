"""A receiver that stands in for a node's relay, for exercising senders without a launcher.

Not a relay: it forwards nothing and computes no statistics. It is a
:class:`~traceml_core.wire.server.FramedServer` with a small handler that checks hellos exactly as
a relay does (:func:`~traceml_core.wire.auth.check_hello` for endpoint ``relay:<node>``, any node)
and records what arrived, per rank: records, sequence gaps, the last ``dropped`` value, events and
``bye``. Tests run it in a thread; benchmarks run it as a separate process so it does not share the
sender's GIL::

    python -m traceml_core.wire.sink --token T --run R [--port 0] [--expect-byes N] [--timeout S]

prints ``PORT <n>`` once listening, and one JSON line of totals when done (after ``N`` byes, the
timeout, SIGTERM or end of stdin).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .auth import Endpoint, Identity, NonceCache, check_hello, relay_aud
from .frames import bind_rank, validate
from .server import Conn, FramedServer, Handler, listen


@dataclass
class RankLog:
    """What one rank delivered."""

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


class SinkServer(Handler):
    """See the module docstring."""

    def __init__(self, token: str, run: str, *, host: str = "127.0.0.1", port: int = 0,
                 refuse: Optional[str] = None, keep_columns: bool = True, nnodes: int = 1 << 16,
                 nproc_per_node: int = 1 << 16) -> None:
        self.token = token
        self.run = run
        self.refuse = refuse
        self.keep_columns = keep_columns
        self._nnodes, self._nproc = nnodes, nproc_per_node
        self._nonces = NonceCache()
        self.counters: dict[str, int] = {}
        self.net = FramedServer(listen(host, port, 512), self, counters=self.counters,
                                log=lambda _msg: None, name="sink")
        self.host, self.port = self.net.listener.getsockname()[:2]
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.ranks: dict[int, RankLog] = {}
        self.refused: list[str] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        return self.counters["connections"]

    @property
    def bad_frames(self) -> int:
        return self.counters["malformed"]

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

    def serve(self, until: Optional[float] = None, expect_byes: int = 0) -> None:
        try:
            while not self._stop.is_set():
                if until is not None and time.monotonic() >= until:
                    break
                if expect_byes and self.byes() >= expect_byes:
                    break
                self.net.step(0.05)
        finally:
            self.net.close_all()

    # ---- the handler ----------------------------------------------------------------------------
    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Union[Identity, str]:
        node = msg.get("node")
        ep = Endpoint(aud=relay_aud(node if type(node) is int else 0), run=self.run, job=msg.get("job"),
                      keys={"rank": self.token}, nnodes=self._nnodes, nproc_per_node=self._nproc)
        result = check_hello(msg, ep, self._nonces)
        if isinstance(result, Identity) and self.refuse is not None:
            result = self.refuse
        if isinstance(result, str):
            with self.lock:
                self.refused.append(result)
            return result
        with self.lock:
            log = self._rank(result.rank)
            log.hellos += 1
            log.hello = {k: v for k, v in msg.items() if k not in ("mac", "nonce")}
        return result

    def on_accept(self, conn: Conn) -> None:
        pass

    def on_close(self, conn: Conn) -> None:
        pass

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        assert conn.ident is not None
        bind_rank(msg, conn.ident.rank)
        msg = validate("rank", msg)  # type: ignore[assignment]
        if msg is None:
            return
        t = msg["t"]
        with self.lock:
            log = self._rank(msg["rank"])
            if t == "steps":
                seq, n = msg["seq"], msg["n"]
                if seq > log.next_seq:
                    log.gaps += seq - log.next_seq
                elif seq < log.next_seq:
                    log.duplicates += min(n, log.next_seq - seq)
                log.next_seq = max(log.next_seq, seq + n)
                log.records += n
                log.frames += 1
                log.dropped = msg.get("dropped") or 0
                if self.keep_columns:
                    for name, values in msg["cols"].items():
                        log.columns.setdefault(name, []).extend(values)
            elif t == "event":
                log.events.append(msg)
            elif t == "bye":
                log.bye = msg

    def _rank(self, rank: int) -> RankLog:
        log = self.ranks.get(rank)
        if log is None:
            log = self.ranks[rank] = RankLog()
        return log

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
                "refused": list(self.refused),
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
    print(json.dumps(server.totals()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
