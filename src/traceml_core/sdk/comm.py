"""Communication timing: the torch.distributed hooks (DDP gradient buckets and explicit
collectives), attributed to traced steps.

What the ``comm_*`` columns mean and how a step's figures add up: collectives.py.

How: DDP's gradient all-reduce never passes through ``torch.distributed.all_reduce`` (the reducer
calls the process group from C++). On **CPU** (gloo), TraceML reads the reducer's own timings once
per step (``timing.ReducerPolling``: when the first bucket was launched, when the last gradient was ready,
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
from time import perf_counter_ns
from typing import Any, Callable, Optional

from .collectives import bus_factor
from .recorder import C_BWD, C_FWD, C_OPT
from .step import COMM_INCOMPLETE, COMM_MEASURED, COMM_NO_GROUP, StepState
from .timing import ReducerPolling

log = logging.getLogger("traceml")

#: wrapped ``torch.distributed`` functions -> how nccl-tests sizes them (see :data:`_SIZERS`)
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single",
       "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
       "all_to_all", "all_to_all_single", "barrier")

#: TEST HOOK ONLY: use the comm-hook path (the one CUDA models take) for CPU models too, so its
#: logic (user hooks inside ours, bit-identical averaging) is tested on machines without a GPU
_HOOK_ON_CPU = os.environ.get("TRACEML_TEST_DDP_COMM_HOOK") == "1"


def _in_backward() -> bool:
    try:
        import torch

        return torch._C._current_graph_task_id() != -1
    except Exception:
        return False


def phase_of(t: StepState) -> int:
    """The traced phase a wait happens in: forward, optimizer, backward, or none (0).

    An integration's step driver (driven.py) may own the optimizer for a whole step without
    running it; it says when it does (``optimizer_running``)."""
    if t.in_fwd:
        return C_FWD
    owner = t.opt_owner
    if owner is not None and getattr(owner, "optimizer_running", True):
        return C_OPT
    if _in_backward():
        return C_BWD
    return 0


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


class Comm:
    """The torch.distributed hooks of one tracer: what they share, and how they are installed."""

    def __init__(self, t: StepState, originals: dict[str, Callable[..., Any]]) -> None:
        self.t = t
        #: originals called by our own code (the default all-reduce, DDP's register_comm_hook)
        self.orig = originals
        #: >0 while a wrapped collective runs on some thread: collectives it makes itself
        #: (all_gather_into_tensor calls all_gather_single; our DDP hook calls all_reduce) are
        #: not counted twice
        self.depth = 0
        #: the default group's size (``dist.get_world_size()`` walks c10d's Python globals:
        #: ~8 us); forgotten when a process group is made
        self.sizes: dict[Any, int] = {}
        #: the reducer timings of the DDP models on CPU (timing.ReducerPolling), once one is built
        self.polling: Optional[ReducerPolling] = None
        self.warned = False

    # ---- the default group, coverage ---------------------------------------------------------

    def group_size(self, group: Any) -> int:
        try:
            if group is not None:
                return int(group.size())        # a ProcessGroup answers itself, in C++
            n = self.sizes.get(None)
            if n is None:
                import torch.distributed as dist

                n = self.sizes[None] = int(dist.get_world_size())
            return n
        except Exception:
            return 0

    def mark_measured(self) -> None:
        """A process group exists: steps without collectives now measure 0, not "not measured"."""
        if self.t.cdef == COMM_NO_GROUP:
            self.t.set_comm(COMM_MEASURED)

    def not_measured(self, msg: str) -> None:
        self.t.set_comm(COMM_INCOMPLETE)
        self.warn_once(msg)

    def no_device_timing(self) -> None:
        """A collective on CUDA tensors while the steps are timed on the host: the host returns
        before the GPU has communicated, so host times would say ~0. Not measured instead."""
        self.not_measured(
            "traceml: communication is not measured: collectives run on CUDA tensors, but no CUDA "
            "model was passed to trace_step(model), so TraceML has no CUDA-event timing to "
            "measure them with; pass the model to trace_step")

    def warn_once(self, msg: str) -> None:
        if not self.warned:
            self.warned = True
            log.warning(msg)

    # ---- the collectives and Work.wait -------------------------------------------------------

    def wrap_collective(self, op: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        sizer = _SIZERS[op]
        gi, ai = _GROUP_ASYNC[op]
        t = self.t
        inflight = t.inflight
        comm = self

        @functools.wraps(orig)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if not t.on or comm.depth:
                return orig(*args, **kwargs)
            if comm.polling is not None and comm.polling.watched and _in_backward():
                # a DDP comm hook's own collectives (a CPU DDP model's reducer times its
                # reduction, hook included): counted there, not twice
                return orig(*args, **kwargs)
            try:
                nbytes, tensor = sizer(args, kwargs)
                n = comm.group_size(_arg(args, kwargs, gi, "group"))
                bus = nbytes * bus_factor(op, n)
                is_async = bool(_arg(args, kwargs, ai, "async_op"))
                cuda = tensor is not None and _is_cuda(tensor)
                gpu = t.timing.events if (t.active and cuda) else None
            except Exception:
                return orig(*args, **kwargs)
            seq = inflight.launch(op, nbytes, n)
            if t.active and cuda and gpu is None:
                comm.no_device_timing()
            active = t.active and t.cdef >= 0
            ev0 = gpu.start() if gpu is not None and active else None
            comm.depth += 1
            t0 = perf_counter_ns()
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                inflight.landed(seq)
                raise
            finally:
                comm.depth -= 1
            t1 = perf_counter_ns()
            if not is_async or out is None:
                inflight.landed(seq)
                if active:
                    t.cn += 1
                    if ev0 is not None:
                        gpu.comm_blocking(ev0, nbytes, bus, phase_of(t))
                    else:
                        t.comm.spans.append([t0, t1, nbytes, bus])
                        t.comm.charge(phase_of(t), t1 - t0)
                return out
            # asynchronous: completion time from the work's future, exposed time from wait()
            try:
                fut = out.get_future()
            except Exception:
                inflight.landed(seq)
                return out
            if active:
                t.cn += 1
                if ev0 is not None:
                    t.comm.works[id(out)] = (out, None, seq)
                    holder = gpu.comm_async(ev0, nbytes, bus)

                    def done_gpu(f: Any, seq: int = seq) -> Any:
                        holder.append(gpu.end_event())     # NCCL runs this inline, at launch
                        inflight.landed(seq)
                        return None
                    fut.then(done_gpu)
                    return out
                # CPU: no completion callback (it would take the GIL on gloo's thread for every
                # collective); wait() closes the span: at its start if the work had completed by
                # then, else at its end
                span = [t0, None, nbytes, bus]
                t.comm.spans.append(span)
                t.comm.works[id(out)] = (out, span, seq)
            else:
                fut.add_done_callback(lambda f, seq=seq: inflight.landed(seq))
            return out

        collective._traceml = True  # type: ignore[attr-defined]
        return collective

    def wrap_wait(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        t = self.t

        @functools.wraps(orig)
        def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not t.active:
                return orig(self, *args, **kwargs)
            works = t.comm.works
            entry = works.pop(id(self), None) if works else None
            if entry is None:
                return orig(self, *args, **kwargs)
            span = entry[1]
            if span is None:        # a CUDA collective: the wait is the current stream's, in events
                gpu = t.timing.events
                ev0 = gpu.start()
                out = orig(self, *args, **kwargs)
                gpu.comm_wait(ev0, phase_of(t))
                return out
            done = _completed(self)
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            t1 = perf_counter_ns()
            span[1] = t0 if done else t1
            t.inflight.landed(entry[2])
            t.comm.charge(phase_of(t), t1 - t0)
            return out

        wait._traceml = True  # type: ignore[attr-defined]
        return wait

    # ---- DDP -------------------------------------------------------------------------------------

    def hook_model(self, model: Any) -> bool:
        """Time a DDP model's all-reduce (idempotent); False (and comm "not measured") if we cannot.

        On CUDA: TraceML's comm hook with CUDA events (see :func:`ddp_hook`). On CPU: DDP's own
        reducer timer, read once per step (``timing.ReducerPolling``), because a Python hook
        there costs a GIL hand-over per bucket on gloo's thread (~250 us per bucket measured,
        benchmarks/README.md)."""
        if getattr(model, "_traceml_comm", None) is not None:
            return True
        if not _on_cuda(model):
            return self.watch(model)
        why = _uncoverable(model)
        if why is not None:
            self.not_measured(f"traceml: communication is not measured: a DistributedDataParallel "
                              f"model cannot be timed because {why}")
            return False
        state = DdpHookState(self, getattr(model, "process_group", None))
        self.register_orig(model, state, ddp_hook)
        model._traceml_comm = state
        return True

    def watch(self, model: Any) -> bool:
        """A DDP model on CPU: its reducer times its all-reduce, read at each step exit."""
        if getattr(model, "_use_python_reducer", False):
            self.not_measured("traceml: communication is not measured: a DistributedDataParallel "
                              "model uses the python reducer (compiled autograd), which keeps no "
                              "timings")
            return False
        if self.polling is None:
            self.polling = ReducerPolling()
        if not self.polling.watch(model):
            return False
        if self.t.timing.events is None:   # (CUDA timing times CUDA models' communication with events)
            self.t.use_timing(self.polling)
        return True

    def register_orig(self, model: Any, state: Any, hook: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        orig = self.orig.get("ddp_register", DDP.register_comm_hook)
        orig(model, state, hook)

    def wrap_ddp_init(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        t = self.t
        comm = self

        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            if not t.on:
                return
            try:
                comm.hook_model(self)
            except Exception as exc:
                comm.not_measured(f"traceml: cannot time this DDP model's all-reduce "
                                  f"({type(exc).__name__}: {exc}); communication is not measured")
            if t.infer:     # inferred steps time the forward of DDP models (inference.py)
                try:
                    t.inference.register(self)
                except Exception:
                    pass

        __init__._traceml = True  # type: ignore[attr-defined]
        return __init__

    def wrap_register(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        t = self.t
        comm = self

        @functools.wraps(orig)
        def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
            ours = getattr(self, "_traceml_comm", None)
            if ours is None or not isinstance(ours, DdpHookState):
                if not t.on or not _on_cuda(self):
                    return orig(self, state, hook)      # CPU: DDP's own timer sees every hook
                # first registration (e.g. DDP's own mixed-precision hook during __init__): ours
                # goes in with the user's hook inside
                self._check_comm_hook(hook)
                ours = DdpHookState(comm, getattr(self, "process_group", None))
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

    def wrap_init_pg(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        comm = self

        @functools.wraps(orig)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            comm.sizes.clear()
            comm.mark_measured()
            return out

        init_process_group._traceml = True  # type: ignore[attr-defined]
        return init_process_group

    def attach(self) -> None:
        """Start accounting: measured from now on if a process group exists, and hook the DDP
        models that were built before ``init()`` (found once, by the garbage collector)."""
        self.t.set_comm(COMM_NO_GROUP)      # "no process group yet": rows say not measured
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
        except Exception:
            return
        self.t.set_comm(COMM_MEASURED)
        try:
            import gc

            from torch.nn.parallel import DistributedDataParallel as DDP

            # (type(obj).__mro__, not isinstance: isinstance reads obj.__class__, which on some
            # torch objects is a property that warns)
            for obj in [o for o in gc.get_objects() if DDP in type(o).__mro__]:
                self.hook_model(obj)
        except Exception:
            pass


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _is_cuda(t: Any) -> bool:
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return bool(getattr(t, "is_cuda", False))


def _on_cuda(model: Any) -> bool:
    return _HOOK_ON_CPU or getattr(model, "device_type", "cpu") == "cuda"


class DdpHookState:
    """Our hook's state on one DDP model: its process group and the user's own hook, if any."""

    __slots__ = ("comm", "group", "pg", "size", "user_hook", "user_state", "builtin")

    def __init__(self, comm: Comm, group: Any) -> None:
        self.comm = comm
        self.group = group
        #: the ProcessGroup object to call directly (skips the Python c10d wrapper: ~30 us a call)
        self.pg = group if group is not None and hasattr(group, "allreduce") else _default_pg()
        self.size = comm.group_size(group) or 1
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
    return state.comm.orig["all_reduce"](buf, group=state.group, async_op=True).get_future()


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
    comm = state.comm
    t = comm.t
    user = state.user_hook is not None or state.builtin is not None
    if t.on and t.active and t.timing.events is None and t.cdef >= 0 and bucket.buffer().is_cuda:
        comm.no_device_timing()
    if not t.on or not t.active or t.cdef < 0:
        if user:
            return _user_fut(state, bucket)
        return _default_fut(state, bucket.buffer()).then(_first)
    buf = bucket.buffer()
    nbytes = _nbytes(buf)
    bus = nbytes * bus_factor("all_reduce", state.size)
    last = bucket.is_last()
    inflight = t.inflight
    seq = inflight.launch("ddp_bucket", nbytes, state.size)
    t.cn += 1
    gpu = t.timing.events if buf.is_cuda else None
    comm.depth += 1
    try:
        if gpu is not None:
            ev0 = gpu.start()
            fut = _user_fut(state, bucket) if user else _default_fut(state, buf)
            holder = gpu.comm_bucket(ev0, nbytes, bus, last)
            unwrap = _value if user else _first

            def done_gpu(f: Any) -> Any:
                holder.append(gpu.end_event())
                inflight.landed(seq)
                return unwrap(f)
            return fut.then(done_gpu)
        t0 = perf_counter_ns()
        fut = _user_fut(state, bucket) if user else _default_fut(state, buf)
    except BaseException:
        inflight.landed(seq)
        raise
    finally:
        comm.depth -= 1
    a = t.comm
    span = [t0, None, nbytes, bus]
    a.spans.append(span)
    a.round.append(span)
    if last:
        a.rounds.append((t0, a.round))
        a.round = []

    if user:
        def done_user(f: Any) -> Any:
            span[1] = perf_counter_ns()
            inflight.landed(seq)
            return f.value()
        return fut.then(done_user)

    def done(f: Any) -> Any:
        span[1] = perf_counter_ns()
        inflight.landed(seq)
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


# ---- install ------------------------------------------------------------------------------------------

def install(originals: list[tuple[Any, str, Any]], comm_originals: dict[str, Any],
            t: StepState) -> Optional[Comm]:
    """Wrap torch.distributed's collectives, ``Work.wait`` and DDP (idempotent) for ``t``;
    records what it replaced in ``originals`` (Patches.uninstall puts them back) and the
    originals our own code calls in ``comm_originals``. None without torch.distributed."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return None
        from torch.distributed import distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:
        return None
    comm = Comm(t, comm_originals)
    for op in OPS:
        orig = getattr(c10d, op, None)
        if orig is None or getattr(orig, "_traceml", False):
            continue
        comm_originals.setdefault(op, orig)
        wrapped = comm.wrap_collective(op, orig)
        for mod in (c10d, dist):
            if getattr(mod, op, None) is orig:
                originals.append((mod, op, orig))
                setattr(mod, op, wrapped)
    work = c10d.Work
    if not getattr(work.wait, "_traceml", False):
        originals.append((work, "wait", work.wait))
        work.wait = comm.wrap_wait(work.wait)
    for name, wrap in (("__init__", comm.wrap_ddp_init), ("register_comm_hook", comm.wrap_register),
                       ("_register_builtin_comm_hook", _wrap_builtin)):
        orig = DDP.__dict__.get(name)
        if orig is None or getattr(orig, "_traceml", False):
            continue
        if name == "register_comm_hook":
            comm_originals.setdefault("ddp_register", orig)
        originals.append((DDP, name, orig))
        setattr(DDP, name, wrap(orig))
    for mod in (c10d, dist):
        orig = getattr(mod, "init_process_group", None)
        if orig is not None and not getattr(orig, "_traceml", False):
            originals.append((mod, "init_process_group", orig))
            setattr(mod, "init_process_group", comm.wrap_init_pg(orig))
    return comm
