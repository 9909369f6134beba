"""The process's tracer: one object that owns the step state, the record pool, the timing
strategy, the torch patches and who owns the step boundaries.

Everything a traced step touches is the tracer's :class:`~.step.StepState` (it *is* one): the
hooks are bound to it when the patches are installed, the step context is its ``step``, and what
``trace_step`` hands out is its ``trace_ctx``. Module layout, from the bottom up (each imports only
what is below it):

* ``recorder.py`` the record (from the protocol's column table) and the batch pool;
* ``collectives.py`` a step's communication figures and the one function that writes them;
* ``step.py`` the step state and the one step context;
* ``timing.py`` / ``cuda_timing.py`` the timing strategies (host clock, DDP reducer polling,
  CUDA events);
* ``codegen.py``, ``hooks.py`` the hook bodies; ``comm.py`` the torch.distributed hooks;
  ``patches.py`` installing them;
* ``source.py`` (who owns the step boundaries) and ``inference.py`` (steps inferred from
  optimizer steps);
* this module; then ``driven.py`` (framework integrations), ``memory.py``, ``api.py`` (the public
  functions and the session with its client), ``responders.py``, ``stackdump.py``,
  ``bootstrap.py``.

A timed span that is not a step phase yet (a checkpoint's ``torch.save``, say) would be: a
column in the protocol's table, a hook body in hooks.py that adds its host time (and its
events, on CUDA) to that column, and a line in ``Patches`` that installs it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Optional

from .inference import Inference
from .patches import Patches
from .recorder import StepRecorder
from .source import Ownership, StepSource
from .step import COMM_NO_GROUP, NULL_CONTEXT, StepState
from .timing import HostClock

log = logging.getLogger("traceml")


class FirstTraceStep:
    """What ``trace_step`` returns while steps are inferred or driven by a framework: its first
    use hands the step boundaries to ``trace_step`` (the script knows its steps best) and then it
    is never returned again."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: "Tracer") -> None:
        self.tracer = tracer

    def __enter__(self) -> Any:
        t = self.tracer
        t.take_over_for_trace_step()
        t.trace_ctx = t.step
        return t.step.__enter__()

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        return self.tracer.step.__exit__(et, ev, tb)


class Tracer(StepState):
    """One per process (:data:`TRACER`); tests and benchmarks may make their own over a recorder
    (without installing patches)."""

    __slots__ = ("trace_ctx", "patches", "owners", "first_trace_step", "_unweakrefable")

    def __init__(self, recorder: Optional[StepRecorder] = None) -> None:
        super().__init__(recorder if recorder is not None else StepRecorder(), HostClock())
        self.patches = Patches(self)
        self.owners = Ownership()
        self.inference = Inference(self, self.owners, self.register_model)
        self.first_trace_step = FirstTraceStep(self)
        self._unweakrefable: list[Any] = []
        #: what ``trace_step`` returns: the step context, NULL_CONTEXT, or first_trace_step
        self.trace_ctx: Any = self.step
        if recorder is None:
            self.on = False
            self.trace_ctx = NULL_CONTEXT

    # ---- on and off ------------------------------------------------------------------------------

    def start(self, recorder: StepRecorder, *, notify: Any = None, patch: bool = True) -> None:
        """Record into ``recorder`` from now on: install the patches (once per process) and time
        the DDP models built before ``init()``."""
        self.reset()
        self.rec = recorder
        self.owners.notify = notify
        if patch:
            self.patches.install_global()
        self.on = True
        self.trace_ctx = self.step
        if self.patches.comm_hooks is not None:
            self.patches.comm_hooks.attach()

    def stop(self) -> None:
        """Tracing off (refused, shut down, a forked child): every hook passes through and
        ``trace_step`` hands out a no-op context. May run on another thread."""
        self.on = False
        self.infer = False
        self.trace_ctx = NULL_CONTEXT

    def reset(self) -> None:
        """Forget every step, model and owner (a new session; tests). The patches stay."""
        self.stop()
        self.active = 0
        self.opt_owner = None
        self.in_fwd = False
        self.pending_input = -1
        self.models = set()
        self.model_id = 0
        self.nbwd = 0
        self.cn = 0
        self.comm.reset()
        self.mem = self.mem_last = -1
        self.raised_at = -1
        self.use_timing(HostClock())
        self.forward_timed = False
        self.set_comm(COMM_NO_GROUP)
        self.owners = Ownership()
        self.inference = Inference(self, self.owners, self.register_model)
        if self.patches.comm_hooks is not None:
            self.patches.comm_hooks.polling = None

    # ---- models --------------------------------------------------------------------------------

    def register_model(self, model: Any) -> None:
        """Time ``model``'s forward from now on, its all-reduce if it is DDP, and phases with
        CUDA events if it lives on a GPU. Never raises."""
        try:
            device = self._register(model)
            if device is not None:
                self.use_cuda(device)
        except Exception as exc:
            self.model_id = id(model)  # do not retry every step
            log.warning("traceml: could not instrument the model (%s: %s); its forward is not "
                        "timed", type(exc).__name__, exc)

    def _register(self, model: Any) -> Optional[Any]:
        compiled = hasattr(model, "_orig_mod")   # torch.compile keeps its forward on the instance
        key = id(model)
        comm = self.patches.comm_hooks
        if comm is not None and hasattr(model, "reducer") and hasattr(model, "process_group"):
            comm.hook_model(model)    # a DDP model
        if not compiled:
            self.patches.patch_forward(type(model))
            if not self.forward_timed:
                self.time_forward(True)
        # Ids, not references: holding the model would keep its memory (and a DDP model's process
        # group) alive until interpreter exit. trace_step compares against model_id to skip this.
        self.model_id = key
        if key not in self.models:
            self.models.add(key)
            try:
                # forget the id when the model goes: a new object at that address is a new model
                weakref.finalize(model, _forget_model, self, key).atexit = False
            except TypeError:
                self._unweakrefable.append(model)  # rare: keep it alive rather than risk a reused id
        return _cuda_device(model)

    def use_cuda(self, device: Any) -> None:
        """Time phases with CUDA events from now on (once: the first CUDA model or module seen)."""
        if self.timing.events is not None or not self.on:
            return
        from .cuda_timing import CudaPhaseTimer

        self.use_timing(CudaPhaseTimer(device))
        self.patches.install_copy_timing()

    # ---- who owns the step boundaries ------------------------------------------------------------

    def hand_steps_to_trace_step(self, on: bool) -> None:
        """While ``on``, the first ``trace_step`` takes the step boundaries over."""
        if self.on:
            self.trace_ctx = self.first_trace_step if on else self.step

    def start_inference(self) -> bool:
        """Infer steps from optimizer steps (no-op when tracing is off or something else owns
        the steps)."""
        o = self.owners
        if not self.on or self.infer or o.owner is not None:
            return False
        if o.current is not None and o.current.source == "trace_step":
            return False
        self.inference.start()
        self.hand_steps_to_trace_step(True)
        return True

    def claim(self, owner: Any, src: StepSource) -> bool:
        """``owner`` (a framework's step driver) takes the step boundaries over from inference
        (not from trace_step or another live integration); returns whether it now owns them."""
        o = self.owners
        if not self.on:
            return False
        if o.owner is not None and o.owner is not owner and o.owner is not self.inference:
            return False
        if o.current is not None and o.current.source == "trace_step":
            return False
        if o.owner is self.inference:
            self.inference.stop()
        o.owner = owner
        self.hand_steps_to_trace_step(True)
        o.announce(src)
        return True

    def take_over_for_trace_step(self) -> None:
        """The script called ``trace_step``: it owns the step boundaries from now on."""
        o = self.owners
        prev = o.owner
        if prev is self.inference:
            self.inference.stop()
        elif prev is not None:
            try:
                prev.yield_to_trace_step()
            except Exception:
                pass
        o.owner = None
        if prev is not None:
            log.info("traceml: the script calls trace_step, which defines the steps from now on")
        o.announce(StepSource("trace_step"))


def _forget_model(t: StepState, key: int) -> None:
    t.models.discard(key)
    if t.model_id == key:
        t.model_id = 0


def _cuda_device(model: Any) -> Optional[Any]:
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    try:
        for p in params():
            return p.device if p.is_cuda else None
    except Exception:
        return None
    return None


#: this process's tracer
TRACER = Tracer()
