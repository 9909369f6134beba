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
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Optional


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


class Ownership:
    """Who owns the step boundaries now and what the aggregator was told about it (one per
    tracer). The rules of who may take them from whom are the tracer's (``Tracer.claim``)."""

    def __init__(self) -> None:
        self.current: Optional[StepSource] = None
        #: the object driving step boundaries (an integration's driver, or the inference)
        self.owner: Any = None
        #: how an announcement reaches the aggregator (the session's client; None: not sent)
        self.notify: Optional[Callable[[dict[str, Any]], Any]] = None
        self._on_shutdown: list[Callable[[], None]] = []

    def announce(self, src: StepSource) -> None:
        """Record ``src`` as this process's step source and tell the aggregator (best effort)."""
        self.current = src
        if self.notify is not None:
            self.notify({"t": "event", "kind": "step_source", "text": src.text(), "ts": time.time()})

    def update(self, **changes: Any) -> None:
        """Announce the current source again with ``changes`` (e.g. the observed accumulation)."""
        if self.current is not None:
            self.announce(replace(self.current, **changes))

    def release(self, owner: Any) -> None:
        if self.owner is owner:
            self.owner = None

    def at_shutdown(self, fn: Callable[[], None]) -> None:
        if fn not in self._on_shutdown:
            self._on_shutdown.append(fn)

    def before_shutdown(self) -> None:
        for fn in list(self._on_shutdown):
            try:
                fn()
            except Exception:
                pass
