"""The step record and the bounded pool of batches it travels in to the client thread.

**The record.** A step's record is a list with one integer per column of the wire protocol's
table (``wire.protocol.COLUMNS``, ``step`` first), in that order: the step's value list
(``StepState.vals``, a new one per step) itself. Whoever measures a column writes it by its
position (:data:`C_FWD`, ...) into that list, and :meth:`StepRecorder.commit` appends it to the
batch as it is (no copy): no other code lays a record out. Two columns are finished on the client thread (:meth:`Batch.columns`), not per step:
``step`` (a batch holds consecutive steps from ``seq``) and ``step_ns``, which holds the step's
start on the ``perf_counter`` clock until then (the duration is ``t_end_ns`` minus it). So a new
column is a row in the protocol's table, the value its step starts with (:func:`fresh_values`:
-1, "not measured", unless said otherwise), and the hook that measures it.

**The pool.** Records are appended as one list per step to the current batch (a list); a full
(or old) batch is *sealed* by appending it to a deque that the client thread drains.
``list.append``, ``deque.append`` and ``deque.popleft`` are atomic under the GIL, so producer and
consumer never wait on each other. Memory is bounded: at most ``max_batches`` batches of
``batch_size`` records exist; when none is free (aggregator gone or slow) the record is dropped
and counted in :attr:`StepRecorder.dropped` -- the exact number, never silently.

**A blocked training thread.** A batch is sealed by the training thread when it commits a step,
so a thread that blocks (a hang in a collective, a deadlock in user code) would keep the records
of its last steps in the open batch for good, and node 0 would report an earlier last step than
the rank reached. The client thread therefore sends what a stalled open batch holds
(:meth:`StepRecorder.seal_stalled`) without taking the batch from the training thread: it copies
the rows appended so far (a row is never written after its append) and marks them sent
(``Batch.sent``); the batch is sealed as usual when the thread commits again, and only its rows
after that mark travel then. It does so only when every sealed batch has been sent, so frames
stay in the order of their steps. While the thread stays stalled, an empty frame every
:data:`HEARTBEAT_S` says "still nothing unsent": the bound of records that die with a killed rank
stays a second of steps, not the length of the hang.

Why lists in a list and not ``array('q')`` columns: on a real training step the interpreter
arrives at our code with cold caches (torch's step has evicted it), and there the generic
operations every Python program uses all the time (copy a short list, append to a list,
slot attributes) were measured 3-4x cheaper than ``array`` item stores or ``struct.pack_into``
(0.5 us vs 1.7-2 us per step; see benchmarks/README.md, "Rank side"). The client thread turns
records into the protocol's columns.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter_ns, time_ns
from typing import Any, Callable, Optional

from ..wire.protocol import COMM_COLUMNS, STEP_COLUMNS

# Positions of the columns in a record (== in the protocol's table).
C_STEP = STEP_COLUMNS.index("step")
C_TEND = STEP_COLUMNS.index("t_end_ns")       # on the perf_counter clock until the batch is encoded
C_STEPNS = STEP_COLUMNS.index("step_ns")     # the step's start until the batch is encoded
C_INPUT = STEP_COLUMNS.index("input_ns")
C_FWD = STEP_COLUMNS.index("forward_ns")
C_BWD = STEP_COLUMNS.index("backward_ns")
C_OPT = STEP_COLUMNS.index("optimizer_ns")
C_H2D = STEP_COLUMNS.index("h2d_ns")
C_MEM = STEP_COLUMNS.index("mem_peak")
C_COMM = STEP_COLUMNS.index("comm_ns")
C_COMM_BUSY = STEP_COLUMNS.index("comm_busy_ns")
C_COMM_BYTES = STEP_COLUMNS.index("comm_bytes")
C_COMM_BUS = STEP_COLUMNS.index("comm_bus_bytes")
C_COMM_CALLS = STEP_COLUMNS.index("comm_calls")
#: the communication columns are one block at the end of the record (all -1 when not measured)
assert STEP_COLUMNS[C_COMM:] == COMM_COLUMNS

#: the open batch is sent by the client thread once the training thread is this late to seal it
STALL_NS = 300_000_000
#: while the training thread stays stalled, an empty frame this often says nothing is unsent
HEARTBEAT_S = 1.0


def fresh_values(*, forward_timed: bool, comm: int) -> list[int]:
    """What a step's values are before anything is measured in it: -1 ("not measured") for every
    column, but 0 for the phases whose hooks are always installed (backward, optimizer), forward
    once a model is traced, and ``comm`` (0 measured, -1 not) for the communication columns.
    Input, end time, duration and memory are written by the step context."""
    v = [-1] * len(STEP_COLUMNS)
    v[C_BWD] = v[C_OPT] = 0
    v[C_FWD] = 0 if forward_timed else -1
    v[C_COMM:] = [comm] * len(COMM_COLUMNS)
    return v


class Batch:
    """Records of consecutive steps starting at ``seq``; reused after the client has shipped it."""

    __slots__ = ("rows", "seq", "sent")

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.seq = 0
        #: rows at the front already sent by the client thread while the batch was open (a
        #: stalled training thread; see the module docstring)
        self.sent = 0

    def columns(self, wall_offset: int, start: int = 0) -> dict[str, list[int]]:
        """Rows ``start:`` of the batch as the protocol's columns: ``step`` numbered from
        ``seq + start``, ``step_ns`` the end minus the start, ``t_end_ns`` moved to the wall clock."""
        rows = self.rows[start:] if start else self.rows
        cols = list(zip(*rows)) if rows else [()] * len(STEP_COLUMNS)
        out = {name: list(col) for name, col in zip(STEP_COLUMNS, cols)}
        out["step"] = list(range(self.seq + start, self.seq + start + len(rows)))
        out["step_ns"] = [e - s for e, s in zip(cols[C_TEND], cols[C_STEPNS])]
        out["t_end_ns"] = [t + wall_offset for t in cols[C_TEND]]
        return out


class StepRecorder:
    """The batch pool of one process: filled by the training thread (:meth:`commit`), drained by
    the client thread, whose ``RecordSource`` it is.

    The client thread only pops sealed batches (:meth:`pop`), gives them back (:meth:`recycle`,
    :meth:`unpop`) or discards them (:meth:`discard`); it never touches the batch being filled.
    """

    __slots__ = (
        # hot fields first
        "rows", "batch_size", "seal_at",
        "batch", "seal_ns", "max_batches", "free", "sealed", "allocated", "next_seq", "dropped",
        "discarded", "wall_offset", "rank", "backlog_mark", "on_backlog", "last_word_ns",
    )

    def __init__(
        self, *, rank: int = 0, batch_size: int = 1024, max_batches: int = 64,
        seal_interval_s: float = 0.2, prealloc: int = 4,
    ) -> None:
        if batch_size < 1 or max_batches < 2:
            raise ValueError("batch_size must be >= 1 and max_batches >= 2")
        self.rank = rank
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.seal_ns = int(seal_interval_s * 1e9)
        prealloc = max(2, min(prealloc, max_batches))
        self.free: deque[Batch] = deque(Batch() for _ in range(prealloc))
        self.sealed: deque[Batch] = deque()
        self.allocated = prealloc
        self.next_seq = 0     # sequence number (== step index) of the first record of self.batch
        self.batch: Optional[Batch] = self.free.popleft()
        self.rows: Optional[list[list[int]]] = self.batch.rows
        self.seal_at = perf_counter_ns() + self.seal_ns
        self.dropped = 0      # records the training thread dropped (no free batch)
        self.discarded = 0    # records the client thread discarded (refused, flush timed out)
        self.wall_offset = time_ns() - perf_counter_ns()
        #: sealed batches waiting that make seal() call on_backlog (the client's wake-up)
        self.backlog_mark = max(2, max_batches // 8)
        self.on_backlog: Optional[Callable[[], None]] = None
        #: when the client thread last sent a stalled frame (perf_counter ns)
        self.last_word_ns = 0

    # ---- training thread ---------------------------------------------------------------------

    def commit(self, vals: list[int], now_ns: int) -> None:
        """Record one step: its value list (see the module docstring) is the next record, as it
        is; nothing writes to it afterwards (the next step has a new list)."""
        rows = self.rows
        if rows is None:            # no batch: the pool was exhausted when the last one sealed
            self._acquire()
            rows = self.rows
            if rows is None:
                self.dropped += 1
                self.next_seq += 1
                return
        rows.append(vals)
        if len(rows) >= self.batch_size or now_ns >= self.seal_at:
            self.seal(now_ns)

    def seal(self, now_ns: int) -> None:
        """Hand the current batch to the client thread and start the next one."""
        b = self.batch
        self.seal_at = now_ns + self.seal_ns
        if b is None:
            self._acquire()
            return
        n = len(b.rows)
        if n:
            sealed = self.sealed
            sealed.append(b)
            self.next_seq = b.seq + n
            self._acquire()
            if len(sealed) >= self.backlog_mark and self.on_backlog is not None:
                self.on_backlog()   # steps are outrunning the client's poll: wake it now

    def _acquire(self) -> None:
        free = self.free
        if free:
            b = free.popleft()
        elif self.allocated < self.max_batches:
            self.allocated += 1
            b = Batch()
        else:
            self.batch = self.rows = None
            return
        b.seq = self.next_seq
        self.batch = b
        self.rows = b.rows

    def flush_partial(self) -> None:
        """Seal the partly filled batch (shutdown; called on the training thread)."""
        self.seal(perf_counter_ns())

    def refresh_wall_offset(self) -> None:
        """Re-read the offset from the perf_counter clock to the wall clock (it drifts)."""
        self.wall_offset = time_ns() - perf_counter_ns()

    @property
    def count(self) -> int:
        """Records produced so far (== the next step index)."""
        b = self.batch
        return self.next_seq + (len(b.rows) if b is not None else 0)

    @property
    def lost(self) -> int:
        """Records known not to have been handed to the network (drops + discards)."""
        return self.dropped + self.discarded

    @property
    def buffered(self) -> int:
        b = self.batch
        return sum(len(x.rows) for x in list(self.sealed)) + (len(b.rows) if b is not None else 0)

    # ---- RecordSource interface (client thread) ------------------------------------------------

    def ready(self) -> int:
        return len(self.sealed)

    def pop(self) -> Optional[Batch]:
        try:
            return self.sealed.popleft()
        except IndexError:
            return None

    def unpop(self, batch: Batch) -> None:
        self.sealed.appendleft(batch)

    def frame(self, batch: Batch) -> dict[str, Any]:
        start = batch.sent
        n = len(batch.rows) - start
        return {
            "t": "steps", "rank": self.rank, "seq": batch.seq + start, "n": n,
            "cols": batch.columns(self.wall_offset, start),
            "dropped": self.dropped + self.discarded,
            # what this rank holds beyond this batch (later sealed batches, the open one): the
            # bound of what dies with it if it is killed now
            "open": max(0, self.count - batch.seq - start - n),
        }

    def records(self, batch: Batch) -> int:
        return len(batch.rows) - batch.sent

    def recycle(self, batch: Batch) -> None:
        if type(batch) is _Sent:
            return
        batch.rows.clear()
        batch.sent = 0
        self.free.append(batch)

    def discard(self, batch: Batch) -> None:
        self.discarded += len(batch.rows) - batch.sent
        self.recycle(batch)

    def seal_stalled(self, now_ns: Optional[int] = None) -> bool:
        """(client thread) When the training thread is :data:`STALL_NS` late to seal the open
        batch, queue its unsent rows as a batch of their own (:class:`_Sent`), or an empty one
        every :data:`HEARTBEAT_S` while it stays stalled; True when something was queued.

        Safe without a lock: the training thread only appends to ``rows`` and assigns
        ``batch`` after setting a new batch's ``seq``; a row is never written after its append.
        Nothing is queued while a sealed batch waits. The open batch read here is then either
        still open or sealed after that check, in which case it is behind the rows copied here
        in ``sealed``: they go to the front, so the frames keep the order of their steps, and
        the open batch's own frame later carries only its rows after ``sent``."""
        now_ns = perf_counter_ns() if now_ns is None else now_ns
        b = self.batch
        if self.sealed or b is None or now_ns < self.seal_at + STALL_NS or not self.count:
            return False
        start = b.sent
        rows = b.rows[start:]
        if not rows and now_ns - self.last_word_ns < HEARTBEAT_S * 1e9:
            return False
        self.last_word_ns = now_ns
        b.sent = start + len(rows)
        part = _Sent()
        part.rows, part.seq = rows, b.seq + start
        self.sealed.appendleft(part)
        return True


class _Sent(Batch):
    """Rows of an open batch sent while the training thread was stalled: a copy, never pooled."""

    __slots__ = ()
