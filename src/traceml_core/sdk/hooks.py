"""The bodies of the torch patches, each written once: DataLoader fetch, model forward,
``torch.autograd.backward``, optimizer step, host-to-device copy.

Every body is bound to one :class:`~.step.StepState` when it is made (patches.py makes them for
the process's tracer), reads the host clock inline and calls the timing strategy's CUDA-event
part (``events``) only when it has one. Steps inferred from optimizer steps (inference.py) are
one flag (``infer``) the backward and step bodies test where a step is not open: no second
variant of any wrapper.

The forward, backward and step bodies are templates that codegen.py compiles with the wrapped
function's own parameters (a generic ``*args, **kwargs`` wrapper packs a tuple and a dict on
every call, ~0.3-0.4 us with the caches cold; measured per step in benchmarks/README.md). Only
``_tm_``-prefixed names are used inside, so no parameter of the wrapped function can shadow
them (codegen refuses parameters with that prefix). ``_tm_t`` is the step state; ``{self}`` the
wrapped method's first parameter.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

from . import codegen
from .recorder import C_BWD, C_FWD, C_H2D, C_INPUT, C_OPT
from .step import StepState

#: what the templates see besides the wrapped function, its defaults and ``_tm_t`` (the column
#: positions ``_TM_FWD``, ... are compiled in as constants: :func:`_columns`)
_NAMES: dict[str, Any] = {"_tm_pc": perf_counter_ns, "_tm_id": id}


def _columns(template: str) -> str:
    """``template`` with the column positions written in as numbers (a constant is cheaper to
    load than a global)."""
    for name, col in (("_TM_FWD", C_FWD), ("_TM_BWD", C_BWD), ("_TM_OPT", C_OPT)):
        template = template.replace(name, str(col))
    return template


# Forward: only instances passed to trace_step are timed. A forward between steps (evaluation)
# clears the fetches pending for the next step; a traced model inside another traced model is
# counted once, by the outer. The device-event part sees the forward's first argument (the
# batch: worksample.py measures it on sampled steps).
FORWARD = """
    def _tm_wrapper({params}):
        _tm_r = _tm_t
        if _tm_id({self}) not in _tm_r.models:
            return _tm_orig({call})
        if not _tm_r.active:
            _tm_r.forget_pending_input(False)
            return _tm_orig({call})
        if _tm_r.in_fwd:
            return _tm_orig({call})
        _tm_r.in_fwd = True
        _tm_ev = _tm_r.events
        _tm_k = _tm_ev.forward_start({first}) if _tm_ev is not None else None
        try:
            _tm_t0 = _tm_pc()
            _tm_out = _tm_orig({call})
            _tm_r.vals[_TM_FWD] += _tm_pc() - _tm_t0
        finally:
            _tm_r.in_fwd = False
        if _tm_k is not None:
            _tm_ev.phase_stop(_TM_FWD, _tm_k)
        return _tm_out"""

# Backward (``torch.autograd.backward``, which ``Tensor.backward`` calls). While steps are
# inferred, the first backward opens one (and the backward passes of a step are counted).
BACKWARD = """
    def _tm_wrapper({params}):
        _tm_r = _tm_t
        if not _tm_r.active:
            if not _tm_r.infer:
                return _tm_orig({call})
            _tm_r.inference.open()
        if _tm_r.infer:
            _tm_r.nbwd += 1
        _tm_ev = _tm_r.events
        _tm_k = _tm_ev.phase_start() if _tm_ev is not None else None
        _tm_t0 = _tm_pc()
        _tm_out = _tm_orig({call})
        _tm_r.vals[_TM_BWD] += _tm_pc() - _tm_t0
        if _tm_k is not None:
            _tm_ev.phase_stop(_TM_BWD, _tm_k)
        return _tm_out"""

# Optimizer step, one wrapper per optimizer class (one call per step where torch's global pre
# and post hooks would be two, measured ~0.3 us cheaper). An optimizer stepping inside another
# (ZeroRedundancyOptimizer) is counted once, by the outer; forward and backward inside
# ``step(closure)`` are theirs, not optimizer time. While steps are inferred, a step ends when
# the optimizer step returns (and opens at it if none is open).
STEP = """
    def _tm_wrapper({params}):
        _tm_r = _tm_t
        if _tm_r.opt_owner is not None:
            return _tm_orig({call})
        if not _tm_r.active:
            if not _tm_r.infer:
                return _tm_orig({call})
            _tm_r.inference.open()
        _tm_r.opt_owner = {self}
        _tm_ev = _tm_r.events
        _tm_k = _tm_ev.phase_start() if _tm_ev is not None else None
        _tm_v = _tm_r.vals
        try:
            _tm_n0 = _tm_v[_TM_FWD] + _tm_v[_TM_BWD]
            _tm_t0 = _tm_pc()
            _tm_out = _tm_orig({call})
            _tm_v = _tm_r.vals
            _tm_v[_TM_OPT] += _tm_pc() - _tm_t0 - (_tm_v[_TM_FWD] + _tm_v[_TM_BWD] - _tm_n0)
        finally:
            _tm_r.opt_owner = None
        if _tm_k is not None:
            _tm_ev.phase_stop(_TM_OPT, _tm_k)
        if _tm_r.infer:
            _tm_r.inference.boundary({self})
        return _tm_out"""


def forward(orig: Callable[..., Any], t: StepState, specialise: bool = True) -> Callable[..., Any]:
    """Wrap a model class's ``forward``."""
    return codegen.build(orig, _columns(FORWARD), _NAMES, t, method=True, specialise=specialise)


def backward(orig: Callable[..., Any], t: StepState, specialise: bool = True) -> Callable[..., Any]:
    """Wrap ``torch.autograd.backward``."""
    return codegen.build(orig, _columns(BACKWARD), _NAMES, t, specialise=specialise)


def step(orig: Callable[..., Any], t: StepState, specialise: bool = True) -> Callable[..., Any]:
    """Wrap an optimizer class's ``step``."""
    return codegen.build(orig, _columns(STEP), _NAMES, t, method=True, specialise=specialise)


def fetch(orig_next: Callable[[Any], Any], t: StepState) -> Callable[[Any], Any]:
    """Wrap a DataLoader-iterator ``__next__``: the fetch time goes to the open or next step
    (-1 until the step's first fetch: input not measured). StopIteration (end of epoch)
    propagates and is not credited."""

    def __next__(self: Any) -> Any:
        r = t
        if not r.on:
            return orig_next(self)
        t0 = perf_counter_ns()
        item = orig_next(self)
        if r.active:
            v = r.vals
            i = v[C_INPUT]
            v[C_INPUT] = (i if i > 0 else 0) + perf_counter_ns() - t0
        else:
            i = r.pending_input
            r.pending_input = (i if i > 0 else 0) + perf_counter_ns() - t0
        return item

    __next__.__wrapped__ = orig_next  # type: ignore[attr-defined]
    return __next__


def copy(orig: Callable[..., Any], t: StepState) -> Callable[..., Any]:
    """Wrap ``Tensor.to``/``Tensor.cuda`` (CUDA runs only): host-to-device copies get CUDA events.

    Only a CPU tensor can be the source of a host-to-device copy, so a CUDA tensor returns after
    one attribute check. A copy inside a step is credited to it; one between steps to the next
    step (the usual ``x = x.to(device)`` right after the fetch), unless an evaluation forward
    comes in between.
    """

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        ev = t.events
        if ev is None or self.is_cuda:
            return orig(self, *args, **kwargs)
        e0 = ev.start()
        out = orig(self, *args, **kwargs)
        if out is not self and getattr(out, "is_cuda", False):
            if t.active:
                ev.stop(C_H2D, e0)
            else:
                ev.stop_pre(C_H2D, e0)
        else:
            ev.release(e0)
        return out

    method.__wrapped__ = orig  # type: ignore[attr-defined]
    return method
