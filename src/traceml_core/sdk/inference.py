"""Steps inferred from optimizer steps, for a script that never calls ``trace_step``.

Started by the worker bootstrap (bootstrap.py) under ``traceml run`` (``Tracer.start_inference``).
The backward and optimizer hooks (hooks.py) test one flag (``StepState.infer``) and call this
object, and then:

* a step **ends** when ``Optimizer.step()`` returns, and the next one begins at that instant, so
  the steps tile the training time: one step = one optimizer step, everything from the end of one
  to the end of the next (the input fetch, forward, backward, optimizer, and whatever else the
  loop does: logging, ``zero_grad``, an evaluation every N steps). Gradient accumulation folds in
  by itself: the micro-batches' backward passes all fall inside the one step, and their number is
  counted and reported;
* the first step begins at the first backward or optimizer step (the input fetch before it is
  credited as usual), so it is partial; it is a warm-up step, which the summary leaves out;
* with several optimizers (a GAN's generator and discriminator), the one that stepped first ends
  steps and the others' time is in the step;
* phases: ``input`` is DataLoader (or ``wrap_dataloader``) fetch time, ``backward`` every
  ``torch.autograd.backward``, ``optimizer`` the optimizer steps; ``forward`` is timed only for
  ``DistributedDataParallel`` models (registered as they are built: the wrapper that the usual
  DDP script calls), otherwise it is "not measured" and shows inside the rest of the step;
* the step left open after the last optimizer step (evaluation, saving at the end) is not a step
  and is never recorded.

The first ``trace_step`` in the script, or a framework integration taking over (tracer.py), stops
inference.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

from .source import Ownership, StepSource
from .step import StepState

#: after this many inferred steps the observed backward passes per step are announced once
#: (also at shutdown); enough for the warm-up to be over
ANNOUNCE_AFTER = 8
_MAX_HISTOGRAM = 64


class Inference:
    """Steps inferred from optimizer steps, for one tracer (its ``inference``)."""

    def __init__(self, state: StepState, owners: Ownership,
                 register_model: Callable[[Any], None]) -> None:
        self.state = state
        self.owners = owners
        self._register_model = register_model
        self.primary: Optional[int] = None
        self.steps = 0
        self.backward: Counter[int] = Counter()
        self.models: set[int] = set()

    @property
    def on(self) -> bool:
        return self.state.infer

    def start(self) -> None:
        """Infer steps from now on (the tracer has checked that nothing else owns them)."""
        self.primary = None
        self.steps = 0
        self.backward.clear()
        self.state.infer = True
        self.owners.owner = self
        self.owners.at_shutdown(self._final_notice)
        self.owners.announce(StepSource("inferred", forward=False))

    def stop(self) -> None:
        """Back to plain hooks; an inferred step still open is dropped (never recorded)."""
        if not self.state.infer:
            return
        t = self.state
        t.infer = False
        t.abandon()
        for key in self.models:   # forward timing was ours; the new owner decides its own
            t.models.discard(key)
            if t.model_id == key:
                t.model_id = 0
        if not t.models:
            t.time_forward(False)
        self.models.clear()
        self.owners.release(self)

    def open(self) -> None:
        """The first backward or optimizer step since the last boundary opens a step."""
        t = self.state
        if t.active:
            return
        t.step.__enter__()
        t.nbwd = 0

    def boundary(self, optimizer: Any) -> None:
        """An optimizer step returned: a step ends, and the next one begins."""
        t = self.state
        if not t.active:
            return
        key = id(optimizer)
        if self.primary is None:
            self.primary = key
        elif key != self.primary:
            return
        ctx = t.step
        ctx.__exit__(None, None, None)
        n = t.nbwd
        t.nbwd = 0
        if n in self.backward or len(self.backward) < _MAX_HISTOGRAM:
            self.backward[n] += 1
        self.steps += 1
        ctx.__enter__()
        if self.steps == ANNOUNCE_AFTER:
            self._notice()

    def register(self, model: Any) -> None:
        """Time ``model``'s forward in inferred steps (DDP models, Accelerate's prepared models)."""
        if not self.state.infer:
            return
        self._register_model(model)
        self.models.add(id(model))
        if self.steps >= ANNOUNCE_AFTER or len(self.models) == 1:
            self.owners.update(forward=True)

    def _notice(self) -> None:
        if not self.backward:
            return
        (common, count), = self.backward.most_common(1)
        self.owners.update(backward_per_step=common,
                           backward_steps=[count, sum(self.backward.values())],
                           forward=bool(self.models))

    def _final_notice(self) -> None:
        if self.state.infer:
            self._notice()
