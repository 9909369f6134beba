"""Test peers for the aggregator: real TCP clients speaking the real wire protocol.

These are deliberately independent of the SDK's client so the aggregator's tests do not depend
on it; they build frames with wire/protocol.py, exactly as any client must.
"""

from __future__ import annotations

import pytest

import socket
import time
from pathlib import Path
from typing import Any, Optional

from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.wire.protocol import FrameBuffer, encode, make_hello

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
    """A simulated training rank."""

    def __init__(self, port: int, rank: int, *, node: int = 0, token: str = TOKEN, run: str = RUN,
                 job: Optional[str] = "42", hello: bool = True, **hello_kw: Any) -> None:
        super().__init__(port)
        self.rank = rank
        self.seq = 0
        self.reply: Optional[dict[str, Any]] = None
        if hello:
            self.send(make_hello(token, run=run, job=job, node=node, rank=rank, host=f"host{node}",
                                 **hello_kw))
            self.reply = self.recv()

    @property
    def welcomed(self) -> bool:
        return bool(self.reply) and self.reply.get("t") == "welcome"  # type: ignore[union-attr]

    def steps(self, n: int, *, seq: Optional[int] = None, dropped: int = 0, **kw: Any) -> None:
        seq = self.seq if seq is None else seq
        self.send({"t": "steps", "rank": self.rank, "seq": seq, "n": n,
                   "cols": columns(n, seq, **kw), "dropped": dropped})
        self.seq = seq + n

    def bye(self, status: str = "clean", error: Optional[str] = None, dropped: int = 0) -> None:
        self.send({"t": "bye", "rank": self.rank, "status": status, "steps": self.seq,
                   "dropped": dropped, "error": error})


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
