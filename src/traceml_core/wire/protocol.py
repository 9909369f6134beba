"""TraceML wire protocol, version 1. Both ends import this module; nothing else defines frames.

Transport: TCP. Each frame is a 4-byte big-endian unsigned length followed by that many bytes of
one msgpack map. A frame longer than :data:`MAX_FRAME` is a protocol error: the receiver closes the
connection and counts it. Every map has a ``"t"`` key naming its type.

Handshake: the client's first frame is ``hello``; nothing else is accepted before the server
answers ``welcome`` (or ``refused`` with a reason, then closes). The hello proves knowledge of the
run's token without sending it: ``mac = HMAC-SHA256(token, canonical hello fields)`` over a fresh
16-byte nonce and a timestamp, so a captured hello cannot be replayed (the server remembers nonces
inside the accepted clock window and refuses a repeat or a stale timestamp).

Client → server frames after ``welcome``:

``steps``   ``{"t","rank","seq","n","cols","dropped"}``: ``n`` step records of one rank, columnar
            (``cols`` maps each of :data:`STEP_COLUMNS` to a list of ``n`` ints); ``seq`` is the
            per-rank sequence number of the first record (0-based, +1 per record), so the server
            counts gaps; ``dropped`` is the client's cumulative count of records it had to drop.
``system``  ``{"t","node","host","samples"}``: node-level samples (see :data:`SYSTEM_FIELDS`).
``event``   ``{"t","rank","kind","text","ts"}``: a notable event (warning, exception text).
            Kind ``step_source``: ``text`` is a JSON object saying how this rank's steps are
            found (see :func:`step_source`); the latest one counts, it is not a notable event.
``bye``     ``{"t","rank","status","steps","dropped","error","fail_step","fail_in_step"}``: a
            rank's clean or failed end; ``steps`` is the total number of records it produced;
            ``fail_step`` (int or null) is the index of the step a fatal error happened in
            (``fail_in_step`` true: it left that step's ``trace_step`` block, and that step is
            not recorded) or, raised between steps, of the step that would have come next.

Server → client: ``welcome`` ``{"t","v","server_time"}``, ``refused`` ``{"t","reason"}``.

Hello ``kind`` (the hello's ``node``/``rank`` fields are range-checked against the launch):

``rank``     a training process; ``rank`` is its global rank. Optional extra field ``local_rank``.
``node``     a node's ``traceml run`` launcher joining node 0 (how node 0 learns which nodes
             joined); ``rank`` is ignored (send -1). Optional extra field ``nproc`` (processes that
             node starts). A node may hold a few such connections (presence, system sampler);
             the last one closing without a ``bye`` before the run's ``finish`` means the node
             vanished.
``control``  node 0's own launcher (``node`` 0).

On a ``node`` connection: ``system`` frames (that node's sampler) and
``bye`` ``{"t","status","exit_code","workers","oom"}`` (no ``rank``): the node's launcher ended,
with its exit code and the node's **worker report** (see :func:`worker_report`): ``workers`` is
torchrun's outcome for each worker that failed (``{"rank","local_rank","pid","exitcode","signal",
"ts"}``, ``signal`` a name such as ``"SIGKILL"`` or null), ``oom`` the OOM kills the node's memory
cgroup counted during the run (``{"kills","limit_bytes","source"}``) or null where unreadable.

The same connection carries the node's **relay** stream (launcher/relay.py): the node's ranks
connect to their launcher, which checks their hellos exactly as the aggregator does and forwards
their ``steps``/``event``/``bye`` frames as they are (``steps`` frames of one rank whose ``seq``
ranges touch may be merged into one: ``seq`` of the first, ``n`` the sum, ``dropped`` the larger),
plus three frames of its own, all carrying the ``rank`` they concern:

``join``     ``{"t","rank","local_rank","host","pid","new"}``: the relay accepted this rank's
             hello; ``new`` is false when the relay only re-announces its connected ranks after
             re-establishing its own connection (not a reconnect of the rank).
``gone``     ``{"t","rank","relay_dropped","seq_end"}``: the rank's connection to the relay
             closed (after its ``bye``, or without one: it crashed or was killed). Treated like a
             direct rank connection closing; the relay's own connection closing means ``gone``
             for every rank it carried.
``dropped``  ``{"t","rank","relay_dropped","seq_end"}``: the relay's byte budget was full (node 0
             slow or unreachable) and it dropped ``relay_dropped`` step records of this rank so far
             (cumulative); ``seq_end`` is the seq after the last record it received from the rank,
             so records dropped at the very end still count as lost. Also carried by ``gone``.

A malformed relayed frame is counted and skipped; it does not close the node's connection.

On the ``control`` connection (launcher → aggregator):

``finish``  ``{"t","exit_code","interrupted","reason","failed_nodes","workers","oom"}``: training
            is over (``exit_code`` int, ``interrupted`` bool (SIGTERM/scancel/time limit),
            ``reason`` one line, ``failed_nodes`` list of node ranks the launcher saw fail or
            vanish, ``workers``/``oom`` node 0's worker report as in the node ``bye``). The
            aggregator drains what is in flight (bounded), writes the summary, answers
            ``finished`` ``{"t","summary_json","summary_txt","rebuilt"}`` (paths, or ``None`` with an
            ``"error"`` string) and exits.
``query``   ``{"t"}``: answered with ``status`` ``{"t","nodes_joined","ranks_connected",
            "ranks_seen","records","checkpoint_s"}`` (e.g. for the launcher's node-join wait).
``snapshot`` ``{"t","id","series","verdict"}``: for the live views (``--mode cli|dashboard``),
            answered with ``snapshot`` ``{"t","id","server_time","started_at","run_name",
            "world_size","nnodes","nproc_per_node","mode","records","finishing","ranks","system",
            "counters"}`` (+ ``"verdict"`` when asked; ``"error"`` instead of data if building it
            failed). ``id`` is echoed so a reply to a timed-out request is not mistaken for the
            next one. Per rank: identity, ``connected``, ``last_seen``/``closed_at`` (aggregator
            clock), ``bye`` status, counts, and ``recent`` (medians of its last records per phase
            in ms, steps/s, last peak memory, recent step times); with ``series`` also its
            whole-run step-time and peak-memory series. ``system``: the per-node running
            aggregates. Built by :func:`traceml_core.views.snapshot.snapshot_frame`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from typing import Any, Iterator, Optional

import msgpack

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
MAX_FRAME = 8 * 1024 * 1024
#: a hello is a few hundred bytes; nothing bigger is read from an unauthenticated peer
MAX_HELLO = 64 * 1024
#: what one recv_into reads at most (aggregator and relay)
RECV_SIZE = 256 * 1024
#: a hello whose timestamp differs from the server clock by more than this is refused
HELLO_WINDOW_S = 300.0

#: step record columns, all integers (nanoseconds, bytes); -1 means "not measured this step"
STEP_COLUMNS = (
    "step",          # user-visible step index (0-based count of trace_step entries on this rank)
    "t_end_ns",      # wall clock (time.time_ns) at step end
    "step_ns",       # whole step, from entering trace_step (or the input fetch before it) to exit
    "input_ns",      # waiting for the next batch (DataLoader / wrap_dataloader __next__) credited
                     # to this step; -1 when no such fetch was timed (a get_batch() function)
    "forward_ns",
    "backward_ns",
    "optimizer_ns",
    "h2d_ns",        # host-to-device copies (CUDA only)
    "mem_peak",      # peak memory during the step: CUDA allocator on GPU, process RSS on CPU
    # communication (sdk/comm.py; -1 throughout when not measured: no process group, or a DDP
    # model whose all-reduce cannot be timed). forward/backward/optimizer exclude comm_ns.
    "comm_ns",       # exposed communication: time the rank waited for collectives
    "comm_busy_ns",  # time at least one collective was in flight (union of launch..completion)
    "comm_bytes",    # collective sizes S as nccl-tests defines them, summed (algbw = bytes/busy)
    "comm_bus_bytes",  # each S times its op's bus factor, summed (busbw = bus_bytes/busy)
    "comm_calls",    # collectives launched in the step (DDP buckets + explicit calls)
)
#: the communication columns (all -1 together when communication is not measured)
COMM_COLUMNS = STEP_COLUMNS[STEP_COLUMNS.index("comm_ns"):]
SYSTEM_FIELDS = ("ts", "cpu_pct", "ram_used", "ram_total", "gpus")
GPU_FIELDS = ("index", "util_pct", "mem_used", "mem_total", "temp_c", "power_w")
RANK_STATUSES = ("clean", "error", "crashed", "vanished", "interrupted", "running")
#: how a rank's steps are found: the script's trace_step, inferred from optimizer steps (no
#: trace_step), or a framework's own hooks (traceml_core.integrations)
STEP_SOURCES = ("trace_step", "inferred", "lightning", "huggingface", "accelerate")


def step_source(text: str) -> Optional[dict[str, Any]]:
    """The ``step_source`` event's payload, validated: ``{"source"}`` (one of STEP_SOURCES) plus
    optional ``accumulation``/``backward_per_step`` (int >= 0), ``backward_steps`` ([int, int]),
    ``forward`` (bool), ``framework``/``note`` (short strings). None if it is not that."""
    import json

    if len(text) > 2000:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("source") not in STEP_SOURCES:
        return None
    out: dict[str, Any] = {"source": raw["source"]}
    for key in ("accumulation", "backward_per_step"):
        v = raw.get(key)
        if type(v) is int and 0 <= v < 1_000_000:
            out[key] = v
    bs = raw.get("backward_steps")
    if isinstance(bs, list) and len(bs) == 2 and all(type(x) is int and x >= 0 for x in bs):
        out["backward_steps"] = bs
    if type(raw.get("forward")) is bool:
        out["forward"] = raw["forward"]
    for key in ("framework", "note"):
        v = raw.get(key)
        if isinstance(v, str):
            out[key] = v[:200]
    return out


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


#: worker rows a node may report (more are dropped: torchrun reports failures of one node)
MAX_WORKER_ROWS = 1024


def worker_report(msg: dict[str, Any]) -> dict[str, Any]:
    """The validated worker report of a node ``bye`` or a ``finish``: ``{"workers": [...], "oom":
    {...} or None}``; missing fields are empty. Raises ProtocolError for wrong types."""
    rows = msg.get("workers") or []
    if type(rows) is not list:
        raise ProtocolError("workers must be a list")
    workers = []
    for w in rows[:MAX_WORKER_ROWS]:
        if type(w) is not dict:
            raise ProtocolError("a workers entry must be a map")
        rank, code = w.get("rank"), w.get("exitcode")
        if type(rank) is not int or type(code) is not int or rank < 0:
            raise ProtocolError("workers: rank and exitcode must be integers")
        sig = w.get("signal")
        ts = w.get("ts")
        workers.append({"rank": rank, "local_rank": w.get("local_rank") if type(w.get("local_rank")) is int else None,
                        "pid": w.get("pid") if type(w.get("pid")) is int else None, "exitcode": code,
                        "signal": sig[:32] if isinstance(sig, str) else None,
                        "ts": float(ts) if type(ts) in (int, float) else None})
    oom = msg.get("oom")
    if oom is not None:
        if type(oom) is not dict or type(oom.get("kills")) is not int or oom["kills"] < 0:
            raise ProtocolError("oom must be a map with an integer kills")
        limit = oom.get("limit_bytes")
        src = oom.get("source")
        oom = {"kills": oom["kills"], "limit_bytes": limit if type(limit) is int else None,
               "source": src[:200] if isinstance(src, str) else None}
    return {"workers": workers, "oom": oom}


def encode(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the maximum of {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        # (no max_buffer_size: unpackb does not take it; callers bound the body by MAX_FRAME)
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ProtocolError("frame is not a map with a string 't'")
    return msg


class FrameBuffer:
    """Incremental decoder for a byte stream: ``feed()`` bytes, iterate complete frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buf += data
        while True:
            if len(self._buf) < HEADER.size:
                return
            (length,) = HEADER.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise ProtocolError(f"length prefix {length} exceeds the maximum of {MAX_FRAME}")
            end = HEADER.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            yield decode_body(body)

    @property
    def pending(self) -> int:
        return len(self._buf)


def _canonical(fields: dict[str, Any]) -> bytes:
    keys = ("v", "run", "job", "node", "rank", "kind", "nonce", "ts")
    return msgpack.packb([fields.get(k) for k in keys], use_bin_type=True)


def make_hello(
    token: str,
    *,
    run: str,
    job: Optional[str],
    node: int,
    rank: int,
    kind: str = "rank",
    host: str = "",
    world: int = 0,
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Build a hello frame that proves knowledge of ``token`` (never sent itself)."""
    hello: dict[str, Any] = {
        "t": "hello", "v": PROTOCOL_VERSION, "run": run, "job": job, "node": node, "rank": rank,
        "kind": kind, "host": host, "world": world, "pid": os.getpid(),
        "nonce": os.urandom(16), "ts": time.time(),
    }
    if extra:
        hello.update(extra)
    hello["mac"] = hmac.new(token.encode(), _canonical(hello), hashlib.sha256).digest()
    return hello


def verify_hello_mac(token: str, hello: dict[str, Any]) -> bool:
    mac = hello.get("mac")
    if not isinstance(mac, (bytes, bytearray)):
        return False
    want = hmac.new(token.encode(), _canonical(hello), hashlib.sha256).digest()
    return hmac.compare_digest(bytes(mac), want)
