"""Installing the hot-path hooks into torch: once per process, at class level, never per step.

* DataLoader: ``_BaseDataLoaderIter.__next__`` (both the single- and multi-process iterators
  inherit it) -- so the user's iterator keeps its type, ``len()`` and every attribute;
* backward: ``torch.autograd.backward``, which ``Tensor.backward`` calls (so ``loss.backward()``,
  AMP's ``scaler.scale(loss).backward()`` and direct calls are all seen);
* optimizer: torch's global ``register_optimizer_step_pre_hook``/``post_hook``;
* forward: the ``forward`` of each traced model's *class*, checking ``id(self)`` against the
  traced set. Module hooks (``register_forward_pre_hook``) were measured first: they push
  ``nn.Module.__call__`` onto its slow path and cost about 2 us per call on our test machine,
  half the whole budget; the class-level wrapper costs about 0.2 us. Patching the class, not the
  instance, keeps ``copy.deepcopy(model)`` (EMA copies) and ``torch.save(model)`` working, and
  ``functools.wraps`` keeps ``inspect.signature(model.forward)``;
* CUDA only: ``Tensor.to``/``Tensor.cuda`` for host-to-device copies.

Every wrapper passes straight through when tracing is off (``hotpath.REC is None``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Optional

from . import hotpath

_installed = False
_copy_installed = False
_patched_classes: set[type] = set()


def install_global() -> None:
    """DataLoader, backward and optimizer hooks (idempotent)."""
    global _installed
    if _installed:
        return
    import torch
    import torch.optim.optimizer as optim_mod
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    if not getattr(base.__next__, "_traceml", False):
        wrapped = hotpath.timed_next(base.__next__)
        wrapped._traceml = True  # type: ignore[attr-defined]
        base.__next__ = wrapped  # type: ignore[method-assign]

    if not getattr(torch.autograd.backward, "_traceml", False):
        orig = torch.autograd.backward
        wrapped_bwd = functools.wraps(orig)(hotpath.timed_backward(orig))
        wrapped_bwd._traceml = True  # type: ignore[attr-defined]
        torch.autograd.backward = wrapped_bwd  # type: ignore[assignment]

    optim_mod.register_optimizer_step_pre_hook(hotpath.optimizer_pre_hook)
    optim_mod.register_optimizer_step_post_hook(hotpath.optimizer_post_hook)
    _installed = True


def install_copy_timing() -> None:
    """``Tensor.to``/``Tensor.cuda`` wrappers, only once a CUDA model is traced."""
    global _copy_installed
    if _copy_installed:
        return
    import torch

    for name in ("to", "cuda"):
        orig = getattr(torch.Tensor, name)
        if getattr(orig, "_traceml", False):
            continue
        wrapped = functools.wraps(orig)(hotpath.timed_copy(orig))
        wrapped._traceml = True  # type: ignore[attr-defined]
        setattr(torch.Tensor, name, wrapped)
    _copy_installed = True


def unwrap_compiled(model: Any) -> tuple[Any, bool]:
    """``torch.compile`` output keeps its forward on the instance; we do not time it (yet)."""
    return model, hasattr(model, "_orig_mod")


def register_model(recorder: hotpath.StepRecorder, model: Any) -> Optional[Any]:
    """Time ``model``'s forward from now on; returns the CUDA device its parameters live on."""
    model, compiled = unwrap_compiled(model)
    if not compiled:
        cls = type(model)
        if cls not in _patched_classes:
            orig = cls.forward
            if not getattr(orig, "_traceml", False):
                wrapped = functools.wraps(orig)(hotpath.timed_forward(orig))
                wrapped._traceml = True  # type: ignore[attr-defined]
                cls.forward = wrapped
            _patched_classes.add(cls)
        key = id(model)
        recorder.models.add(key)
        try:
            weakref.finalize(model, recorder.models.discard, key)
        except TypeError:
            pass
    return _cuda_device(model)


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
