"""Communication timing: DDP gradient buckets and explicit collectives, attributed to traced steps.

What is measured, per traced step (the ``comm_*`` step columns of the wire protocol):

* ``comm_ns`` - **exposed** communication: the time this rank's training thread waited for
  collectives. A blocking collective (``dist.all_reduce(t)``) is exposed for its whole duration;
  an asynchronous one (``async_op=True``) for the time spent in ``work.wait()``; a DDP backward for
  the time from the moment its last gradient bucket was ready (its own compute done) to the
  moment the last bucket's all-reduce completed - the part of backward that waits for the
  network. The phase a wait happened in (forward, backward, optimizer) is reported *without* it,
  so ``backward_ns`` is backward's compute and ``comm_ns`` its wait.
* ``comm_busy_ns`` - the time at least one collective was in flight (the union of their
  intervals from launch to completion, overlapped with compute or not);
* ``comm_bytes`` - the collectives' sizes ``S`` as nccl-tests defines them (all-reduce,
  broadcast, reduce: the tensor; all-gather: the gathered output; reduce-scatter and all-to-all:
  the input), summed; ``comm_bus_bytes`` - each size times its operation's bus factor
  (:func:`bus_factor`), summed. So ``algbw = comm_bytes / comm_busy_ns`` and
  ``busbw = comm_bus_bytes / comm_busy_ns``: nccl-tests' algorithm and bus bandwidth, for the
  collectives of the step taken together;
* ``comm_calls`` - collectives launched in the step.

How: DDP's gradient all-reduce never passes through ``torch.distributed.all_reduce`` (the reducer
calls the process group from C++). On **CPU** (gloo), TraceML reads the reducer's own timings once
per step (:class:`Watched`: when the first bucket was launched, when the last gradient was ready,
when the last all-reduce completed), which costs the same whatever the number of buckets; a
Python comm hook would cost a GIL hand-over on gloo's thread for every bucket. On **CUDA** those
timings synchronise the device, so every DDP model there gets a communication hook instead
(:func:`ddp_hook`) that runs the default all-reduce (or the user's own hook, registered later
through ``register_comm_hook``) and records CUDA events at each bucket's launch and completion,
resolved later by :class:`~.cuda_timing.CudaPhaseTimer` without ever synchronising. The collective
functions of ``torch.distributed`` (:data:`OPS`) and ``Work.wait`` are wrapped at module/class
level: wall clock on CPU, events on CUDA.

When communication is *not measured* (the columns say -1, the summary "not measured"): before a
process group exists; when a CUDA DDP model carries a hook TraceML cannot wrap (a built-in or
Python hook registered before ``traceml.init()``, sparse gradients) or any DDP model uses the
compiled python reducer; and when collectives run on CUDA tensors without CUDA-event timing (no
CUDA model passed to ``trace_step``) - the wait would be hidden or unmeasurable, so no figure is
better than a low one.

Cost: a step without collectives pays one attribute test at its exit; a CPU DDP step about
50-70 us for reading the reducer's timings (whatever its bucket count); an explicit collective
~20 us; see benchmarks/README.md ("Communication timing").
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from time import perf_counter_ns, time_ns
from typing import Any, Callable, NamedTuple, Optional

from . import hotpath
from .driven import StepDriver

log = logging.getLogger("traceml")

#: wrapped ``torch.distributed`` functions -> how nccl-tests sizes them (see :func:`_size_of`)
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single",
       "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
       "all_to_all", "all_to_all_single", "barrier")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: ``busbw = algbw * factor`` for a group of ``n`` ranks.

    All-reduce moves ``2(n-1)/n`` of its size over each rank's link, all-gather, reduce-scatter and
    all-to-all ``(n-1)/n``, broadcast and reduce the size itself (nccl-tests, PERFORMANCE.md).
    """
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    if op == "barrier":
        return 0.0
    return (n - 1) / n


class Collective(NamedTuple):
    """A collective this rank launched and that has not completed yet."""

    op: str            # "all_reduce", ..., or "ddp_bucket" (a DDP gradient bucket's all-reduce)
    nbytes: int        # its size S (see the module docstring)
    seq: int           # this rank's count of collectives TraceML saw before it (0-based)
    started_ns: int    # wall clock (time.time_ns) at launch
    group_size: int


#: outstanding collectives by ``seq``; written at launch and completion (any thread), read by
#: :func:`in_flight`. One dict operation each way: cheap enough to be always on.
_INFLIGHT: dict[int, Collective] = {}
_SEQ = [0]


def in_flight() -> Optional[Collective]:
    """The oldest collective this rank launched that has not completed, or None.

    For the hang autopsy: a rank stuck in communication is stuck in this one (an all-reduce's
    partner never arrived), and comparing ``seq`` across ranks shows which rank fell behind.
    Safe to call from any thread at any time; costs a dict copy of the few outstanding entries.
    Counts collectives launched while tracing is on (inside traced steps or not) through the
    functions in :data:`OPS`, and DDP's gradient buckets on CUDA (on CPU DDP's reducer runs them
    unseen: a rank stuck there shows ``backward`` in its stack dump instead).
    """
    for _ in range(3):
        try:
            items = list(_INFLIGHT.values())
            break
        except RuntimeError:   # resized by another thread while copying: try again
            continue
    else:
        return None
    return min(items, key=lambda c: c.seq) if items else None


def launched() -> int:
    """Collectives this rank launched so far (while tracing was on): the ``seq`` the next one gets.
    For the hang autopsy, like :func:`in_flight`."""
    return _SEQ[0]


def _launch(op: str, nbytes: int, n: int) -> int:
    seq = _SEQ[0]
    _SEQ[0] = seq + 1
    _INFLIGHT[seq] = Collective(op, nbytes, seq, time_ns(), n)
    return seq


def _landed(seq: int) -> None:
    _INFLIGHT.pop(seq, None)


# ---- per-step accounting (lives on the recorder as ``r.comm``) -------------------------------------

class CommAccount:
    """What the collectives of the current step left behind; turned into a row at step exit.

    ``spans`` are ``[t0, t1, S, bus_bytes]`` lists (``t1`` is filled in by the completion
    callback, maybe on another thread); ``rounds`` are DDP backward passes:
    ``(t_last_bucket_ready, [spans])``. ``sub`` holds the exposed time to take out of forward,
    backward and optimizer. With CUDA timing the same facts are CUDA events, kept by the
    recorder's CudaPhaseTimer instead.
    """

    __slots__ = ("spans", "exposed", "sub_fwd", "sub_bwd", "sub_opt", "rounds", "round", "works")

    def __init__(self) -> None:
        self.spans: list[list[Any]] = []
        self.exposed = 0
        self.sub_fwd = self.sub_bwd = self.sub_opt = 0
        self.rounds: list[tuple[int, list[list[Any]]]] = []
        self.round: list[list[Any]] = []
        #: id(Work) -> (Work, its span (None: timed with CUDA events), seq): asynchronous
        #: collectives of this step not waited yet
        self.works: dict[int, tuple[Any, Any, int]] = {}

    def reset(self) -> None:
        self.spans = []
        self.exposed = 0
        self.sub_fwd = self.sub_bwd = self.sub_opt = 0
        self.rounds = []
        self.round = []
        for _work, span, seq in self.works.values():
            if span is not None:
                _landed(seq)        # never waited in its step: no longer tracked
        self.works = {}

    def figures(self) -> "CommFigures":
        """This step's figures from the host clock; resets the account."""
        exposed, sub_bwd = self.exposed, self.sub_bwd
        rounds = self.rounds
        if self.round:      # a backward whose last bucket we did not see (an error)
            rounds.append((max(s[0] for s in self.round), self.round))
        for last_ready, spans in rounds:
            ends = [s[1] for s in spans if s[1] is not None]
            if ends:
                wait = max(0, max(ends) - last_ready)
                exposed += wait
                sub_bwd += wait
        done = [s for s in self.spans if s[1] is not None]
        out = CommFigures(exposed, union_ns([(s[0], s[1]) for s in done]), sum(s[2] for s in done),
                          sum(s[3] for s in done), self.sub_fwd, sub_bwd, self.sub_opt)
        self.reset()
        return out

    def row(self, r: "hotpath.StepRecorder", t1: int, mem: int) -> tuple[int, ...]:
        """The step's row with its communication columns (CPU timing); resets the account."""
        calls = r.cn
        r.cn = 0
        if r.cdef < 0:      # coverage incomplete: say nothing rather than something too low
            self.reset()
            return (t1, t1 - r.t0, r.inp, r.fwd, r.bwd, r.opt, -1, mem, -1, -1, -1, -1, -1)
        f = self.figures()
        return (t1, t1 - r.t0, r.inp, without(r.fwd, f.sub_fwd), without(r.bwd, f.sub_bwd),
                without(r.opt, f.sub_opt), -1, mem, f.exposed, f.busy, f.nbytes, int(f.bus), calls)


class CommFigures(NamedTuple):
    """One step's communication, before it becomes columns (see the module docstring)."""

    exposed: int
    busy: int
    nbytes: int
    bus: float
    sub_fwd: int      # exposed time that happened inside forward, backward, optimizer
    sub_bwd: int
    sub_opt: int

    def plus(self, o: "CommFigures") -> "CommFigures":
        return CommFigures(*(a + b for a, b in zip(self, o)))


#: a wait may exceed the phase it was charged to by this share of the phase (two clocks: the
#: phase's host times and, for DDP, the reducer's own timings) and still leave it at 0
CLOCK_SLACK = 1 / 32


def without(phase_ns: int, wait_ns: int) -> int:
    """A phase's time without the communication it waited for (unmeasured phases stay -1).

    When more wait was charged to the phase than it lasted (beyond :data:`CLOCK_SLACK`), the
    wait did not all happen inside it, so its own time is not known: -1 (not measured), never a
    made-up 0 (a clamp once hid a wrongly charged Lightning broadcast behind "optimizer 0.0 ms")."""
    if wait_ns <= 0 or phase_ns <= 0:
        return phase_ns
    own = phase_ns - wait_ns
    if own >= 0:
        return own
    return 0 if -own <= phase_ns * CLOCK_SLACK else -1


def union_ns(intervals: list[tuple[Any, Any]]) -> int:
    """Total length of the union of ``(start, end)`` intervals (overlaps counted once)."""
    if not intervals:
        return 0
    intervals = sorted(intervals)
    total = 0
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    total += cur_e - cur_s
    return int(total)


def _in_backward() -> bool:
    try:
        return _graph_task_id() != -1
    except Exception:
        return False


def _graph_task_id() -> int:
    import torch

    return torch._C._current_graph_task_id()


def _phase_of(r: "hotpath.StepRecorder") -> int:
    """The traced phase a wait happens in: forward, optimizer, backward, or none (0)."""
    if r.in_fwd:
        return hotpath.C_FWD
    owner = r.opt_owner
    if owner is not None and (owner.optimizer_running if isinstance(owner, StepDriver) else True):
        return hotpath.C_OPT
    if _in_backward():
        return hotpath.C_BWD
    return 0


def _charge(a: CommAccount, phase: int, wait: int) -> None:
    a.exposed += wait
    if phase == hotpath.C_BWD:
        a.sub_bwd += wait
    elif phase == hotpath.C_FWD:
        a.sub_fwd += wait
    elif phase == hotpath.C_OPT:
        a.sub_opt += wait


# ---- sizes ----------------------------------------------------------------------------------------

def _nbytes(t: Any) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name)


_SIZERS: dict[str, Callable[[tuple, dict], tuple[int, Any]]] = {
    # op: (args, kwargs) -> (S, a tensor of the collective, for its device)
    "all_reduce": lambda a, k: (_nbytes(_arg(a, k, 0, "tensor")), _arg(a, k, 0, "tensor")),
    "reduce": lambda a, k: (_nbytes(_arg(a, k, 0, "tensor")), _arg(a, k, 0, "tensor")),
    "broadcast": lambda a, k: (_nbytes(_arg(a, k, 0, "tensor")), _arg(a, k, 0, "tensor")),
    "all_gather": lambda a, k: (sum(_nbytes(t) for t in (_arg(a, k, 0, "tensor_list") or ())),
                                _arg(a, k, 1, "tensor")),
    "all_gather_single": lambda a, k: (_nbytes(_arg(a, k, 0, "output_tensor")), _arg(a, k, 1, "input_tensor")),
    "all_gather_into_tensor": lambda a, k: (_nbytes(_arg(a, k, 0, "output_tensor")),
                                            _arg(a, k, 1, "input_tensor")),
    "reduce_scatter": lambda a, k: (sum(_nbytes(t) for t in (_arg(a, k, 1, "input_list") or ())),
                                    _arg(a, k, 0, "output")),
    "reduce_scatter_single": lambda a, k: (_nbytes(_arg(a, k, 1, "input")), _arg(a, k, 1, "input")),
    "reduce_scatter_tensor": lambda a, k: (_nbytes(_arg(a, k, 1, "input")), _arg(a, k, 1, "input")),
    "all_to_all": lambda a, k: (sum(_nbytes(t) for t in (_arg(a, k, 1, "input_tensor_list") or ())),
                                _arg(a, k, 0, "output_tensor_list")),
    "all_to_all_single": lambda a, k: (_nbytes(_arg(a, k, 1, "input")), _arg(a, k, 1, "input")),
    "barrier": lambda a, k: (0, None),
}
#: positional index and keyword name of the ``group`` and ``async_op`` parameters per op
_GROUP_ASYNC = {
    "all_reduce": (2, 3), "reduce": (3, 4), "broadcast": (2, 3), "all_gather": (2, 3),
    "all_gather_single": (2, 3), "all_gather_into_tensor": (2, 3), "reduce_scatter": (3, 4),
    "reduce_scatter_single": (3, 4), "reduce_scatter_tensor": (3, 4), "all_to_all": (2, 3),
    "all_to_all_single": (4, 5), "barrier": (0, 1),
}


#: the default group's size (``dist.get_world_size()`` walks c10d's Python globals: ~8 us);
#: forgotten when a process group is made
_SIZES: dict[Any, int] = {}


def _group_size(group: Any) -> int:
    try:
        if group is not None:
            return int(group.size())        # a ProcessGroup answers itself, in C++
        n = _SIZES.get(None)
        if n is None:
            import torch.distributed as dist

            n = _SIZES[None] = int(dist.get_world_size())
        return n
    except Exception:
        return 0


# ---- the wrappers -----------------------------------------------------------------------------------

#: >0 while a wrapped collective runs on some thread: collectives it makes itself (all_gather_into_tensor
#: calls all_gather_single; our DDP hook calls all_reduce) are not counted twice
_depth = [0]
_ORIG: dict[str, Callable[..., Any]] = {}


def _wrap_collective(op: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    sizer = _SIZERS[op]
    gi, ai = _GROUP_ASYNC[op]

    @functools.wraps(orig)
    def collective(*args: Any, **kwargs: Any) -> Any:
        r = hotpath.REC
        if r is None or _depth[0]:
            return orig(*args, **kwargs)
        if _WATCHED and _in_backward():
            # a DDP comm hook's own collectives (a CPU DDP model's reducer times its reduction,
            # hook included): counted there, not twice
            return orig(*args, **kwargs)
        try:
            nbytes, tensor = sizer(args, kwargs)
            n = _group_size(_arg(args, kwargs, gi, "group"))
            bus = nbytes * bus_factor(op, n)
            is_async = bool(_arg(args, kwargs, ai, "async_op"))
            cuda = tensor is not None and _is_cuda(tensor)
            gpu = r.gpu if (r.active and cuda) else None
        except Exception:
            return orig(*args, **kwargs)
        seq = _launch(op, nbytes, n)
        if r.active and cuda and gpu is None:
            _no_device_timing(r)
        active = r.active and r.cdef >= 0
        ev0 = gpu.start() if gpu is not None and active else None
        _depth[0] += 1
        t0 = perf_counter_ns()
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            _landed(seq)
            raise
        finally:
            _depth[0] -= 1
        t1 = perf_counter_ns()
        if not is_async or out is None:
            _landed(seq)
            if active:
                r.cn += 1
                if ev0 is not None:
                    gpu.comm_blocking(ev0, nbytes, bus, _phase_of(r))
                else:
                    a = r.comm
                    a.spans.append([t0, t1, nbytes, bus])
                    _charge(a, _phase_of(r), t1 - t0)
            return out
        # asynchronous: completion time from the work's future, exposed time from wait()
        try:
            fut = out.get_future()
        except Exception:
            _landed(seq)
            return out
        if active:
            r.cn += 1
            if ev0 is not None:
                r.comm.works[id(out)] = (out, None, seq)
                holder = gpu.comm_async(ev0, nbytes, bus)

                def done_gpu(f: Any, seq: int = seq) -> Any:
                    holder.append(gpu.end_event())     # NCCL runs this inline, at launch
                    _landed(seq)
                    return None
                fut.then(done_gpu)
                return out
            # CPU: no completion callback (it would take the GIL on gloo's thread for every
            # collective); wait() closes the span: at its start if the work had completed by
            # then, else at its end
            span = [t0, None, nbytes, bus]
            r.comm.spans.append(span)
            r.comm.works[id(out)] = (out, span, seq)
        else:
            fut.add_done_callback(lambda f, seq=seq: _landed(seq))
        return out

    collective._traceml = True  # type: ignore[attr-defined]
    return collective


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _is_cuda(t: Any) -> bool:
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return bool(getattr(t, "is_cuda", False))


def _wrap_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        r = hotpath.REC
        if r is None or not r.active:
            return orig(self, *args, **kwargs)
        works = r.comm.works
        entry = works.pop(id(self), None) if works else None
        if entry is None:
            return orig(self, *args, **kwargs)
        span = entry[1]
        if span is None:        # a CUDA collective: the wait is the current stream's, in events
            gpu = r.gpu
            ev0 = gpu.start()
            out = orig(self, *args, **kwargs)
            gpu.comm_wait(ev0, _phase_of(r))
            return out
        done = _completed(self)
        t0 = perf_counter_ns()
        out = orig(self, *args, **kwargs)
        t1 = perf_counter_ns()
        span[1] = t0 if done else t1
        _landed(entry[2])
        _charge(r.comm, _phase_of(r), t1 - t0)
        return out

    wait._traceml = True  # type: ignore[attr-defined]
    return wait


# ---- DDP ----------------------------------------------------------------------------------------------

class DdpHookState:
    """Our hook's state on one DDP model: its process group and the user's own hook, if any."""

    __slots__ = ("group", "pg", "size", "user_hook", "user_state", "builtin")

    def __init__(self, group: Any) -> None:
        self.group = group
        #: the ProcessGroup object to call directly (skips the Python c10d wrapper: ~30 us a call)
        self.pg = group if group is not None and hasattr(group, "allreduce") else _default_pg()
        self.size = _group_size(group) or 1
        self.user_hook: Optional[Callable[..., Any]] = None
        self.user_state: Any = None
        self.builtin: Any = None     # a BuiltinCommHookType registered after ours (emulated)


def _default_pg() -> Any:
    try:
        import torch.distributed as dist

        return dist.group.WORLD
    except Exception:
        return None


def _default_fut(state: DdpHookState, buf: Any) -> Any:
    """DDP's default reduction: average the bucket. The reducer without a hook multiplies by
    1/world while copying gradients into the bucket; we multiply the same way, so the result is
    bit-identical (``tensor.div_(n)``, as torch's allreduce_hook does, can differ in the last bit
    when n is not a power of two)."""
    buf.mul_(1.0 / state.size)
    if state.pg is not None:    # the process group's own call, as DDP's reducer makes it
        return state.pg.allreduce([buf]).get_future()
    return _ORIG["all_reduce"](buf, group=state.group, async_op=True).get_future()


def _user_fut(state: DdpHookState, bucket: Any) -> Any:
    if state.builtin is not None:
        hook = _builtin_hook(state.builtin)
        return hook(state.group, bucket)
    return state.user_hook(state.user_state, bucket)  # type: ignore[misc]


def _builtin_hook(kind: Any) -> Callable[..., Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.fp16_compress_hook if "FP16" in str(kind) else default_hooks.allreduce_hook


def _first(f: Any) -> Any:
    return f.value()[0]


def _value(f: Any) -> Any:
    return f.value()


def ddp_hook(state, bucket):  # type: ignore[no-untyped-def]
    """The communication hook TraceML registers on every DDP model (see the module docstring).

    No annotations on purpose: DDP's ``_check_comm_hook`` rejects any ``bucket`` or return
    annotation other than ``GradBucket`` / ``Future[Tensor]``, and ours would be strings."""
    r = hotpath.REC
    user = state.user_hook is not None or state.builtin is not None
    if r is not None and r.active and r.gpu is None and r.cdef >= 0 and bucket.buffer().is_cuda:
        _no_device_timing(r)
    if r is None or not r.active or r.cdef < 0:
        if user:
            return _user_fut(state, bucket)
        return _default_fut(state, bucket.buffer()).then(_first)
    buf = bucket.buffer()
    nbytes = _nbytes(buf)
    bus = nbytes * bus_factor("all_reduce", state.size)
    last = bucket.is_last()
    seq = _launch("ddp_bucket", nbytes, state.size)
    r.cn += 1
    gpu = r.gpu if buf.is_cuda else None
    _depth[0] += 1
    try:
        if gpu is not None:
            ev0 = gpu.start()
            fut = _user_fut(state, bucket) if user else _default_fut(state, buf)
            holder = gpu.comm_bucket(ev0, nbytes, bus, last)
            unwrap = _value if user else _first

            def done_gpu(f: Any) -> Any:
                holder.append(gpu.end_event())
                _landed(seq)
                return unwrap(f)
            return fut.then(done_gpu)
        t0 = perf_counter_ns()
        fut = _user_fut(state, bucket) if user else _default_fut(state, buf)
    except BaseException:
        _landed(seq)
        raise
    finally:
        _depth[0] -= 1
    a = r.comm
    span = [t0, None, nbytes, bus]
    a.spans.append(span)
    a.round.append(span)
    if last:
        a.rounds.append((t0, a.round))
        a.round = []

    if user:
        def done_user(f: Any) -> Any:
            span[1] = perf_counter_ns()
            _landed(seq)
            return f.value()
        return fut.then(done_user)

    def done(f: Any) -> Any:
        span[1] = perf_counter_ns()
        _landed(seq)
        return f.value()[0]
    return fut.then(done)


def _uncoverable(model: Any) -> Optional[str]:
    """Why we cannot time this DDP model's all-reduce, or None."""
    if getattr(model, "_use_python_reducer", False):
        return "it uses the python reducer (compiled autograd)"
    try:
        hook = model._get_ddp_logging_data().get("comm_hook")
    except Exception:
        hook = None
    if hook or getattr(model, "_comm_hooks", None):
        return (f"it already has a communication hook ({hook or 'python'}) registered before "
                "traceml.init(); call traceml.init() before creating the DDP model")
    try:
        for m in model.module.modules():
            if getattr(m, "sparse", False) is True:
                return "it has sparse gradients (communication hooks do not support them)"
    except Exception:
        pass
    return None


#: TEST HOOK ONLY: use the comm-hook path (the one CUDA models take) for CPU models too, so its
#: logic (user hooks inside ours, bit-identical averaging) is tested on machines without a GPU
_HOOK_ON_CPU = os.environ.get("TRACEML_TEST_DDP_COMM_HOOK") == "1"


def _on_cuda(model: Any) -> bool:
    return _HOOK_ON_CPU or getattr(model, "device_type", "cpu") == "cuda"


def hook_model(model: Any) -> bool:
    """Time a DDP model's all-reduce (idempotent); False (and comm "not measured") if we cannot.

    On CUDA: TraceML's comm hook with CUDA events (see :func:`ddp_hook`). On CPU: DDP's own
    reducer timer, read once per step (:class:`Watched`), because a Python hook there costs a
    GIL hand-over per bucket on gloo's thread (~250 us per bucket measured, benchmarks/README.md)."""
    if getattr(model, "_traceml_comm", None) is not None:
        return True
    if not _on_cuda(model):
        return watch(model)
    why = _uncoverable(model)
    r = hotpath.REC
    if why is not None:
        if r is not None:
            r.cdef = -1
        _warn_once(f"traceml: communication is not measured: a DistributedDataParallel model cannot "
                   f"be timed because {why}")
        return False
    state = DdpHookState(getattr(model, "process_group", None))
    _register_orig(model, state, ddp_hook)
    model._traceml_comm = state
    return True


class Watched:
    """A DDP model on CPU whose all-reduce its own reducer times (``Logger`` runtime stats).

    DDP's reducer records, in C++, when the first bucket's all-reduce was launched, when the last
    gradient was ready (its compute done) and when the last all-reduce completed (``finalize``);
    with the sampling rate at 1 it does so every iteration. :func:`poll` reads them at step exit
    (one ``set_runtime_stats_and_log`` and one ``_get_ddp_logging_data``: ~15 us per step, not per
    bucket): exposed = comm end - compute end, in flight = comm end - comm start (first launch to
    last completion: it includes any gap between buckets), bytes = the buckets reduced. Only the
    last synchronising backward of a step is seen (gradient accumulation without ``no_sync()``
    syncs every micro-batch: the earlier ones are then not counted)."""

    __slots__ = ("ref", "last_end")

    def __init__(self, model: Any) -> None:
        self.ref = weakref.ref(model)
        self.last_end = 0


_WATCHED: list[Watched] = []


def watch(model: Any) -> bool:
    if getattr(model, "_use_python_reducer", False):
        r = hotpath.REC
        if r is not None:
            r.cdef = -1
        _warn_once("traceml: communication is not measured: a DistributedDataParallel model uses "
                   "the python reducer (compiled autograd), which keeps no timings")
        return False
    try:
        model._set_ddp_runtime_logging_sample_rate(1)
    except Exception:
        return False
    w = Watched(model)
    _WATCHED.append(w)
    model._traceml_comm = w
    from . import api

    api.use_comm_polling()
    return True


def poll(r: "hotpath.StepRecorder") -> None:
    """Add the communication of the watched DDP models' last backward, if it is new (step exit)."""
    for w in list(_WATCHED):
        m = w.ref()
        if m is None:
            _WATCHED.remove(w)
            continue
        try:
            m.logger.set_runtime_stats_and_log()
            d = m._get_ddp_logging_data()
            end = d.get("backward_comm_time_end") or 0
            start = d.get("backward_comm_time_start") or 0
            if not end or not start or end == w.last_end:
                continue                # no synchronising backward since the last step
            w.last_end = end
            ready = d.get("backward_compute_time_end") or start
            sizes = d.get("rebuilt_bucket_sizes") if d.get("has_rebuilt_buckets") else None
            sizes = [int(x) for x in str(sizes or d.get("bucket_sizes") or "").split(",") if x.strip()]
            calls = int(d.get("num_buckets_reduced") or len(sizes) or 1)
            n = int(d.get("world_size") or 1)
        except Exception:
            continue
        nbytes = sum(sizes)
        a = r.comm
        off = r.wall_offset         # the reducer's stamps are wall clock; spans are perf_counter
        a.spans.append([start - off, end - off, nbytes, nbytes * bus_factor("all_reduce", n)])
        wait = max(0, end - max(ready, start))
        a.exposed += wait
        a.sub_bwd += wait
        r.cn += calls


_warned = [False]


def _no_device_timing(r: "hotpath.StepRecorder") -> None:
    """A collective on CUDA tensors while the steps are timed on the host: the host returns
    before the GPU has communicated, so host times would say ~0. Not measured instead."""
    r.cdef = -1
    _warn_once("traceml: communication is not measured: collectives run on CUDA tensors, but no CUDA "
               "model was passed to trace_step(model), so TraceML has no CUDA-event timing to "
               "measure them with; pass the model to trace_step")


def _warn_once(msg: str) -> None:
    if not _warned[0]:
        _warned[0] = True
        log.warning(msg)


def _register_orig(model: Any, state: Any, hook: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig = _ORIG.get("ddp_register", DDP.register_comm_hook)
    orig(model, state, hook)


def _wrap_ddp_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if hotpath.REC is not None:
            try:
                hook_model(self)
            except Exception as exc:
                _warn_once(f"traceml: cannot time this DDP model's all-reduce ({type(exc).__name__}: "
                           f"{exc}); communication is not measured")
                if hotpath.REC is not None:
                    hotpath.REC.cdef = -1

    __init__._traceml = True  # type: ignore[attr-defined]
    return __init__


def _wrap_register(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        ours = getattr(self, "_traceml_comm", None)
        if ours is None or not isinstance(ours, DdpHookState):
            if hotpath.REC is None or not _on_cuda(self):
                return orig(self, state, hook)      # CPU: DDP's own timer sees every hook
            # first registration (e.g. DDP's own mixed-precision hook during __init__): ours
            # goes in with the user's hook inside
            self._check_comm_hook(hook)
            ours = DdpHookState(getattr(self, "process_group", None))
            ours.user_hook, ours.user_state = hook, state
            orig(self, ours, ddp_hook)
            self._traceml_comm = ours
            return None
        if ours.user_hook is not None or ours.builtin is not None:
            return orig(self, state, hook)     # the reducer's own "only once" error, as without us
        self._check_comm_hook(hook)
        ours.user_hook, ours.user_state = hook, state
        return None

    register_comm_hook._traceml = True  # type: ignore[attr-defined]
    return register_comm_hook


def _wrap_builtin(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        ours = getattr(self, "_traceml_comm", None)
        if (not isinstance(ours, DdpHookState) or ours.user_hook is not None
                or ours.builtin is not None):
            return orig(self, comm_hook_type)
        ours.builtin = comm_hook_type       # the documented Python equivalent runs inside ours
        return None

    _register_builtin_comm_hook._traceml = True  # type: ignore[attr-defined]
    return _register_builtin_comm_hook


def _wrap_init_pg(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        _SIZES.clear()
        mark_measured()
        return out

    init_process_group._traceml = True  # type: ignore[attr-defined]
    return init_process_group


def mark_measured() -> None:
    """A process group exists: steps without collectives now measure 0, not "not measured"."""
    r = hotpath.REC
    if r is not None and r.cdef == -2:
        r.cdef = 0


# ---- install / uninstall ----------------------------------------------------------------------------

def install(originals: list[tuple[Any, str, Any]]) -> bool:
    """Wrap torch.distributed's collectives, ``Work.wait`` and DDP (idempotent); records what it
    replaced in ``originals`` (patches.uninstall puts them back). False without torch.distributed."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return False
        from torch.distributed import distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:
        return False
    for op in OPS:
        orig = getattr(c10d, op, None)
        if orig is None or getattr(orig, "_traceml", False):
            continue
        _ORIG.setdefault(op, orig)
        wrapped = _wrap_collective(op, orig)
        for mod in (c10d, dist):
            if getattr(mod, op, None) is orig:
                originals.append((mod, op, orig))
                setattr(mod, op, wrapped)
    work = c10d.Work
    if not getattr(work.wait, "_traceml", False):
        originals.append((work, "wait", work.wait))
        work.wait = _wrap_wait(work.wait)
    for name, wrap in (("__init__", _wrap_ddp_init), ("register_comm_hook", _wrap_register),
                       ("_register_builtin_comm_hook", _wrap_builtin)):
        orig = DDP.__dict__.get(name)
        if orig is None or getattr(orig, "_traceml", False):
            continue
        if name == "register_comm_hook":
            _ORIG.setdefault("ddp_register", orig)
        originals.append((DDP, name, orig))
        setattr(DDP, name, wrap(orig))
    for mod in (c10d, dist):
        orig = getattr(mod, "init_process_group", None)
        if orig is not None and not getattr(orig, "_traceml", False):
            originals.append((mod, "init_process_group", orig))
            setattr(mod, "init_process_group", _wrap_init_pg(orig))
    return True


def attach(recorder: "hotpath.StepRecorder") -> None:
    """Start accounting on ``recorder``: measured from now on if a process group exists, and
    hook the DDP models that were built before ``init()`` (found once, by the garbage collector)."""
    recorder.cdef = -2       # "no process group yet": rows say not measured
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
    except Exception:
        return
    recorder.cdef = 0
    try:
        import gc

        from torch.nn.parallel import DistributedDataParallel as DDP

        # (type(obj).__mro__, not isinstance: isinstance reads obj.__class__, which on some torch
        # objects is a property that warns)
        for obj in [o for o in gc.get_objects() if DDP in type(o).__mro__]:
            hook_model(obj)
    except Exception:
        pass
