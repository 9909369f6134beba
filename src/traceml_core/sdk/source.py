"""Who decides where a step begins and ends in this process, and telling the aggregator so.

A step is the script's own ``with trace_step(...)`` block when it has one. A script without one,
started by ``traceml run``, gets its steps from the worker bootstrap (bootstrap.py): from a
framework's own hooks when the script trains with one (Lightning, the Hugging Face ``Trainer``:
see ``traceml_core.integrations``), else inferred from optimizer steps (inference.py). Exactly one
of these *owns* the step boundaries at a time; ``trace_step`` always wins (the script knows its
steps best), a framework integration wins over inference.

The owner is announced to the aggregator in an ``event`` frame of kind ``step_source`` (the
schema is :func:`traceml_core.wire.protocol.step_source`), so the summary can say how steps were
found, whether gradient accumulation was folded into them and what was not measured.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

log = logging.getLogger("traceml")


@dataclass(frozen=True)
class StepSource:
    """What the ``step_source`` event carries (see ``wire.protocol.STEP_SOURCES`` for ``source``)."""

    source: str
    #: micro-batches folded into one step as the framework is configured (gradient accumulation)
    accumulation: Optional[int] = None
    #: observed: backward passes per step, most common value (inferred steps only)
    backward_per_step: Optional[int] = None
    #: how many steps had that many backward passes, of how many steps (inferred steps only)
    backward_steps: Optional[list[int]] = None
    #: whether forward is timed (inferred steps time it only for DistributedDataParallel models)
    forward: bool = True
    #: e.g. "lightning 2.6.6"
    framework: Optional[str] = None
    #: what the integration could not do, in words (e.g. "optimizer step hook unavailable")
    note: Optional[str] = None

    def text(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None},
                          separators=(",", ":"))


@dataclass
class _State:
    current: Optional[StepSource] = None
    #: the object driving step boundaries (an integration's driver, or the inference module)
    owner: Any = None
    on_shutdown: list[Any] = field(default_factory=list)


_state = _State()


def current() -> Optional[StepSource]:
    return _state.current


def owner() -> Any:
    return _state.owner


def announce(src: StepSource) -> None:
    """Record ``src`` as this process's step source and tell the aggregator (best effort)."""
    _state.current = src
    from . import api

    api.notify({"t": "event", "kind": "step_source", "text": src.text(), "ts": _now()})


def update(**changes: Any) -> None:
    """Announce the current source again with ``changes`` (e.g. the observed accumulation)."""
    if _state.current is not None:
        announce(replace(_state.current, **changes))


def claim(owner: Any, src: StepSource) -> bool:
    """``owner`` takes the step boundaries over from inference (not from trace_step or another
    live integration); returns whether it now owns them."""
    from . import api, hotpath, inference

    if hotpath.REC is None:
        return False
    if _state.owner is not None and _state.owner is not owner and _state.owner is not inference.OWNER:
        return False
    if _state.current is not None and _state.current.source == "trace_step":
        return False
    if _state.owner is inference.OWNER:
        inference.stop()
    _state.owner = owner
    api.hand_steps_to_trace_step(True)
    announce(src)
    return True


def release(owner: Any) -> None:
    if _state.owner is owner:
        _state.owner = None


def take_over_for_trace_step() -> None:
    """The script called ``trace_step``: it owns the step boundaries from now on."""
    from . import inference

    prev = _state.owner
    if prev is inference.OWNER:
        inference.stop()
    elif prev is not None:
        try:
            prev.yield_to_trace_step()
        except Exception:
            pass
    _state.owner = None
    if prev is not None:
        log.info("traceml: the script calls trace_step, which defines the steps from now on")
    announce(StepSource("trace_step"))


def at_shutdown(fn: Any) -> None:
    if fn not in _state.on_shutdown:
        _state.on_shutdown.append(fn)


def before_shutdown() -> None:
    for fn in list(_state.on_shutdown):
        try:
            fn()
        except Exception:
            pass


def reset_for_tests() -> None:
    global _state
    _state = _State()


def _now() -> float:
    import time

    return time.time()
