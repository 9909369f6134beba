"""Test peers for the aggregator: real TCP clients speaking the real wire protocol.

These are deliberately independent of the SDK's client so the aggregator's tests do not depend
on it; they build frames with wire/protocol.py and wire/auth.py, exactly as any client must.
Ranks reach the aggregator only through a node's relay: :func:`node` starts a real
:class:`~traceml_core.launcher.relay.Relay` joined to a real aggregator, and :class:`RankPeer`
connects to it as a training process would. :class:`NodePeer` speaks to the aggregator as a
relay does (for the aggregator's own input checks).
"""

from __future__ import annotations

import pytest

import socket
import time
from pathlib import Path
from typing import Any, Optional

from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.statistics.window import WindowStats
from traceml_core.wire.auth import AGGREGATOR, make_hello, relay_aud
from traceml_core.wire.fold import fold_frame
from traceml_core.wire.frames import validate
from traceml_core.wire.protocol import HEADER, FrameBuffer, decode_body, encode

TOKEN = "test-token-0123456789"
RUN = "test-run"
MS = 1_000_000


def make_settings(tmp_path: Path, **kw: Any) -> AggregatorSettings:
    base: dict[str, Any] = dict(run_name=RUN, token=TOKEN, run_dir=tmp_path / "logs" / RUN, port=0,
                                nnodes=1, nproc_per_node=2, drain_s=0.5, checkpoint_interval_s=0.2,
                                launcher_lost_grace_s=1.0, term_grace_s=3.0, job_id="42")
    base.update(kw)
    return AggregatorSettings(**base)


def columns(n: int, seq: int = 0, *, step_ms: float = 10.0, input_ms: float = 1.0,
            forward_ms: float = 3.0, backward_ms: float = 4.0, optimizer_ms: float = 1.0,
            h2d_ms: Optional[float] = None, mem: int = 100 * 1024 * 1024, mem_growth: int = 0,
            t0_ns: Optional[int] = None, gap_ms: float = 0.0, comm_ms: Optional[float] = None,
            comm_busy_ms: Optional[float] = None, comm_bytes: Optional[int] = None,
            comm_bus_bytes: Optional[int] = None, comm_calls: Optional[int] = None,
            ) -> dict[str, list[int]]:
    """``n`` step records starting at record ``seq``, with constant phase times (communication
    not measured unless given)."""
    t0 = t0_ns if t0_ns is not None else time.time_ns()
    period = int((step_ms + gap_ms) * MS)

    def c(v: Optional[float]) -> list[int]:
        return [-1] * n if v is None else [int(v * MS)] * n

    return {
        "step": list(range(seq, seq + n)),
        "t_end_ns": [t0 + (seq + i) * period for i in range(n)],
        "step_ns": c(step_ms), "input_ns": c(input_ms), "forward_ns": c(forward_ms),
        "backward_ns": c(backward_ms), "optimizer_ns": c(optimizer_ms), "h2d_ns": c(h2d_ms),
        "mem_peak": [mem + (seq + i) * mem_growth for i in range(n)],
        "comm_ns": c(comm_ms), "comm_busy_ns": c(comm_busy_ms),
        "comm_bytes": [-1 if comm_bytes is None else comm_bytes] * n,
        "comm_bus_bytes": [-1 if comm_bus_bytes is None else comm_bus_bytes] * n,
        "comm_calls": [-1 if comm_calls is None else comm_calls] * n,
    }


def folded(msg: dict[str, Any]) -> dict[str, Any]:
    """The ``fold`` frame a relay sends for a (merged) ``steps`` frame: the window's statistics."""
    value = WindowStats.of_columns(msg["seq"], msg["cols"])
    return fold_frame(msg["rank"], value, msg.get("dropped", 0), msg.get("open"))


def relayed(msg: dict[str, Any]) -> dict[str, Any]:
    """What node 0 takes in for a ``steps`` frame: its window's ``fold`` frame, through the wire
    encoding and node 0's trust boundary (for feeding a RankState in-process)."""
    return validate("node", decode_body(encode(folded(msg))[HEADER.size:]))


class Peer:
    """A raw TCP client of the aggregator."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.frames = FrameBuffer()
        self.pending: list[dict[str, Any]] = []

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(encode(msg))

    def recv(self, timeout: float = 5.0) -> Optional[dict[str, Any]]:
        """Next frame, or None when the server closed the connection."""
        self.sock.settimeout(timeout)
        while not self.pending:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.pending.extend(self.frames.feed(data))
        return self.pending.pop(0)

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


class RankPeer(Peer):
    """A simulated training rank, at its node's relay (``port`` is the relay's)."""

    def __init__(self, port: int, rank: int, *, node: int = 0, token: str = TOKEN, run: str = RUN,
                 job: Optional[str] = "42", hello: bool = True, aud: Optional[str] = None,
                 kind: str = "rank", **hello_kw: Any) -> None:
        super().__init__(port)
        self.rank = rank
        self.seq = 0
        self.reply: Optional[dict[str, Any]] = None
        if hello:
            self.send(make_hello(token, aud=aud or relay_aud(node), run=run, job=job, node=node,
                                 rank=rank, kind=kind, host=f"host{node}", **hello_kw))
            self.reply = self.recv()

    @property
    def welcomed(self) -> bool:
        return bool(self.reply) and self.reply.get("t") == "welcome"  # type: ignore[union-attr]

    def steps(self, n: int, *, seq: Optional[int] = None, dropped: int = 0, **kw: Any) -> None:
        seq = self.seq if seq is None else seq
        self.send({"t": "steps", "rank": self.rank, "seq": seq, "n": n,
                   "cols": columns(n, seq, **kw), "dropped": dropped})
        self.seq = seq + n

    def bye(self, status: str = "clean", error: Optional[str] = None, dropped: int = 0,
            close: bool = True) -> None:
        """The rank's goodbye; like the SDK, it then closes its connection."""
        self.send({"t": "bye", "rank": self.rank, "status": status, "steps": self.seq,
                   "dropped": dropped, "error": error})
        if close:
            self.close()


class NodePeer(Peer):
    """A raw relay: kind ``node`` at the aggregator, sending relay frames by hand."""

    def __init__(self, port: int, node: int = 0, *, token: str = TOKEN, run: str = RUN,
                 job: Optional[str] = "42", kind: str = "node", hello: bool = True,
                 **hello_kw: Any) -> None:
        super().__init__(port)
        self.node = node
        self.seqs: dict[int, int] = {}
        self.reply: Optional[dict[str, Any]] = None
        if hello:
            hello_kw.setdefault("host", f"host{node}")
            self.send(make_hello(token, aud=AGGREGATOR, run=run, job=job, node=node, rank=-1,
                                 kind=kind, **hello_kw))
            self.reply = self.recv()

    @property
    def welcomed(self) -> bool:
        return bool(self.reply) and self.reply.get("t") == "welcome"  # type: ignore[union-attr]

    def join(self, rank: int, local_rank: int = 0) -> None:
        self.send({"t": "join", "rank": rank, "local_rank": local_rank, "host": f"host{self.node}",
                   "pid": 1000 + rank, "new": True})

    def steps(self, rank: int, n: int, *, seq: Optional[int] = None, **kw: Any) -> None:
        """``n`` records of ``rank`` as a relay sends them: their window's ``fold`` frame."""
        seq = self.seqs.get(rank, 0) if seq is None else seq
        self.send(folded({"t": "steps", "rank": rank, "seq": seq, "n": n, "cols": columns(n, seq, **kw),
                          "dropped": 0}))
        self.seqs[rank] = seq + n

    def rank_bye(self, rank: int, status: str = "clean", error: Optional[str] = None) -> None:
        self.send({"t": "bye", "rank": rank, "status": status, "steps": self.seqs.get(rank, 0),
                   "dropped": 0, "error": error})

    def gone(self, rank: int) -> None:
        self.send({"t": "gone", "rank": rank, "relay_dropped": 0, "seq_end": self.seqs.get(rank, 0),
                   "open": 0})

    def bye(self, status: str = "clean", exit_code: int = 0) -> None:
        self.send({"t": "bye", "status": status, "exit_code": exit_code})


def node(handle: Any, node: int = 0, **kw: Any) -> Any:
    """A real relay for ``node``, joined to the aggregator ``handle`` (its settings give the run)."""
    from traceml_core.launcher.relay import Relay

    s = handle.settings
    kw.setdefault("client_options", {"backoff_initial": 0.02, "backoff_max": 0.2})
    kw.setdefault("flush_s", 0.05)
    # as `traceml run` does (launcher/nodelink.py): in the live modes the relay sends each
    # window's last records beside its statistics (the live views show them)
    kw.setdefault("tail", s.mode != "summary")
    relay = Relay(token=s.token, run_name=s.run_name, job_id=s.job_id, node=node, nnodes=s.nnodes,
                  nproc_per_node=s.nproc_per_node, upstream=(handle.connect_host, handle.port),
                  hostname=f"host{node}", **kw).start()
    assert relay.wait_connected(5.0), relay.client.stats()
    return relay


def end_node(relay: Any, node: int = 0, drain_s: float = 5.0) -> None:
    """What the node's launcher does at the end: node 0 drains before ``finish``; others say bye."""
    relay.drain(drain_s)
    if node == 0:
        relay.run_ended()
    else:
        relay.close(3.0, bye={"t": "bye", "status": "clean", "exit_code": 0})


class Rig:
    """A real aggregator with a real relay per node, as ``traceml run`` sets them up. ``port`` is
    node 0's relay (where its ranks connect); everything else is the aggregator handle's."""

    def __init__(self, handle: Any, nodes: int) -> None:
        self.handle = handle
        self.relays = {n: node(handle, n) for n in range(nodes)}

    @property
    def port(self) -> int:
        return self.relays[0].port

    def relay_port(self, n: int) -> int:
        return self.relays[n].port

    def finish(self, *args: Any, **kw: Any) -> Any:
        """What the launchers do at the end: other nodes say bye, node 0 drains and finishes."""
        for n, r in sorted(self.relays.items(), reverse=True):
            end_node(r, n, drain_s=1.0)  # a peer a test left open would hold a real drain
        try:
            return self.handle.finish(*args, **kw)
        finally:
            for r in self.relays.values():
                r.close(1.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


@pytest.fixture
def rig(aggregator):
    """``rig(**settings)``: an aggregator and one relay per node (see :class:`Rig`)."""
    rigs = []

    def start(**kw: Any) -> Rig:
        r = Rig(aggregator(**kw), kw.get("nnodes", 1))
        rigs.append(r)
        return r

    yield start
    for r in rigs:
        for relay in r.relays.values():
            relay.close(0.5)


@pytest.fixture
def aggregator(tmp_path):
    """A real aggregator process; yields a factory taking settings overrides. Shared by the unit
    and fault suites (each conftest imports it)."""
    from traceml_core.aggregator.process import start_aggregator

    handles = []

    def start(**kw):
        h = start_aggregator(make_settings(tmp_path, **kw))
        handles.append(h)
        return h

    yield start
    for h in handles:
        if h.alive():
            h.kill()
