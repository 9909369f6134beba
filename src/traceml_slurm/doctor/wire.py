"""Coordinator <-> agent messages, on the framing and hello of ``traceml_core.wire.protocol``.

Each agent connects to the coordinator and sends a protocol-v1 ``hello`` (kind ``"doctor"``) whose
HMAC proves it knows the doctor's token: a fresh random value the coordinator made and handed to
the agents in the srun environment (``TRACEML_DOCTOR_TOKEN``), never sent on the wire. The
coordinator answers ``welcome`` or ``refused`` like the aggregator does. It does not apply the
hello's clock window: measuring clock skew is one of the checks, so a skewed node must still be
heard. After that, frames are maps whose ``t`` starts with ``d.``; the coordinator sends one
command at a time to an agent and waits (bounded) for its answer:

=================  ===========================================  =====================================
coordinator sends  meaning                                      agent answers
=================  ===========================================  =====================================
(agent first)      ``d.local``: outcomes of the node checks, facts (versions, config, addresses)
``d.clock``        read your clock                              ``d.clock`` ``now``
``d.listen``       listen on these ports (node 0)               ``d.listening`` per-port result, nonce
``d.probe``        connect to these host:ports                  ``d.probed`` per-target result
``d.unlisten``     close the listeners                          ``d.unlistened``
``d.fs-write``     write a nonce file in your logs dir          ``d.fs-written``
``d.fs-read``      read that file from your logs dir            ``d.fs-read``
``d.fs-clean``     remove it                                    ``d.fs-cleaned``
``d.torch``        run a gloo / nccl probe                      ``d.torch`` result
``d.agg-start``    node 0: start the real aggregator            ``d.agg-started`` ok, port
``d.agg-send``     send test step records to it                 ``d.agg-sent`` ok or stage + detail
``d.agg-finish``   node 0: finish it, read the summary          ``d.agg-finished`` ranks in the summary
``d.bye``          end                                          (closes)
=================  ===========================================  =====================================
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import selectors
import socket
import time
from typing import Any, Iterable, Optional

from traceml_core.wire.protocol import FrameBuffer, ProtocolError, encode

ENV_ADDR = "TRACEML_DOCTOR_ADDR"
ENV_TOKEN = "TRACEML_DOCTOR_TOKEN"
ENV_OPTS = "TRACEML_DOCTOR_OPTS"
#: TEST HOOK ONLY: ``node2=120,node3=-5`` adds seconds to that node's clock reading in d.clock.
#: Linux time namespaces cannot offset CLOCK_REALTIME, so a real per-node skew cannot be made on one
#: machine; this lets the cluster tests exercise the clock-skew check end to end.
ENV_CLOCK_HOOK = "TRACEML_DOCTOR_TEST_CLOCK_OFFSET"
HELLO_KIND = "doctor"


class Link:
    """A framed TCP connection with deadlines (monotonic seconds)."""

    def __init__(self, sock: socket.socket, name: str = "?") -> None:
        self.sock = sock
        self.name = name
        self.buf = FrameBuffer()
        self.frames: collections.deque[dict[str, Any]] = collections.deque()
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.settimeout(10.0)
        self.sock.sendall(encode(msg))

    def pump(self) -> None:
        """Read what is available now (the socket is readable) into ``frames``."""
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
            self.frames.extend(self.buf.feed(data))
        except ProtocolError:
            self.closed = True

    def recv(self, deadline: float) -> Optional[dict[str, Any]]:
        """The next frame, or None when the deadline passes or the peer closes."""
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                return None
            except OSError:
                self.closed = True
                return None
            if not data:
                self.closed = True
                return None
            try:
                self.frames.extend(self.buf.feed(data))
            except ProtocolError:
                self.closed = True
                return None
        return self.frames.popleft()

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def gather(links: Iterable[Link], deadline: float) -> dict[str, dict[str, Any]]:
    """One frame from each link, all read in parallel, until ``deadline``: ``{link.name: frame}``."""
    want = {ln.name: ln for ln in links if not ln.closed}
    got: dict[str, dict[str, Any]] = {}
    for name, ln in list(want.items()):
        if ln.frames:
            got[name] = ln.frames.popleft()
            del want[name]
    if not want:
        return got
    sel = selectors.DefaultSelector()
    for ln in want.values():
        sel.register(ln.sock, selectors.EVENT_READ, ln)
    try:
        while want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                ln = key.data
                ln.pump()
                if ln.frames:
                    got[ln.name] = ln.frames.popleft()
                if ln.name in got or ln.closed:
                    sel.unregister(ln.sock)
                    del want[ln.name]
    finally:
        sel.close()
    return got


def aggregator_token(doctor_token: str) -> str:
    """The token of the test aggregator (cross.aggregator), derived from the doctor's token so that
    every agent knows it and it never crosses the network."""
    return hmac.new(doctor_token.encode(), b"traceml-doctor-aggregator", hashlib.sha256).hexdigest()[:32]


def parse_clock_hook(text: str, node: str) -> float:
    for item in (text or "").split(","):
        name, _, secs = item.partition("=")
        if name.strip() == node:
            try:
                return float(secs)
            except ValueError:
                return 0.0
    return 0.0
