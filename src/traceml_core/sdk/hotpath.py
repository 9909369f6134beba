"""The per-step hot path: the step recorder, the ``trace_step`` context and the torch hook bodies.

Everything a traced step touches lives in this one module so the patched torch functions reach
the recorder through one module global (:data:`REC`, a plain ``LOAD_GLOBAL``) and so the cost
stays auditable. Rules kept here, because they are what makes the step cost a few microseconds:

* no I/O, no locks, no environment or file lookups, no logging;
* records go into preallocated columnar batches (one ``array('q')`` per
  :data:`~traceml_core.wire.protocol.STEP_COLUMNS` entry); a full (or old) batch is *sealed* by
  appending it to a deque that the client thread drains; ``deque.append``/``popleft`` are atomic
  under the GIL, so producer and consumer never wait on each other;
* memory is bounded: when no free batch is left (aggregator gone or slow) the record is dropped
  and counted in :attr:`StepRecorder.dropped` -- the exact number, never silently.

Timing model (what the user sees in the summary):

* ``step_ns`` = time inside ``trace_step`` + the input fetches credited to the step;
* ``input_ns`` = DataLoader ``__next__`` time spent inside the step, plus the fetches made after
  the previous step's exit and before this step's entry (the usual
  ``for batch in loader: with trace_step(model): ...`` shape). A forward pass of a traced model
  outside any step (evaluation) clears those pending fetches, so an evaluation loop between two
  steps is never credited to the next step; other work between steps (checkpointing, logging) is
  never timed at all;
* ``forward_ns``/``backward_ns``/``optimizer_ns`` accumulate every forward of a traced model,
  every ``torch.autograd.backward`` (``loss.backward()``) and every ``Optimizer.step`` inside the
  step; on CUDA they are replaced by CUDA-event times once the events have completed (see
  :mod:`.cuda_timing`);
* ``mem_peak`` is the highest memory sample taken by the client thread since the previous step
  (see :mod:`.memory`); -1 until the first sample.
"""

from __future__ import annotations

from array import array
from collections import deque
from time import perf_counter_ns, time_ns
from typing import Any, Callable, Optional

from ..wire.protocol import STEP_COLUMNS

# Column positions; the assert keeps this module honest if the protocol's columns ever move.
C_STEP, C_TEND, C_STEPNS, C_INPUT, C_FWD, C_BWD, C_OPT, C_H2D, C_MEM = range(9)
assert STEP_COLUMNS == (
    "step", "t_end_ns", "step_ns", "input_ns", "forward_ns", "backward_ns", "optimizer_ns",
    "h2d_ns", "mem_peak",
), "hotpath.py column indices out of date with protocol.STEP_COLUMNS"
NCOLS = len(STEP_COLUMNS)

#: The recorder of this process while tracing is on; ``None`` makes every patch a pass-through.
REC: Optional["StepRecorder"] = None


class Batch:
    """A fixed-size columnar block of step records; reused after the client has shipped it."""

    __slots__ = ("cols", "n", "seq")

    def __init__(self, size: int) -> None:
        zero = array("q", [0])
        self.cols = tuple(zero * size for _ in range(NCOLS))
        self.n = 0      # records written
        self.seq = 0    # sequence number (== step index) of the first record

    def column_lists(self) -> dict[str, list[int]]:
        n = self.n
        return {name: col[:n].tolist() for name, col in zip(STEP_COLUMNS, self.cols)}


class StepRecorder:
    """Per-process step state plus the batch pool; one instance, written by the training thread.

    The client thread only pops sealed batches (:meth:`pop`), gives them back (:meth:`recycle`,
    :meth:`unpop`) or discards them (:meth:`discard`), and writes the memory sample fields; it
    never touches the batch being filled. This object is the client's ``RecordSource``.
    """

    __slots__ = (
        "batch_size", "max_batches", "seal_ns", "free", "sealed", "allocated", "batch", "seal_at",
        "count", "dropped", "discarded",
        "depth", "active", "t0", "pre_input", "pending_input", "inp", "fwd", "bwd", "opt", "in_fwd", "opt_depth", "opt_t0", "models", "mem", "mem_last",
        "wall_offset", "gpu", "rank",
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
        self.free: deque[Batch] = deque(Batch(batch_size) for _ in range(prealloc))
        self.sealed: deque[Batch] = deque()
        self.allocated = prealloc
        self.batch: Optional[Batch] = self.free.popleft()
        self.seal_at = perf_counter_ns() + self.seal_ns
        self.count = 0        # records produced so far == next step index / sequence number
        self.dropped = 0      # records the hot path dropped (no free batch); written by the hot path only
        self.discarded = 0    # records the client thread discarded (refused, flush timed out)
        self.depth = 0        # trace_step nesting; only the outermost one records
        self.active = False
        self.t0 = 0
        self.pre_input = 0
        self.pending_input = 0
        self.inp = self.fwd = self.bwd = self.opt = 0
        self.in_fwd = False
        self.opt_depth = 0
        self.opt_t0 = 0
        self.models: set[int] = set()   # id() of models passed to trace_step (forward is timed)
        self.mem = -1                   # highest memory sample since the last step (client thread writes)
        self.mem_last = -1              # latest memory sample
        self.wall_offset = time_ns() - perf_counter_ns()
        self.gpu: Any = None            # a cuda_timing.CudaPhaseTimer once a CUDA model is traced

    # ---- hot path helpers (training thread) ----------------------------------------------------

    def _acquire(self, seq: int) -> Optional[Batch]:
        """A fresh batch for records starting at ``seq``; ``None`` when the pool is exhausted."""
        free = self.free
        if free:
            b = free.popleft()
        elif self.allocated < self.max_batches:
            self.allocated += 1
            b = Batch(self.batch_size)
        else:
            self.batch = None
            return None
        b.n = 0
        b.seq = seq
        self.batch = b
        return b

    def seal(self, now_ns: int) -> None:
        """Hand the current batch to the client thread and start a new one."""
        b = self.batch
        if b is not None and b.n:
            self.sealed.append(b)
            self._acquire(self.count)
        self.seal_at = now_ns + self.seal_ns

    def write(self, seq: int, t1: int, step_ns: int, inp: int, fwd: int, bwd: int, opt: int,
              h2d: int, mem: int) -> None:
        """Store one record (used by the CUDA path, which commits rows late; the CPU path inlines it)."""
        b = self.batch
        if b is None or b.seq + b.n != seq:
            if b is not None and b.n == 0:
                b.seq = seq         # an empty batch sealed ahead of late (CUDA) rows: just re-base it
            else:
                # the pool was exhausted earlier, or rows were dropped in between: new batch at seq
                if b is not None:
                    self.sealed.append(b)
                b = self._acquire(seq)
                if b is None:
                    self.dropped += 1
                    return
        i = b.n
        c = b.cols
        c[0][i] = seq
        c[1][i] = t1 + self.wall_offset
        c[2][i] = step_ns
        c[3][i] = inp
        c[4][i] = fwd
        c[5][i] = bwd
        c[6][i] = opt
        c[7][i] = h2d
        c[8][i] = mem
        i += 1
        b.n = i
        if i == self.batch_size or t1 >= self.seal_at:
            self.seal(t1)

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
        return {
            "t": "steps", "rank": self.rank, "seq": batch.seq, "n": batch.n,
            "cols": batch.column_lists(), "dropped": self.dropped + self.discarded,
        }

    def records(self, batch: Batch) -> int:
        return batch.n

    def recycle(self, batch: Batch) -> None:
        batch.n = 0
        self.free.append(batch)

    def discard(self, batch: Batch) -> None:
        self.discarded += batch.n
        self.recycle(batch)

    @property
    def lost(self) -> int:
        """Records known not to have been handed to the network (hot-path drops + discards)."""
        return self.dropped + self.discarded

    @property
    def buffered(self) -> int:
        b = self.batch
        return sum(x.n for x in list(self.sealed)) + (b.n if b is not None else 0)

    def flush_partial(self) -> None:
        """Seal the partly filled batch (shutdown; called on the training thread)."""
        self.seal(perf_counter_ns())


class StepContext:
    """What ``trace_step(model)`` returns: one reusable object, no allocation per step."""

    __slots__ = ("r",)

    def __init__(self, recorder: StepRecorder) -> None:
        self.r = recorder

    def __enter__(self) -> "StepContext":
        r = self.r
        if r.depth:
            r.depth += 1
            return self
        r.depth = 1
        pre = r.pending_input
        r.pending_input = 0
        r.pre_input = pre
        r.inp = pre
        r.fwd = r.bwd = r.opt = 0
        if r.gpu is not None:
            r.gpu.begin_step()
        r.in_fwd = False
        r.opt_depth = 0
        r.active = True
        r.t0 = perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = perf_counter_ns()
        r = self.r
        d = r.depth
        if d != 1:
            if d > 1:
                r.depth = d - 1
            return False
        r.depth = 0
        r.active = False
        seq = r.count
        r.count = seq + 1
        mem = r.mem
        r.mem = r.mem_last
        if r.gpu is not None:
            r.gpu.end_step(r, seq, t1, t1 - r.t0 + r.pre_input, mem)
            return False
        b = r.batch
        if b is None:
            b = r._acquire(seq)
            if b is None:
                r.dropped += 1
                return False
        i = b.n
        c = b.cols
        c[0][i] = seq
        c[1][i] = t1 + r.wall_offset
        c[2][i] = t1 - r.t0 + r.pre_input
        c[3][i] = r.inp
        c[4][i] = r.fwd if r.models else -1
        c[5][i] = r.bwd
        c[6][i] = r.opt
        c[7][i] = -1
        c[8][i] = mem
        i += 1
        b.n = i
        if i == r.batch_size or t1 >= r.seal_at:
            r.seal(t1)
        return False


class NullContext:
    """``trace_step`` when tracing is off: costs one call and two no-op methods."""

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
        d = perf_counter_ns() - t0
        if r.active:
            r.inp += d
        else:
            r.pending_input += d
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
            # evaluation (or any forward) between steps: fetches before it belong to it
            r.pending_input = 0
            if r.gpu is not None:
                r.gpu.clear_pre()
            return orig_forward(self, *args, **kwargs)
        if r.in_fwd:    # re-entrant call of the same traced model: counted once, by the outer call
            return orig_forward(self, *args, **kwargs)
        r.in_fwd = True
        gpu = r.gpu
        ev = gpu.start() if gpu is not None else None
        t0 = perf_counter_ns()
        try:
            out = orig_forward(self, *args, **kwargs)
        finally:
            r.in_fwd = False
        r.fwd += perf_counter_ns() - t0
        if ev is not None:
            gpu.stop(C_FWD, ev)
        return out

    return forward


def timed_backward(orig_backward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``torch.autograd.backward`` (which ``Tensor.backward`` calls)."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        r = REC
        if r is None or not r.active:
            return orig_backward(*args, **kwargs)
        gpu = r.gpu
        ev = gpu.start() if gpu is not None else None
        t0 = perf_counter_ns()
        out = orig_backward(*args, **kwargs)
        r.bwd += perf_counter_ns() - t0
        if ev is not None:
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
            gpu.stop(C_H2D, ev) if r.active else gpu.stop_pre(C_H2D, ev)
        else:
            gpu.release(ev)
        return out

    method.__wrapped__ = orig_method  # type: ignore[attr-defined]
    return method


_opt_gpu_ev: list[Any] = [None]


def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global ``Optimizer.step`` pre-hook; nested optimizers (wrappers) are counted once."""
    r = REC
    if r is None or not r.active:
        return None
    d = r.opt_depth
    r.opt_depth = d + 1
    if d == 0:
        if r.gpu is not None:
            _opt_gpu_ev[0] = r.gpu.start()
        r.opt_t0 = perf_counter_ns()
    return None


def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    r = REC
    if r is None or not r.active or r.opt_depth <= 0:
        return None
    d = r.opt_depth - 1
    r.opt_depth = d
    if d == 0:
        r.opt += perf_counter_ns() - r.opt_t0
        ev = _opt_gpu_ev[0]
        if ev is not None and r.gpu is not None:
            _opt_gpu_ev[0] = None
            r.gpu.stop(C_OPT, ev)
    return None


def set_recorder(recorder: Optional[StepRecorder]) -> None:
    global REC
    REC = recorder
