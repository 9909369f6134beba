"""The hello: how a connection proves it belongs to the run, and how every endpoint checks it.

One rule for every endpoint (aggregator, relay, doctor coordinator): :func:`check_hello` against an
:class:`Endpoint` that says what this endpoint accepts. In order:

1. a map of type ``hello`` of this protocol version (a version mismatch is named: it is not a
   secret, and it is the usual mistake: two traceml versions in one job);
2. the MAC, recomputed with this endpoint's own run name, job and endpoint name in place of the
   hello's and with the key of the claimed kind (:attr:`Endpoint.keys`; a kind this endpoint does
   not serve has no key). Anything wrong so far - token, run name, job, endpoint, kind, a tampered
   field - gets the same refusal, so a stranger learns nothing from probing;
3. only then, for a peer that holds the key: the clock window, the nonce (replay), the node and
   rank ranges. Only MAC-verified nonces enter the replay cache.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

import msgpack

from .protocol import HELLO_WINDOW_S, PROTOCOL_VERSION, host_name

#: the one refusal for anything that fails before the MAC is verified
AUTH_FAILED = ("authentication failed: this hello was not signed with this run's token for this run "
               "and endpoint (check TRACEML_TOKEN and --run-name on every node)")


def _canonical(fields: Mapping[str, Any]) -> bytes:
    return msgpack.packb(sorted((k, v) for k, v in fields.items() if k != "mac"), use_bin_type=True)


def hello_mac(key: str, fields: Mapping[str, Any]) -> bytes:
    return hmac.new(key.encode(), _canonical(fields), hashlib.sha256).digest()


def make_hello(
    key: str,
    *,
    aud: str,
    run: str,
    job: Optional[str],
    node: int,
    rank: int,
    kind: str,
    host: str = "",
    world: int = 0,
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """A hello for endpoint ``aud`` that proves knowledge of ``key`` (never sent itself)."""
    hello: dict[str, Any] = {
        "t": "hello", "v": PROTOCOL_VERSION, "aud": aud, "run": run, "job": job, "node": node,
        "rank": rank, "kind": kind, "host": host, "world": world, "pid": os.getpid(),
        "nonce": os.urandom(16), "ts": time.time(),
    }
    if extra:
        hello.update({k: v for k, v in extra.items() if k not in hello})
    hello["mac"] = hello_mac(key, hello)
    return hello


@dataclass(frozen=True)
class Identity:
    """Who an accepted connection is."""

    kind: str
    node: int
    rank: int            # global rank for kind "rank", else -1
    host: str
    pid: Optional[int]
    local_rank: Optional[int] = None   # kind "rank"
    nproc: Optional[int] = None        # kind "node": processes that node starts

    def label(self) -> str:
        if self.kind == "group":
            return f"group relay (node {self.node})"
        return f"rank {self.rank}" if self.kind == "rank" else f"{self.kind} (node {self.node})"


@dataclass(frozen=True)
class Endpoint:
    """What one endpoint accepts: its name (``aud``), the run, and a key per hello kind."""

    aud: str
    run: str
    job: Optional[str]
    keys: Mapping[str, str]
    nnodes: int = 1
    nproc_per_node: int = 1
    #: a relay serves the ranks of its own node only
    node: Optional[int] = None
    #: a group relay (launcher/grouprelay.py) serves the relays of its group's nodes only
    nodes: Optional[range] = None
    #: nodes per group relay (0: no group relays): a ``group`` hello comes from a group's first
    #: node (a multiple of it)
    fan_in: int = 0
    #: None: no clock window (the doctor measures clock skew, so a skewed node must be heard)
    window_s: Optional[float] = HELLO_WINDOW_S
    extra_refusals: Mapping[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


class NonceCache:
    """Nonces of accepted hellos, remembered for ``2 * window`` seconds (a replay after that is
    stale anyway: it carries the original timestamp)."""

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


def check_hello(msg: dict[str, Any], ep: Endpoint, nonces: NonceCache,
                now: Optional[float] = None) -> Union[Identity, str]:
    """The connection's :class:`Identity`, or the reason to refuse it (see the module docstring)."""
    now = time.time() if now is None else now
    if msg.get("t") != "hello":
        return "the first frame must be a hello"
    v = msg.get("v")
    if v != PROTOCOL_VERSION:
        return (f"protocol version {str(v)[:20]} is not supported: this endpoint speaks version "
                f"{PROTOCOL_VERSION} (install the same traceml version on every node)")
    kind = msg.get("kind")
    key = ep.keys.get(kind) if isinstance(kind, str) else None
    mac = msg.get("mac")
    if key is None or not isinstance(mac, (bytes, bytearray)):
        return AUTH_FAILED
    claimed = dict(msg)
    claimed["aud"], claimed["run"], claimed["job"] = ep.aud, ep.run, ep.job
    try:
        want = hello_mac(key, claimed)
    except Exception:  # unpackable values: not ours
        return AUTH_FAILED
    if not hmac.compare_digest(bytes(mac), want):
        return AUTH_FAILED
    # --- the peer holds the key: reasons may be specific from here on ---
    ts = msg.get("ts")
    if ep.window_s is not None and (type(ts) not in (int, float) or abs(now - ts) > ep.window_s):
        return (f"stale hello timestamp (more than {ep.window_s:.0f} s from this node's clock: "
                "check the clocks, or a captured hello is being replayed)")
    nonce = msg.get("nonce")
    if not isinstance(nonce, (bytes, bytearray)) or len(nonce) < 8:
        return "hello without a valid nonce"
    nonce = bytes(nonce)
    if nonces.seen(nonce):
        return "replayed hello refused (this nonce was already used)"
    node = msg.get("node")
    if not _int_in(node, 0, ep.nnodes):
        return f"node rank {node!r} is outside 0..{ep.nnodes - 1} (check --nnodes / --node-rank)"
    if ep.node is not None and node != ep.node:
        return f"hello for node {node} at node {ep.node}'s {ep.aud} (check --node-rank on this node)"
    if ep.nodes is not None and node not in ep.nodes:
        return (f"hello for node {node} at the group relay of nodes {ep.nodes.start}.."
                f"{ep.nodes.stop - 1} (check --node-rank on this node)")
    if kind == "group" and (not ep.fan_in or node % ep.fan_in):
        return (f"a group relay on node {node}, but this run's group relays are on every "
                f"{ep.fan_in}th node" if ep.fan_in else "this run has no group relays")
    if kind == "control" and node != 0:
        return "a control connection comes from node 0 only"
    rank = msg.get("rank")
    if kind == "rank":
        if not _int_in(rank, 0, ep.world_size):
            return (f"rank {rank!r} is outside 0..{ep.world_size - 1} "
                    f"({ep.nnodes} node(s) x {ep.nproc_per_node} processes)")
        if ep.node is not None and rank // ep.nproc_per_node != node:
            return (f"rank {rank} is not one of node {node}'s ranks "
                    f"({node * ep.nproc_per_node}..{(node + 1) * ep.nproc_per_node - 1})")
    else:
        rank = -1
    nonces.add(nonce, now)
    host, pid = msg.get("host"), msg.get("pid")
    local_rank, nproc = msg.get("local_rank"), msg.get("nproc")
    return Identity(
        kind=kind, node=node, rank=rank,
        host=host_name(host),
        pid=pid if type(pid) is int else None,
        local_rank=local_rank if type(local_rank) is int else None,
        nproc=nproc if type(nproc) is int else None,
    )


def relay_aud(node: int) -> str:
    return f"relay:{node}"


def group_aud(group: int) -> str:
    """The endpoint name of group ``group``'s relay (launcher/grouprelay.py)."""
    return f"group:{group}"


AGGREGATOR = "aggregator"
