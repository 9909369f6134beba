"""Checking a ``hello``: version, run, kind, HMAC, freshness and replay, in that order.

The refusal reasons go back to the client (which logs them) and to our stderr. They never echo
this aggregator's run name or anything derived from the token, so a stranger probing the port
learns nothing but "not for you". The MAC is checked before the nonce is remembered, so only
holders of the token can fill the replay cache; entries expire after twice the clock window
(a replayed hello carries the original timestamp, so it is stale by then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from ..wire.protocol import HELLO_WINDOW_S, PROTOCOL_VERSION, verify_hello_mac
from .settings import AggregatorSettings

KINDS = ("rank", "node", "control")


@dataclass(frozen=True)
class Identity:
    """Who an accepted connection is."""

    kind: str  # "rank" (a training process), "node" (a node's launcher), "control" (node 0's launcher)
    node: int
    rank: int  # global rank for kind "rank", else -1
    host: str
    pid: Optional[int]
    local_rank: Optional[int]  # hello extra, kind "rank"
    nproc: Optional[int]  # hello extra, kind "node": processes that node starts


class NonceCache:
    """Nonces of accepted hellos, remembered for ``2 * window`` seconds."""

    def __init__(self, window: float = HELLO_WINDOW_S) -> None:
        self.window = window
        self._seen: dict[bytes, float] = {}
        self._next_prune = 0.0

    def seen(self, nonce: bytes) -> bool:
        return nonce in self._seen

    def add(self, nonce: bytes, now: float) -> None:
        if now >= self._next_prune:
            horizon = now - 2 * self.window
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
            self._next_prune = now + self.window / 10
        self._seen[nonce] = now

    def __len__(self) -> int:
        return len(self._seen)


def _int_in(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value < hi


def check_hello(msg: dict[str, Any], settings: AggregatorSettings, nonces: NonceCache,
                now: float) -> Union[Identity, str]:
    """Return the connection's :class:`Identity`, or the reason to refuse it."""
    if msg.get("t") != "hello":
        return "the first frame must be a hello"
    v = msg.get("v")
    if v != PROTOCOL_VERSION:
        return (f"protocol version {v!r} is not supported: this aggregator speaks version "
                f"{PROTOCOL_VERSION} (install the same traceml version on every node)")
    run = msg.get("run")
    if run != settings.run_name:
        return (f"hello is for run {str(run)[:140]!r}, but this aggregator serves another run "
                "(check --run-name / TRACEML_RUN_NAME on every node)")
    kind = msg.get("kind")
    if kind not in KINDS:
        return f"unknown hello kind {str(kind)[:40]!r} (expected one of {', '.join(KINDS)})"
    if not verify_hello_mac(settings.token, msg):
        return "authentication failed: the hello was not signed with this run's token"
    ts = msg.get("ts")
    if type(ts) not in (int, float) or abs(now - ts) > HELLO_WINDOW_S:
        return (f"stale or missing hello timestamp (more than {HELLO_WINDOW_S:.0f} s from this "
                "node's clock: check the clocks, or a captured hello is being replayed)")
    nonce = msg.get("nonce")
    if not isinstance(nonce, (bytes, bytearray)) or len(nonce) < 8:
        return "hello without a valid nonce"
    nonce = bytes(nonce)
    if nonces.seen(nonce):
        return "replayed hello refused (this nonce was already used)"
    job = msg.get("job")
    if settings.job_id and job and str(job) != str(settings.job_id):
        return f"hello is for job {str(job)[:40]!r}, but this aggregator serves another job"
    node = msg.get("node")
    if not _int_in(node, 0, settings.nnodes):
        return f"node rank {node!r} is outside 0..{settings.nnodes - 1} (check --nnodes / --node-rank)"
    rank = msg.get("rank")
    if kind == "rank":
        if not _int_in(rank, 0, settings.world_size):
            return (f"rank {rank!r} is outside 0..{settings.world_size - 1} "
                    f"({settings.nnodes} node(s) x {settings.nproc_per_node} processes)")
    else:
        rank = -1
    host = msg.get("host")
    pid = msg.get("pid")
    local_rank = msg.get("local_rank")
    nproc = msg.get("nproc")
    nonces.add(nonce, now)
    return Identity(
        kind=kind, node=node, rank=rank,
        host=host[:255] if isinstance(host, str) else "",
        pid=pid if type(pid) is int else None,
        local_rank=local_rank if type(local_rank) is int else None,
        nproc=nproc if type(nproc) is int else None,
    )
