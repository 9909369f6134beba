"""The per-step hot path: the step recorder, the ``trace_step`` context and the torch hook bodies.

Everything a traced step touches lives in this one module, so the patched torch functions reach
the recorder through one module global (:data:`REC`) and the cost stays auditable. Rules:

* no I/O, no locks, no environment or file lookups, no logging;
* records are appended as one tuple per step to the current batch (a list); a full (or old)
  batch is *sealed* by appending it to a deque that the client thread drains. ``list.append``,
  ``deque.append`` and ``deque.popleft`` are atomic under the GIL, so producer and consumer never
  wait on each other;
* memory is bounded: at most ``max_batches`` batches of ``batch_size`` rows exist; when none is
  free (aggregator gone or slow) the record is dropped and counted in :attr:`StepRecorder.dropped`
  -- the exact number, never silently.

Why tuples in a list and not ``array('q')`` columns: on a real training step the interpreter
arrives at our code with cold caches (torch's step has evicted it), and there the generic
operations every Python program uses all the time (build a tuple, append to a list, slot
attributes) were measured 3-4x cheaper than ``array`` item stores or ``struct.pack_into``
(0.5 us vs 1.7-2 us per step; see benchmarks/README.md, "Rank side"). The client thread turns
rows into the protocol's columns. For the same reason each wrapper below is written for the
fewest operations on its common path.

Timing model (what the user sees in the summary):

* a step is recorded when its ``trace_step`` block completes; a block left by an exception is
  not a step (its time is often a collective waiting for a dead peer) and is not recorded, but
  its index is remembered (:attr:`StepRecorder.raised_at`) for the failure report;
* ``step_ns`` = time inside ``trace_step`` + the input fetches credited to the step;
* ``input_ns`` = DataLoader ``__next__`` time spent inside the step, plus the fetches made after
  the previous step's exit and before this step's entry (the usual
  ``for batch in loader: with trace_step(model): ...`` shape); -1 (not measured) when no fetch
  of a DataLoader or a ``wrap_dataloader`` iterable was timed for the step (a ``get_batch()``
  function): the summary then reads the time between steps instead, and says so. A forward pass of a traced model
  outside any step (evaluation) clears those pending fetches, so an evaluation loop between two
  steps is never credited to the next step; other work between steps (checkpointing, logging) is
  never timed at all;
* ``forward_ns``/``backward_ns``/``optimizer_ns`` accumulate every forward of a traced model,
  every ``torch.autograd.backward`` (``loss.backward()``) and every ``Optimizer.step`` inside the
  step; a forward or backward run *inside* ``optimizer.step(closure)`` (LBFGS, Lightning) counts
  as forward/backward and is taken out of the optimizer time, so phases never overlap; on CUDA they are replaced by CUDA-event times once the events have completed (see
  :mod:`.cuda_timing`); ``forward_ns`` is -1 when no model was given to ``trace_step``;
* ``mem_peak`` is the highest memory sample taken by the client thread since the previous step
  (see :mod:`.memory`); -1 until the first sample;
* ``comm_*``: the step's collectives (see :mod:`.comm`); a step with none appends a short row and
  pays one attribute test (``r.cn``) for it. A step with some has its exposed communication taken
  out of the phase it waited in, so forward/backward/optimizer are compute and ``comm_ns`` is
  the wait.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter_ns
from typing import Any, Callable, Optional

from ..wire.protocol import COMM_COLUMNS, STEP_COLUMNS

# Column positions in the protocol, for code that addresses columns (CUDA timing, tests).
(C_STEP, C_TEND, C_STEPNS, C_INPUT, C_FWD, C_BWD, C_OPT, C_H2D, C_MEM,
 C_COMM, C_COMM_BUSY, C_COMM_BYTES, C_COMM_BUS, C_COMM_CALLS) = range(14)
assert STEP_COLUMNS == (
    "step", "t_end_ns", "step_ns", "input_ns", "forward_ns", "backward_ns", "optimizer_ns",
    "h2d_ns", "mem_peak", "comm_ns", "comm_busy_ns", "comm_bytes", "comm_bus_bytes", "comm_calls",
), "hotpath.py is out of date with protocol.STEP_COLUMNS"
#: a row holds every column but ``step`` (implied by its position in the batch); ``t_end_ns`` is
#: stored on the perf_counter clock and moved to wall time when the batch is encoded
ROW_COLUMNS = STEP_COLUMNS[1:]
#: a step without collectives appends a short row (no communication columns: the cheapest path);
#: the client thread fills them in (0, or -1 when communication is not measured)
SHORT_ROW = C_COMM - 1
assert ROW_COLUMNS[SHORT_ROW:] == COMM_COLUMNS

#: The recorder of this process while tracing is on; ``None`` makes every patch a pass-through.
REC: Optional["StepRecorder"] = None


class Batch:
    """Rows of consecutive steps starting at ``seq``; reused after the client has shipped it."""

    __slots__ = ("rows", "seq")

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []
        self.seq = 0

    def columns(self, wall_offset: int, comm_default: int = -1) -> dict[str, list[int]]:
        rows = self.rows
        n = len(rows)
        if n and min(map(len, rows)) == SHORT_ROW:
            pad = (comm_default,) * len(COMM_COLUMNS)
            rows = [row + pad if len(row) == SHORT_ROW else row for row in rows]
        cols = list(zip(*rows)) if n else [()] * len(ROW_COLUMNS)
        out: dict[str, list[int]] = {"step": list(range(self.seq, self.seq + n))}
        out["t_end_ns"] = [t + wall_offset for t in cols[0]]
        for name, col in zip(ROW_COLUMNS[1:], cols[1:]):
            out[name] = list(col)
        return out


class StepRecorder:
    """Per-process step state plus the batch pool; one instance, written by the training thread.

    The client thread only pops sealed batches (:meth:`pop`), gives them back (:meth:`recycle`,
    :meth:`unpop`) or discards them (:meth:`discard`), and writes the memory sample fields; it
    never touches the batch being filled. This object is the client's ``RecordSource``.
    """

    __slots__ = (
        # hot fields first
        "active", "t0", "inp", "fwd", "bwd", "opt", "opt_t0", "opt_owner", "pending_input",
        "in_fwd", "rows", "batch_size", "seal_at", "mem", "mem_last", "gpu", "model_id",
        "models", "fwd0", "nbwd", "cn", "cdef", "comm",
        # batch bookkeeping
        "batch", "seal_ns", "max_batches", "free", "sealed", "allocated", "next_seq", "dropped",
        "discarded", "wall_offset", "rank", "backlog_mark", "on_backlog", "raised_at",
    )

    def __init__(
        self, *, rank: int = 0, batch_size: int = 1024, max_batches: int = 64,
        seal_interval_s: float = 0.2, prealloc: int = 4,
    ) -> None:
        if batch_size < 1 or max_batches < 2:
            raise ValueError("batch_size must be >= 1 and max_batches >= 2")
        from time import time_ns

        self.rank = rank
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.seal_ns = int(seal_interval_s * 1e9)
        prealloc = max(2, min(prealloc, max_batches))
        self.free: deque[Batch] = deque(Batch() for _ in range(prealloc))
        self.sealed: deque[Batch] = deque()
        self.allocated = prealloc
        self.next_seq = 0     # sequence number (== step index) of the first row of self.batch
        self.batch: Optional[Batch] = self.free.popleft()
        self.rows: Optional[list[tuple[int, ...]]] = self.batch.rows
        self.seal_at = perf_counter_ns() + self.seal_ns
        self.dropped = 0      # records the hot path dropped (no free batch); hot path writes it
        self.discarded = 0    # records the client thread discarded (refused, flush timed out)
        self.active = 0       # 0 outside a step; 1 inside; 1 + n inside n nested trace_step blocks
        self.t0 = 0           # step start, moved back by the input wait credited before entry
        self.pending_input = -1  # -1: no batch fetch timed since the last step (input not measured)
        self.inp = -1
        self.fwd0 = -1        # forward_ns when no traced model ran: -1 until a model is traced
        self.fwd = self.bwd = self.opt = 0
        self.opt_t0 = 0
        self.opt_owner: Any = None
        self.in_fwd = False
        self.nbwd = 0         # backward passes in the current inferred step (inference.py only)
        # id() of the model traced last (trace_step's fast check) and of every model passed to
        # trace_step (the forward wrappers' check). Ids, not references (patches.register_model).
        self.model_id = 0
        self.models: set[int] = set()
        self.mem = -1                   # highest memory sample since the last step
        self.mem_last = -1              # latest memory sample
        self.wall_offset = time_ns() - perf_counter_ns()
        self.gpu: Any = None            # a cuda_timing.CudaPhaseTimer once a CUDA model is traced
        # communication (comm.py): collectives launched in the current step (0 = the fast path);
        # what a step without any says: 0 measured, -1 coverage incomplete, -2 no process group
        self.cn = 0
        self.cdef = -2
        self.comm: Any = None           # a comm.CommAccount once comm.attach() ran
        #: sealed batches waiting that make seal() call on_backlog (the client's wake-up)
        self.backlog_mark = max(2, max_batches // 8)
        self.on_backlog: Optional[Callable[[], None]] = None
        #: index of the last step whose ``trace_step`` block an exception left (-1: none), so a
        #: failure report can say "during step N" rather than "after N steps"
        self.raised_at = -1

    # ---- training thread ---------------------------------------------------------------------

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

    def append(self, row: tuple[int, ...], now_ns: int) -> None:
        """Slow-path append: no current batch (pool was exhausted), or rows committed late (CUDA)."""
        if self.batch is None:
            self._acquire()
            if self.batch is None:
                self.dropped += 1
                self.next_seq += 1
                return
        rows = self.rows
        rows.append(row)  # type: ignore[union-attr]
        if len(rows) >= self.batch_size or now_ns >= self.seal_at:  # type: ignore[arg-type]
            self.seal(now_ns)

    def abandon(self) -> None:
        """Drop the step in progress without recording it (a step left open by an exception in
        a framework's loop, or by inference when something else takes the steps over)."""
        self.active = 0
        self.opt_owner = None
        self.in_fwd = False
        self.nbwd = 0
        self.inp = self.bwd = self.opt = 0
        self.fwd = self.fwd0
        if self.gpu is not None:
            self.gpu.abort_step()

    def flush_partial(self) -> None:
        """Seal the partly filled batch (shutdown; called on the training thread)."""
        self.seal(perf_counter_ns())

    @property
    def count(self) -> int:
        """Records produced so far (== the next step index)."""
        b = self.batch
        return self.next_seq + (len(b.rows) if b is not None else 0)

    @property
    def lost(self) -> int:
        """Records known not to have been handed to the network (hot-path drops + discards)."""
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
        n = len(batch.rows)
        return {
            "t": "steps", "rank": self.rank, "seq": batch.seq, "n": n,
            "cols": batch.columns(self.wall_offset, 0 if self.cdef == 0 else -1),
            "dropped": self.dropped + self.discarded,
            # what this rank holds beyond this batch (later sealed batches, the open one): the
            # bound of what dies with it if it is killed now
            "open": max(0, self.count - batch.seq - n),
        }

    def records(self, batch: Batch) -> int:
        return len(batch.rows)

    def recycle(self, batch: Batch) -> None:
        batch.rows.clear()
        self.free.append(batch)

    def discard(self, batch: Batch) -> None:
        self.discarded += len(batch.rows)
        self.recycle(batch)


class StepContext:
    """What ``trace_step(model)`` returns: one reusable object, no allocation per step (CPU)."""

    __slots__ = ("r",)

    def __init__(self, recorder: StepRecorder) -> None:
        self.r = recorder

    def __enter__(self) -> "StepContext":
        r = self.r
        if r.active:            # nested trace_step: counts toward the outer step
            r.active += 1
            return self
        r.active = 1
        inp = r.pending_input
        r.inp = inp
        r.pending_input = -1
        r.fwd = r.fwd0
        r.bwd = r.opt = 0
        # the fetch made just before entering is part of the step: start the clock that much earlier
        r.t0 = perf_counter_ns() - inp if inp > 0 else perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = perf_counter_ns()
        r = self.r
        a = r.active
        if a != 1:
            if a:
                r.active = a - 1
            return False
        r.active = 0
        if et is not None:      # an aborted step is no step: its time (often a collective
            r.raised_at = r.count   # timing out on a dead peer) would only mislead
            if r.cn:            # ... nor its collectives
                r.cn = 0
                r.comm.reset()
            return False
        mem = r.mem
        r.mem = r.mem_last
        if r.cn:    # collectives ran: the communication columns, phases without their waits
            row = r.comm.row(r, t1, mem)
        else:
            row = (t1, t1 - r.t0, r.inp, r.fwd, r.bwd, r.opt, -1, mem)
        rows = r.rows
        if rows is None:
            r.append(row, t1)
            return False
        rows.append(row)
        if len(rows) >= r.batch_size or t1 >= r.seal_at:
            r.seal(t1)
        return False


class CommStepContext(StepContext):
    """The CPU variant once a DDP model is watched (comm.py): the step exit also reads the
    reducer's timings of the step's all-reduce (~15 us; steps of runs without DDP never pay it)."""

    __slots__ = ()

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = perf_counter_ns()
        r = self.r
        a = r.active
        if a != 1:
            if a:
                r.active = a - 1
            return False
        r.active = 0
        if et is not None:
            r.raised_at = r.count
            if r.cn:
                r.cn = 0
                r.comm.reset()
            return False
        mem = r.mem
        r.mem = r.mem_last
        from .comm import poll

        poll(r)
        row = r.comm.row(r, t1, mem) if r.cn else (t1, t1 - r.t0, r.inp, r.fwd, r.bwd, r.opt, -1, mem)
        r.append(row, t1)
        return False


class GpuStepContext(StepContext):
    """The CUDA variant: phases are bracketed by CUDA events and rows commit once they complete."""

    __slots__ = ()

    def __enter__(self) -> "StepContext":
        r = self.r
        if r.active:
            r.active += 1
            return self
        r.active = 1
        inp = r.pending_input
        r.inp = inp
        r.pending_input = -1
        r.fwd = r.fwd0
        r.bwd = r.opt = 0
        r.gpu.begin_step()
        r.t0 = perf_counter_ns() - inp if inp > 0 else perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = perf_counter_ns()
        r = self.r
        a = r.active
        if a != 1:
            if a:
                r.active = a - 1
            return False
        r.active = 0
        if et is not None:      # aborted: not recorded (see StepContext.__exit__)
            r.raised_at = r.count + r.gpu.pending   # rows still waiting for their CUDA events
            r.gpu.abort_step()
            if r.cn:
                r.cn = 0
                r.comm.reset()
            return False
        mem = r.mem
        r.mem = r.mem_last
        r.gpu.end_step(r, t1, mem)
        return False


class NullContext:
    """``trace_step`` when tracing is off: one call and two no-op methods."""

    __slots__ = ()

    def __enter__(self) -> "NullContext":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        return False


NULL_CONTEXT = NullContext()


# ---- bodies of the torch patches (installed by patches.py) ---------------------------------------

def timed_next(orig_next: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a DataLoader-iterator ``__next__``: the fetch time goes to the active or next step."""

    def __next__(self: Any) -> Any:
        r = REC
        if r is None:
            return orig_next(self)
        t0 = perf_counter_ns()
        item = orig_next(self)      # StopIteration (end of epoch) propagates and is not credited
        if r.active:            # (-1 until the step's first fetch: input not measured)
            i = r.inp
            r.inp = (i if i > 0 else 0) + perf_counter_ns() - t0
        else:
            i = r.pending_input
            r.pending_input = (i if i > 0 else 0) + perf_counter_ns() - t0
        return item

    __next__.__wrapped__ = orig_next  # type: ignore[attr-defined]
    return __next__


def timed_forward(orig_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a model class's ``forward``; only instances passed to ``trace_step`` are timed."""

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or id(self) not in r.models:
            return orig_forward(self, *args, **kwargs)
        if not r.active:
            # evaluation (or any forward) between steps: the fetches before it belong to it
            r.pending_input = -1
            if r.gpu is not None:
                r.gpu.clear_pre()
            return orig_forward(self, *args, **kwargs)
        if r.in_fwd:    # a traced model inside another traced model: counted once, by the outer
            return orig_forward(self, *args, **kwargs)
        r.in_fwd = True
        try:
            if r.gpu is None:
                t0 = perf_counter_ns()
                out = orig_forward(self, *args, **kwargs)
                r.fwd += perf_counter_ns() - t0
            else:
                gpu = r.gpu
                ev = gpu.start()
                t0 = perf_counter_ns()
                out = orig_forward(self, *args, **kwargs)
                r.fwd += perf_counter_ns() - t0
                gpu.stop(C_FWD, ev)
        finally:                # (free in 3.11+ when nothing is raised)
            r.in_fwd = False
        return out

    return forward


def timed_backward(orig_backward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``torch.autograd.backward`` (which ``Tensor.backward`` calls)."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or not r.active:
            return orig_backward(*args, **kwargs)
        if r.gpu is None:
            t0 = perf_counter_ns()
            out = orig_backward(*args, **kwargs)
            r.bwd += perf_counter_ns() - t0
            return out
        gpu = r.gpu
        ev = gpu.start()
        t0 = perf_counter_ns()
        out = orig_backward(*args, **kwargs)
        r.bwd += perf_counter_ns() - t0
        gpu.stop(C_BWD, ev)
        return out

    return backward


def timed_copy(orig_method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Tensor.to``/``Tensor.cuda`` (CUDA runs only): host-to-device copies get CUDA events.

    Only a CPU tensor can be the source of a host-to-device copy, so a CUDA tensor returns after
    one attribute check. A copy inside a step is credited to it; one between steps to the next
    step (the usual ``x = x.to(device)`` right after the fetch), unless an evaluation forward
    comes in between.
    """

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or r.gpu is None or self.is_cuda:
            return orig_method(self, *args, **kwargs)
        gpu = r.gpu
        ev = gpu.start()
        out = orig_method(self, *args, **kwargs)
        if out is not self and getattr(out, "is_cuda", False):
            if r.active:
                gpu.stop(C_H2D, ev)
            else:
                gpu.stop_pre(C_H2D, ev)
        else:
            gpu.release(ev)
        return out

    method.__wrapped__ = orig_method  # type: ignore[attr-defined]
    return method


def timed_step(orig_step: Callable[..., Any]) -> Callable[..., Any]:
    """Generic wrapper of an optimizer class's ``step`` (see :func:`make_step`)."""

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or not r.active or r.opt_owner is not None:
            return orig_step(self, *args, **kwargs)
        r.opt_owner = self
        try:
            if r.gpu is not None:
                r.gpu.opt_start()
            n0 = r.fwd + r.bwd
            t0 = perf_counter_ns()
            out = orig_step(self, *args, **kwargs)
            r.opt += perf_counter_ns() - t0 - (r.fwd + r.bwd - n0)
            if r.gpu is not None:
                r.gpu.opt_stop()
        finally:
            r.opt_owner = None
        return out

    return step


def inferred_backward(orig_backward: Callable[..., Any]) -> Callable[..., Any]:
    """Generic ``torch.autograd.backward`` wrapper while steps are inferred (see make_backward)."""
    timed = timed_backward(orig_backward)

    def backward(*args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is not None:
            if not r.active:
                _tm_infer_open()
            r.nbwd += 1
        return timed(*args, **kwargs)

    return backward


def inferred_step(orig_step: Callable[..., Any]) -> Callable[..., Any]:
    """Generic optimizer ``step`` wrapper while steps are inferred (see make_step)."""
    timed = timed_step(orig_step)

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or r.opt_owner is not None:
            return orig_step(self, *args, **kwargs)
        if not r.active:
            _tm_infer_open()
        out = timed(self, *args, **kwargs)
        _tm_infer_boundary(self)
        return out

    return step


# ---- the same wrappers generated with the wrapped function's own parameters (codegen.py) ----------
# Only ``_tm_``-prefixed names are used inside, so no parameter of the wrapped function can shadow
# them (codegen refuses parameters with that prefix).

_tm_REC: Optional[StepRecorder] = None
_tm_pc = perf_counter_ns
_tm_id = id
_TM_C_FWD, _TM_C_BWD = C_FWD, C_BWD

# Templates are written once; lines marked ``#C`` are kept only in the CPU variant and lines
# marked ``#G`` only in the CUDA variant, so a CPU run's wrappers contain no GPU checks at all
# (patches.py switches every wrapper to the CUDA variant when a CUDA model is first traced).
# Likewise ``#I`` lines exist only while steps are inferred from optimizer steps (a script without
# ``trace_step``, see inference.py) and ``#N`` lines only otherwise: a traced script's wrappers
# carry nothing of inference.

_FORWARD_TEMPLATE = """
    def _tm_wrapper({params}):
        _tm_r = _tm_REC
        if _tm_r is None or _tm_id({self}) not in _tm_r.models:
            return _tm_orig({call})
        if not _tm_r.active:
            _tm_r.pending_input = -1
#G          _tm_r.gpu.clear_pre()
            return _tm_orig({call})
        if _tm_r.in_fwd:
            return _tm_orig({call})
        _tm_r.in_fwd = True
        try:
#G          _tm_ev = _tm_r.gpu.start()
            _tm_t0 = _tm_pc()
            _tm_out = _tm_orig({call})
            _tm_r.fwd += _tm_pc() - _tm_t0
#G          _tm_r.gpu.stop(_TM_C_FWD, _tm_ev)
        finally:
            _tm_r.in_fwd = False
        return _tm_out"""

_BACKWARD_TEMPLATE = """
    def _tm_wrapper({params}):
        _tm_r = _tm_REC
#N      if _tm_r is None or not _tm_r.active:
#N          return _tm_orig({call})
#I      if _tm_r is None:
#I          return _tm_orig({call})
#I      if not _tm_r.active:
#I          _tm_infer_open()
#I      _tm_r.nbwd += 1
#G      _tm_ev = _tm_r.gpu.start()
        _tm_t0 = _tm_pc()
        _tm_out = _tm_orig({call})
        _tm_r.bwd += _tm_pc() - _tm_t0
#G      _tm_r.gpu.stop(_TM_C_BWD, _tm_ev)
        return _tm_out"""

_STEP_TEMPLATE = """
    def _tm_wrapper({params}):
        _tm_r = _tm_REC
#N      if _tm_r is None or not _tm_r.active or _tm_r.opt_owner is not None:
#N          return _tm_orig({call})
#I      if _tm_r is None or _tm_r.opt_owner is not None:
#I          return _tm_orig({call})
#I      if not _tm_r.active:
#I          _tm_infer_open()
        _tm_r.opt_owner = {self}
        try:
#G          _tm_r.gpu.opt_start()
            _tm_n0 = _tm_r.fwd + _tm_r.bwd
            _tm_t0 = _tm_pc()
            _tm_out = _tm_orig({call})
            _tm_r.opt += _tm_pc() - _tm_t0 - (_tm_r.fwd + _tm_r.bwd - _tm_n0)
#G          _tm_r.gpu.opt_stop()
        finally:
            _tm_r.opt_owner = None
#I      _tm_infer_boundary({self})
        return _tm_out"""

_MARKS = ("#C", "#G", "#I", "#N")


def _variant(template: str, gpu: bool, infer: bool = False) -> str:
    keep = {"#C": not gpu, "#G": gpu, "#I": infer, "#N": not infer}
    out = []
    for line in template.split("\n"):
        head = line.lstrip()
        mark = head[:2]
        if mark in _MARKS:
            if not keep[mark]:
                continue
            line = line.replace(mark, "  ", 1)
        out.append(line)
    return "\n".join(out)


# What inference.py installs while steps are inferred (module globals, so the generated wrappers
# find the current ones): open a step at the first backward or optimizer step; end one at each
# optimizer step's return.
def _tm_infer_open() -> None:
    pass


def _tm_infer_boundary(optimizer: Any) -> None:
    pass


def make_forward(orig: Callable[..., Any], gpu: bool = False) -> Callable[..., Any]:
    from .codegen import specialise

    return specialise(orig, _variant(_FORWARD_TEMPLATE, gpu), timed_forward, globals(),
                      first_param="self")


def make_backward(orig: Callable[..., Any], gpu: bool = False, infer: bool = False) -> Callable[..., Any]:
    from .codegen import specialise

    return specialise(orig, _variant(_BACKWARD_TEMPLATE, gpu, infer),
                      inferred_backward if infer else timed_backward, globals())


def make_step(orig: Callable[..., Any], gpu: bool = False, infer: bool = False) -> Callable[..., Any]:
    """Wrap an optimizer class's ``step``: one call per step instead of torch's two global hooks
    (pre and post), which was measured ~0.3 us cheaper per step; an optimizer stepping inside
    another (a wrapper such as ZeroRedundancyOptimizer) is counted once, by the outer one."""
    from .codegen import specialise

    return specialise(orig, _variant(_STEP_TEMPLATE, gpu, infer),
                      inferred_step if infer else timed_step, globals(), first_param="self")


def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global ``Optimizer.step`` pre-hook: the fallback when an optimizer class's ``step`` cannot
    be wrapped (see patches.py). Nested optimizers are counted once, by the outer one."""
    r = REC
    # (an owner left from an earlier step means that step's optimizer raised: start afresh)
    if r is not None and r.active and (r.opt_owner is None or r.opt_t0 < r.t0):
        r.opt_owner = optimizer
        if r.gpu is not None:
            r.gpu.opt_start()
        r.opt_t0 = perf_counter_ns()


def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    r = REC
    if r is not None and r.opt_owner is optimizer:
        r.opt += perf_counter_ns() - r.opt_t0
        r.opt_owner = None
        if r.gpu is not None:
            r.gpu.opt_stop()


def set_recorder(recorder: Optional[StepRecorder]) -> None:
    global REC, _tm_REC
    REC = _tm_REC = recorder
