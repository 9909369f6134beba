"""Steps driven by a framework's own hooks: what the integrations (``traceml_core.integrations``)
build on, so that each of them is a thin mapping from the framework's hook names to these calls.

A :class:`StepDriver` opens a step at the framework's "a training step begins" hook and closes it
at "the optimizer step is done" (so one step = one optimizer step, with every micro-batch of
gradient accumulation inside it), through the same step context as ``trace_step``: rows, CUDA
events, memory and communication accounting are exactly those of a traced step. Inside the step
the torch-level timers still measure input fetches, ``backward`` and (unless the integration
takes it over) the optimizer step; an integration adds the phase edges torch cannot see:

* ``forward_begin``/``forward_end``: Lightning's ``training_step`` is not a module's ``forward``;
  the integration brackets it between its batch-start and before-backward hooks. While the
  bracket is open, a traced model's own forward wrapper stays out (no double count);
* ``optimizer_begin``/``optimizer_end`` with ``owns_optimizer=True``: Lightning runs forward and
  backward *inside* ``optimizer.step(closure)``; timing that call would count them twice (the
  197% of the issue). The driver then keeps the torch optimizer timer out for the whole step and
  times only the part after the closure (``on_before_optimizer_step`` .. the step's return).

The phases an integration times are the step state's split brackets (``StepState.begin``/
``end``): the same host clock and CUDA events as the wrappers (hooks.py).

Nothing here raises into training: every public method catches, logs once and turns the driver
off (:meth:`StepDriver.failed`). A step left open by an exception is dropped, not recorded:
:meth:`abandon` (from the framework's exception hook, or at the next step's start).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .recorder import C_FWD, C_OPT
from .source import StepSource
from .tracer import TRACER, Tracer

log = logging.getLogger("traceml")


class StepDriver:
    """One per training run of a framework; see the module docstring."""

    def __init__(self, name: str, *, owns_optimizer: bool = False, owns_forward: bool = False) -> None:
        self.name = name
        self.owns_optimizer = owns_optimizer
        self.owns_forward = owns_forward
        self.claimed = False
        self.is_open = False
        self.micro = 0            # micro-batches in the open step
        self.stepped = False      # the optimizer stepped in the open step
        self.steps = 0
        self.off_reason: Optional[str] = None
        self._fwd: Any = None       # the open forward phase's token (StepState.begin)
        self._opt: Any = None       # the open optimizer phase's token

    # ---- ownership ---------------------------------------------------------------------------

    def claim(self, src: StepSource) -> bool:
        """Take the step boundaries (from inference); False when tracing is off, the script uses
        trace_step, or another integration drives them."""
        if self.off_reason is not None:
            return False
        try:
            self.claimed = TRACER.claim(self, src)
            if self.claimed and self.owns_forward:
                TRACER.time_forward(True)       # forward is measured from now on
            return self.claimed
        except Exception as exc:
            self.failed(exc)
            return False

    def release(self) -> None:
        try:
            self.abandon()
            TRACER.owners.release(self)
        except Exception:
            pass
        self.claimed = False

    def yield_to_trace_step(self) -> None:
        """The script's trace_step takes over (Tracer.take_over_for_trace_step)."""
        self.abandon()
        self.claimed = False

    def failed(self, exc: BaseException) -> None:
        """Turn this driver off for the rest of the process, never into training."""
        if self.off_reason is None:
            self.off_reason = f"{type(exc).__name__}: {exc}"
            log.warning("traceml: the %s integration stopped (%s); training continues, later "
                        "steps are not recorded", self.name, self.off_reason)
        try:
            self.abandon()
            TRACER.owners.release(self)
        except Exception:
            pass
        self.claimed = False

    # ---- boundaries --------------------------------------------------------------------------

    def _rec(self) -> Optional[Tracer]:
        return TRACER if self.claimed and TRACER.on else None

    def open(self) -> None:
        """A micro-batch begins: opens the step if none is open."""
        try:
            r = self._rec()
            if r is None:
                return
            if not self.is_open:
                if r.active:      # a step of ours that the framework never closed (exception)
                    r.abandon()
                r.step.__enter__()
                self.is_open = True
                self.micro = 0
                self.stepped = False
                if self.owns_optimizer:
                    r.opt_owner = self
            self.micro += 1
        except Exception as exc:
            self.failed(exc)

    def close(self) -> None:
        """The optimizer step is done: record the step."""
        try:
            r = self._rec()
            if r is None or not self.is_open:
                return
            self.forward_end()
            self.optimizer_end()
            self.is_open = False
            if r.opt_owner is self:
                r.opt_owner = None
            r.step.__exit__(None, None, None)
            self.steps += 1
        except Exception as exc:
            self.failed(exc)

    def abandon(self) -> None:
        """Drop the open step (an exception ended it); nothing is recorded for it."""
        if self.is_open and TRACER.on:
            TRACER.abandon()
        self.is_open = False
        self._fwd = None
        self._opt = None
        self.micro = 0

    @property
    def optimizer_running(self) -> bool:
        """Inside this driver's optimizer phase (``optimizer_begin`` .. ``optimizer_end``).

        With ``owns_optimizer`` the driver holds the recorder's ``opt_owner`` for the *whole*
        step, only to keep the torch optimizer timer out; so ``opt_owner`` alone does not mean
        "the optimizer is running" (comm.py asks this instead). Lightning broadcasts a tensor at
        the start of every batch: with gradient accumulation the second micro-batch's broadcast
        falls inside the open step, and its wait (ms) charged to the optimizer turned the
        optimizer phase (~0.3 ms) into 0."""
        return self._opt is not None

    # ---- phase edges torch cannot see ----------------------------------------------------------

    def forward_begin(self) -> None:
        try:
            r = self._rec()
            if r is None or not self.is_open or r.in_fwd:
                return
            r.in_fwd = True
            self._fwd = r.begin()
        except Exception as exc:
            self.failed(exc)

    def forward_end(self) -> None:
        try:
            r = self._rec()
            if r is None or not self.is_open or self._fwd is None:
                return
            token, self._fwd = self._fwd, None
            r.in_fwd = False
            r.end(C_FWD, token)
        except Exception as exc:
            self.failed(exc)

    def optimizer_begin(self) -> None:
        try:
            r = self._rec()
            if r is None or not self.is_open:
                return
            self.stepped = True
            if not self.owns_optimizer or self._opt is not None:
                return
            self.forward_end()
            self._opt = r.begin()
        except Exception as exc:
            self.failed(exc)

    def optimizer_end(self) -> None:
        try:
            r = self._rec()
            if r is None or self._opt is None:
                return
            token, self._opt = self._opt, None
            r.end(C_OPT, token)
        except Exception as exc:
            self.failed(exc)

    # ---- between steps -----------------------------------------------------------------------

    def forget_pending_input(self) -> None:
        """Fetches made outside training (validation, a sanity check) are not the next step's
        input wait."""
        if TRACER.on:
            TRACER.forget_pending_input(True)

    def time_model(self, model: Any) -> None:
        """Time ``model``'s forward as the step's forward (as ``trace_step(model)`` does)."""
        try:
            if self._rec() is not None:
                TRACER.register_model(model)
        except Exception as exc:
            self.failed(exc)

    def use_cuda(self, device: Any) -> None:
        """The framework's model lives on ``device``: time phases with CUDA events if it is a GPU."""
        try:
            if getattr(device, "type", None) == "cuda":
                TRACER.use_cuda(device)
        except Exception as exc:
            self.failed(exc)


def ensure_init() -> bool:
    """``traceml.init()`` for an integration used directly (idempotent); True if recording."""
    from . import api

    if TRACER.on:
        return True
    try:
        return bool(api.init())
    except Exception:
        return False
