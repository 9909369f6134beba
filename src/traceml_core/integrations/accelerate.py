"""Accelerate: steps from the optimizer that ``accelerator.prepare`` wrapped.

Use it directly (``traceml run`` does this by itself; see :mod:`.zero_code`)::

    from traceml_core.integrations.accelerate import attach
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    attach(accelerator)

Accelerate has no step hooks, and needs none: its optimizer wrapper steps the real torch
optimizer only when gradients are synchronised, i.e. once per accumulation window. So:

* a step ends when the real optimizer step returns and the next begins there (steps inferred from
  optimizer steps, see ``traceml_core.sdk.inference``); with ``gradient_accumulation_steps=N``
  (or ``accelerator.accumulate``) the N micro-batches are one step, said in the summary;
* ``input``: fetches from the prepared DataLoader; ``forward``: the prepared models' ``forward``;
  ``backward``: ``accelerator.backward(loss)`` (torch's autograd underneath); ``optimizer``: the
  real optimizer's step. Everything else the loop does between two optimizer steps (logging,
  ``zero_grad``, an evaluation) is in the step but in none of these phases.

A script that calls ``trace_step`` itself keeps its own steps (its first call takes over).
"""

from __future__ import annotations

from typing import Any, Iterable

from ..sdk.driven import ensure_init
from ..sdk.source import StepSource
from ..sdk.tracer import TRACER


def attach(accelerator: Any) -> bool:
    """Record steps for an Accelerate loop: call after ``accelerator.prepare(...)``. True when
    steps are being recorded (False: tracing is off, or trace_step or another integration owns
    the steps). Never raises."""
    try:
        if not ensure_init():
            return False
        cur = TRACER.owners.current
        if not TRACER.infer and not (cur is None or cur.source == "inferred"):
            return False
        TRACER.start_inference()
        prepared(accelerator, list(getattr(accelerator, "_models", []) or []))
        return TRACER.infer
    except Exception:
        return False


def prepared(accelerator: Any, objects: Any) -> None:
    """``accelerator.prepare`` returned ``objects``: time the models' forward, note accumulation."""
    try:
        if not TRACER.infer:
            return
        import torch

        objs: Iterable[Any] = objects if isinstance(objects, (list, tuple)) else (objects,)
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                TRACER.inference.register(obj)
        TRACER.owners.announce(StepSource(
            "accelerate", accumulation=_accumulation(accelerator), framework=_version(),
            forward=bool(TRACER.inference.models)))
    except Exception:
        pass


def _accumulation(accelerator: Any) -> Any:
    try:
        n = int(accelerator.gradient_accumulation_steps)
        return n if n >= 1 else None
    except Exception:
        return None


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"accelerate {version('accelerate')}"
    except Exception:
        return "accelerate"
