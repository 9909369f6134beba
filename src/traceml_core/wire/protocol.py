"""TraceML wire protocol, version 4. Both ends import this module; nothing else defines frames.

Transport: TCP. Each frame is a 4-byte big-endian unsigned length followed by that many bytes of
one msgpack map. A frame longer than :data:`MAX_FRAME` (:data:`MAX_HELLO` before the hello is
accepted) is a protocol error: the receiver closes the connection and counts it. Every map has a
``"t"`` key naming its type. Each frame type has exactly one validator (wire/frames.py), applied
where the frame enters from a peer: at a node's relay for a rank's frames, at the aggregator for a
relay's or the launcher's frames, at the client for the server's answers.

Route: a training rank talks only to its own node's **relay** (a thread of that node's
``traceml run`` launcher, on loopback); each relay holds one connection to the **aggregator** on
node 0 (from hundreds of nodes on, to its group's **group relay**, which holds one to the
aggregator); node 0's launcher holds one ``control`` connection to its aggregator. So node 0
serves one connection per node (per group), whatever the number of ranks.

Handshake (wire/auth.py): the client's first frame is ``hello``; nothing else is accepted before
the server answers ``welcome`` (or ``refused`` with a reason, then closes). The hello proves
knowledge of a key without sending it: ``mac = HMAC-SHA256(key, every other hello field)``, over a
fresh 16-byte nonce and a timestamp. The server recomputes the MAC with *its own* run name, job and
endpoint name (``aud``: ``aggregator``, ``relay:<node>``, ``doctor``) in place of the hello's, so a
hello for another run, job or endpoint fails exactly like a wrong key (the refusal does not say
which), and a hello captured at one endpoint is refused at every other one. Every endpoint
remembers the nonces it accepted inside the clock window (:data:`HELLO_WINDOW_S`) and refuses a
repeat or a stale timestamp. The key is the run's token for kinds ``rank`` and ``node``; kind
``control`` needs the control key that only node 0's launcher and its aggregator hold.

Hello ``kind``:

``rank``     a training process, at its node's relay; ``rank`` is its global rank. Extra field
             ``local_rank``.
``node``     a node's relay (its launcher) joining the aggregator: carries that node's ranks and
             its own ``system`` samples. ``rank`` is -1. Extra field ``nproc``.
``control``  node 0's own launcher, at the aggregator (``node`` 0).
``group``    a group relay (runs of hundreds of nodes: launcher/grouprelay.py), at the aggregator:
             the launcher of a group's first node (``node``), carrying the frames of its group's
             nodes, whose relays connect to it (kind ``node``, endpoint ``group:<g>``) instead
             of to the aggregator. ``rank`` is -1. Extra field ``nodes``.

Rank → relay, after ``welcome``:

``steps``   ``{"t","rank","seq","n","cols","dropped"}``: ``n`` step records of one rank, columnar
            (``cols`` maps each of :data:`STEP_COLUMNS` to a list of ``n`` ints, -1 = not
            measured); ``seq`` is the per-rank sequence number of the first record (0-based, +1 per
            record), so a receiver counts gaps; ``dropped`` is the rank's cumulative count of
            records it had to drop; optional ``open``: records the rank holds but has not sent yet
            (its open batch and queue), the bound of what dies with it if it is killed.
``event``   ``{"t","rank","kind","text","ts"}``: a notable event (warning, exception text).
            Kind ``step_source``: ``text`` is a JSON object saying how this rank's steps are
            found (see :func:`traceml_core.wire.frames.step_source`); the latest one counts, it
            is not a notable event. Kinds ``span``, ``progress`` and ``work``: ``text`` is a JSON
            object of the rank's own facts (``traceml_core.rankfacts``, checked by
            :func:`traceml_core.wire.frames.rank_fact`): a timed span (``{"span": "checkpoint",
            "dur_ns","end","step","gstep","in_step","api"}``: a checkpoint save, when it ended,
            the rank's step count and the script's global step then), a progress mark
            (``{"step","gstep","start","end"}``: the rank's step ``step`` is the script's global
            step ``gstep``, with its start and end), or the work a step is worth
            (``{"tokens_per_step","flops_per_step","dtype","device"}``); not notable events.
            Kind ``cpu_threads`` (:data:`CPU_THREADS_EVENT`): ``text``
            is a JSON object with the rank's intra-op threads and the cores it may use, and its
            training thread's time on a CPU and waiting for one (``threads``, ``cpus``,
            ``cpuset``, ``steps``, ``run_ns``, ``wait_ns`` and the same at the settled start;
            traceml_core/sdk/threads.py), and what feeds its input (its DataLoader workers,
            their time on a CPU and waiting for one, its own CPU time, its cgroup's CPU
            throttling, ``OMP_NUM_THREADS``, the scheduler's CPU request), sent once training
            settled and at shutdown.
``bye``     ``{"t","rank","status","steps","dropped","error","fail_step","fail_in_step"}``: a
            rank's clean or failed end; ``steps`` is the total number of records it produced;
            ``fail_step`` (int or null) is the index of the step a fatal error happened in
            (``fail_in_step`` true: it left that step's ``trace_step`` block, and that step is
            not recorded) or, raised between steps, of the step that would have come next.
``resp``    ``{"t","id","rank","kind","data"}``: a rank's answer to a ``req`` (below).

Relay → aggregator (kind ``node``), every frame about a rank carrying its ``rank``: each window
of a rank's records as its statistics (``fold``; contiguous ``steps`` frames of one rank merged
into one window, never over a gap), the ranks' ``event``, ``bye`` and ``resp`` frames as
received, plus:

``fold``     ``{"t","rank","seq","n","dropped","open","v","o","keys"}``: the statistics of one
             window of a rank's records (counts, sums, extremes, the warm-up split, the time
             outside the steps, sampled sketch keys, the per-step-bucket series rows): one
             ``traceml_core.statistics.window.WindowStats``, which node 0 merges into the rank's.
             ``seq``, ``n``, ``dropped``, ``open`` are the window's records', as in ``steps``
             (gaps, duplicates and losses are counted the same way). ``v`` (packed little-endian
             int64s), ``o`` (int64s, the signed outside-step times) and ``keys`` (uint16s) follow
             the value's own field list (``traceml_core.wire.fold``), and are checked at node 0
             by the value's rules (``wire/frames.check_fold``). Node 0 takes step records in no
             other form.
``tail``     ``{"t","rank","seq","n","cols"}`` (live modes ``cli``/``dashboard`` only): the
             window's last ``n`` (at most 64) records, columns as in ``steps``, beside its
             ``fold``: the live views show them; no statistics are computed from them.
``join``     ``{"t","rank","local_rank","host","pid","new"}``: the relay accepted this rank's
             hello; ``new`` is false when the relay only re-announces its ranks after
             re-establishing its own connection (not a reconnect of the rank), and then carries
             ``seq_end`` (how far the rank's records went), so a restarted aggregator knows.
``gone``     ``{"t","rank","relay_dropped","seq_end","open"}``: the rank's connection closed (after
             its ``bye``, or without one: it crashed or was killed). ``open``: what the rank last
             said it held unsent (None if it never said): the bound of records that died with it.
``dropped``  ``{"t","rank","relay_dropped","seq_end"}``: the relay's byte budget was full (node 0
             slow or unreachable) and it dropped ``relay_dropped`` step records of this rank so far
             (cumulative); ``seq_end`` is the seq after the last record it received from the rank,
             so records dropped at the very end still count as lost. Also carried by ``gone``.
``system``   ``{"t","node","host","samples"}``: the node's samples (see :data:`SYSTEM_FIELDS`).
``bye``      ``{"t","status","exit_code","workers","oom","torchrun"}`` (no ``rank``): the node's launcher
             ended, with its exit code and the node's **worker report**
             (:func:`traceml_core.wire.frames.worker_report`): ``workers`` is torchrun's outcome for
             each worker that failed (``{"rank","local_rank","pid","exitcode","signal","ts",
             "message","traceback","stderr"}``, ``signal`` a name such as ``"SIGKILL"`` or null;
             ``message``/``traceback`` Python's error from torchrun's error file, ``stderr`` the end
             of the worker's stderr, at most 2,000 characters: launcher/stderrtee.py), ``oom`` the OOM kills the node's
             memory cgroup counted during the run (``{"kills","limit_bytes","source"}``) or null
             where unreadable, ``torchrun`` how the node's torchrun ended (``{"exitcode","signal",
             "at","stopped_at"}``: ``signal`` only when a signal the launcher did not send killed
             it; ``stopped_at`` when the launcher, signalled itself, began stopping it; or null).
             Optional ``lifecycle``: when the node's launch entered each phase (**lifecycle
             record**, :func:`traceml_core.wire.frames.launch_lifecycle`): ``{"phases": [[phase,
             at], ...], "first_step", "allocation_start", "restarts", "signals": [[name, at],
             ...], "scheduled_end"}``, phases named from
             :data:`LAUNCH_PHASES` (``preflight``, ``telemetry_up``, ``training``, ``finishing``,
             ``done``; see [the launch lifecycle](reliability.md#the-launch-lifecycle)), each at
             most once, times in seconds since 1970; ``first_step`` when the node's relay first
             received step records, ``allocation_start`` when the cluster started the job,
             ``restarts`` how often it was requeued (null where not known), ``signals`` the
             first arrival of each signal the launcher received (:data:`LAUNCHER_SIGNALS`: the
             early warning of ``--signal``, the time limit; each at most once),
             ``scheduled_end`` when the cluster meant to end the job as it said when the early
             warning came (null: none came, or it did not say); the goodput ledger's ``ending``
             is made of them. A time past its bound
             is not measured (null, counted in ``values_refused``); anything else malformed drops
             the record, never the frame. The last frame of the link: the link closing without it before the
             run's ``finish`` means the node vanished, and ``gone`` for every rank it carried.

A group relay (kind ``group``) sends its nodes' frames as they came (each rank's windows
merged over a few seconds: one ``fold`` with counted sketches; a node launcher's own ``bye``
with its ``node``), plus:

``node``     ``{"t","node","host","nproc","gone"}``: a node relay of the group connected (or, with
             ``gone`` true, its link closed): for node 0 it is as if that node's own link opened
             or closed.

A malformed relayed frame is counted and skipped; it does not close the node's connection.

Aggregator → relay → rank (downstream, after ``welcome``):

``req``     ``{"t","id","kind","ranks","args"}``: ask ranks for something (``ranks``: a list of
            global ranks, or None for all). The relay passes it to each of its matching ranks;
            each rank's client answers ``resp`` with the same ``id`` (the relay forwards it up).
            Request kinds and their answer's ``data`` validators are one table,
            :data:`traceml_core.wire.frames.REQUESTS`; adding a kind means adding a row there and
            a responder in the SDK (``sdk/responders.py``). Built in: ``counts`` (the rank's
            records produced, sent and dropped so far) and ``stacks``
            (the hang autopsy: the rank answers ``{"source": "sdk", "text", "in_flight",
            "launched", "step", "in_step"}``: every thread's stack read by its own interpreter on
            the client thread (``text``, at most 64 KiB; never from a signal handler), the
            collective it launched and that has not completed; its relay adds, for each rank,
            ``{"source": "relay", "pid", "gone", "state", "wchan", "main_cpu_ns", "proc_cpu_ns",
            "children_cpu_ns", "io_bytes", "at_ns"}``: what the kernel says of the process).
``end``     ``{"t"}``: the run's summary is written and the aggregator is about to close this
            link: the relay stops reporting or reconnecting (a clean end is not a lost link).

Launcher → aggregator, on the ``control`` connection (requests carry an ``id``, echoed in the
answer, so an answer to a timed-out request is never taken for the next one's):

``finish``  ``{"t","exit_code","interrupted","reason","failed_nodes","workers","oom","torchrun"}``: training
            is over (``exit_code`` int, ``interrupted`` bool (SIGTERM/scancel/time limit),
            ``reason`` one line, ``failed_nodes`` list of node ranks the launcher saw fail or
            vanish, ``workers``/``oom``/``torchrun`` node 0's report and ``lifecycle`` its
            lifecycle record, as in the node ``bye``). The
            aggregator drains what is in flight (bounded), writes the summary, answers
            ``finished`` ``{"t","summary_json","summary_txt","rebuilt"}`` (paths, or ``None`` with an
            ``"error"`` string) and exits.
``query``   ``{"t","id"}``: answered with ``status`` ``{"t","id","nodes_joined","ranks_connected",
            "ranks_seen","records","checkpoint_s","silent",...}`` (node joins, the hang watchdog).
``autopsy`` ``{"t","id","silent_s","threshold_s","threshold_source"}``: take a hang report (the
            launcher saw no step for the threshold): the aggregator sends ``req`` ``stacks`` to
            every relay, gathers the answers (at most 6 s), keeps the report for the summary and
            answers ``autopsy`` ``{"t","id","report"}`` (see report/hang.py).
``snapshot``  ``{"t","id","series","verdict"}``: for the live views (``--mode cli|dashboard``),
            answered with ``snapshot``: a :class:`traceml_core.livesnapshot.LiveSnapshot`'s fields
            (built by :func:`traceml_core.aggregator.snapshot.snapshot_frame` from the
            aggregator's :class:`traceml_core.aggregator.state.RunState` alone).

Server → client: ``welcome`` ``{"t","v","server_time"}``, ``refused`` ``{"t","reason"}``.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Iterator

import msgpack

# the step record's columns, and how each is aggregated, live with the statistics; every end reads
# them here (re-exported)
from ..statistics.columns import (  # noqa: F401
    COLUMN_KINDS, COLUMNS, COMM_COLUMNS, DURATION_COLUMNS, PEAK_COLUMNS, STEP_COLUMNS, SUM_COLUMNS,
    Column,
)

#: 5: a ``fold`` window also sketches the time between steps (its keys after the duration
#: columns', ``outside.nkeys`` of them). 4: node 0 takes step records only as ``fold`` frames of one
#: window value's fields (statistics/window.py), in every mode; the live modes add ``tail`` frames; group relays (kind
#: ``group``, ``node`` frames). 3: the ``fold`` frame's series rows row by row
PROTOCOL_VERSION = 5
#: the phases of a launch, in order (traceml_core/launcher/lifecycle.py), as a launcher's
#: ``lifecycle`` record names them
LAUNCH_PHASES = ("preflight", "telemetry_up", "training", "finishing", "done")
#: the signals a launcher reports receiving in its ``lifecycle`` record (launcher/supervise.py)
LAUNCHER_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")
HEADER = struct.Struct(">I")
MAX_FRAME = 8 * 1024 * 1024
#: a hello is a few hundred bytes; no more is read (nor held) from an unauthenticated peer
MAX_HELLO = 4096
#: what one recv_into reads at most
RECV_SIZE = 256 * 1024
#: a hello whose timestamp differs from the server clock by more than this is refused
HELLO_WINDOW_S = 300.0


SYSTEM_FIELDS = ("ts", "cpu_pct", "ram_used", "ram_total", "gpus")
GPU_FIELDS = ("index", "util_pct", "mem_used", "mem_total", "temp_c", "power_w")
RANK_STATUSES = ("clean", "error", "crashed", "vanished", "interrupted", "running")
#: what a rank's ``bye`` may say
BYE_STATUSES = ("clean", "error", "interrupted")
#: how a rank's steps are found: the script's trace_step, inferred from optimizer steps (no
#: trace_step), or a framework's own hooks (traceml_core.integrations)
STEP_SOURCES = ("trace_step", "inferred", "lightning", "huggingface", "accelerate")
#: the event a rank sends with its compute threads and usable cores (sdk/threads.py)
CPU_THREADS_EVENT = "cpu_threads"


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


_packb = msgpack.packb


def encode(message: dict[str, Any]) -> bytes:
    """The one encoder: a length-prefixed msgpack map."""
    body = _packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the maximum of {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ProtocolError("frame is not a map with a string 't'")
    return msg


class FrameBuffer:
    """Incremental decoder for a blocking reader: ``feed()`` bytes, iterate complete frames.
    (The servers' non-blocking loops cut frames with :func:`traceml_core.wire.framing.split_frames`.)"""

    __slots__ = ("_buf", "limit")

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buf += data
        while True:
            if len(self._buf) < HEADER.size:
                return
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.limit:
                raise ProtocolError(f"length prefix {length} exceeds the maximum of {self.limit}")
            end = HEADER.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            yield decode_body(body)

    @property
    def pending(self) -> int:
        return len(self._buf)


#: a host name as a peer may state it (its own, or a node's): letters, digits, ``_``, ``.``, ``-``,
#: ``:`` (an address), at most 255 characters. Anything else (a newline, a space, a control
#: character) is dropped where it enters, so it can never forge a line of a log or a summary.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,254}")


def host_name(value: Any) -> str:
    """``value`` when it is a host name (:data:`HOST_NAME`), else "" (not known)."""
    return value if isinstance(value, str) and HOST_NAME.fullmatch(value) else ""
