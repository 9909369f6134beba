"""Installing the hot-path hooks into torch: once per process, at class level, never per step.

* DataLoader: ``_BaseDataLoaderIter.__next__`` (both the single- and multi-process iterators
  inherit it) -- so the user's iterator keeps its type, ``len()`` and every attribute;
* backward: ``torch.autograd.backward``, which ``Tensor.backward`` calls (so ``loss.backward()``,
  AMP's ``scaler.scale(loss).backward()`` and direct calls are all seen);
* optimizer: each optimizer class's ``step`` (one call per step; torch's global pre/post hooks
  would be two), see :func:`_install_optimizer_timing`;
* forward: the ``forward`` of each traced model's *class*, checking ``id(self)`` against the
  traced set. Module hooks (``register_forward_pre_hook``) were measured first: they push
  ``nn.Module.__call__`` onto its slow path and cost about 2 us per call on our test machine,
  half the whole budget; the class-level wrapper costs about 0.2 us. Patching the class, not the
  instance, keeps ``copy.deepcopy(model)`` (EMA copies) and ``torch.save(model)`` working, and
  ``functools.wraps`` keeps ``inspect.signature(model.forward)``;
* the forward, backward and step wrappers are generated with the wrapped function's own
  parameters (codegen.py), which avoids packing ``*args, **kwargs`` on every call;
* CUDA only: ``Tensor.to``/``Tensor.cuda`` for host-to-device copies;
* communication (comm.py): ``torch.distributed``'s collectives, ``Work.wait``, and DDP (every DDP
  model gets TraceML's communication hook; a user's hook registered later runs inside it).

Every wrapper passes straight through when tracing is off (``hotpath.REC is None``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Optional

from . import hotpath

_installed = False
_copy_installed = False
#: wrappers are generated in their CUDA variant once a CUDA model is traced (see enable_gpu)
_gpu_mode = False
#: backward and optimizer wrappers in their inference variant (see set_inference)
_infer_mode = False
_patched_classes: set[type] = set()
#: (owner, attribute, original) of everything replaced, for :func:`uninstall`
_originals: list[tuple[Any, str, Any]] = []
_hook_handles: list[Any] = []


def install_global() -> None:
    """DataLoader, backward and optimizer timing (idempotent)."""
    global _installed
    if _installed:
        return
    import torch
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    if not getattr(base.__next__, "_traceml", False):
        wrapped = hotpath.timed_next(base.__next__)
        wrapped._traceml = True  # type: ignore[attr-defined]
        _originals.append((base, "__next__", base.__next__))
        base.__next__ = wrapped  # type: ignore[method-assign]

    if not getattr(torch.autograd.backward, "_traceml", False):
        orig = torch.autograd.backward
        wrapped_bwd = hotpath.make_backward(orig, gpu=_gpu_mode, infer=_infer_mode)
        wrapped_bwd._traceml = True  # type: ignore[attr-defined]
        _originals.append((torch.autograd, "backward", orig))
        torch.autograd.backward = wrapped_bwd  # type: ignore[assignment]

    _install_optimizer_timing()
    from . import comm

    comm.install(_originals)
    _installed = True


def _install_optimizer_timing() -> None:
    """Time ``Optimizer.step`` by wrapping each optimizer class's (torch-hooked) ``step``.

    torch wraps a class's ``step`` the first time an instance is created
    (``Optimizer._patch_step_function`` via the ``profile_hook_step`` staticmethod). So: classes
    already wrapped (optimizers created before ``init()``) are found among ``Optimizer``'s
    subclasses and wrapped now; classes created later go through our ``profile_hook_step``. One
    wrapper call per step, where torch's global pre/post hooks would be two.
    """
    from torch.optim import optimizer as optim_mod
    from torch.optim.optimizer import Optimizer

    orig_phs = Optimizer.__dict__.get("profile_hook_step")
    if isinstance(orig_phs, staticmethod) and not getattr(orig_phs.__func__, "_traceml", False):
        torch_hook_step = orig_phs.__func__

        def profile_hook_step(func: Any) -> Any:
            return _wrap_step(torch_hook_step(func))

        profile_hook_step._traceml = True  # type: ignore[attr-defined]
        _originals.append((Optimizer, "profile_hook_step", orig_phs))
        Optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[method-assign]
    else:   # an unexpected torch: fall back to the global hooks
        _hook_handles.append(optim_mod.register_optimizer_step_pre_hook(hotpath.optimizer_pre_hook))
        _hook_handles.append(optim_mod.register_optimizer_step_post_hook(hotpath.optimizer_post_hook))
        return

    stack = list(Optimizer.__subclasses__())
    seen: set[type] = set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        step = cls.__dict__.get("step")
        if step is not None and getattr(step, "hooked", False) and not getattr(step, "_traceml", False):
            _originals.append((cls, "step", step))
            cls.step = _wrap_step(step)


def _wrap_step(step: Any) -> Any:
    wrapped = hotpath.make_step(step, gpu=_gpu_mode, infer=_infer_mode)
    wrapped._traceml = True
    wrapped._traceml_inner = step   # uninstall() unwraps classes torch hooked through us
    wrapped.hooked = True       # torch's marker: "already wrapped, do not wrap again"
    return wrapped


def _unwrap_optimizer_classes() -> None:
    """Classes first instantiated after install_global got our wrapper from torch's own
    ``_patch_step_function`` (via profile_hook_step), so it is not among ``_originals``."""
    try:
        from torch.optim.optimizer import Optimizer
    except Exception:
        return
    stack, seen = list(Optimizer.__subclasses__()), set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        inner = getattr(cls.__dict__.get("step"), "_traceml_inner", None)
        if inner is not None:
            inner.hooked = True     # torch's profiling wrapper: torch must not wrap it again
            cls.step = inner


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
        _originals.append((torch.Tensor, name, orig))
        setattr(torch.Tensor, name, wrapped)
    _copy_installed = True


def unwrap_compiled(model: Any) -> tuple[Any, bool]:
    """``torch.compile`` output keeps its forward on the instance; we do not time it (yet)."""
    return model, hasattr(model, "_orig_mod")


def register_model(recorder: hotpath.StepRecorder, model: Any) -> Optional[Any]:
    """Time ``model``'s forward from now on; returns the CUDA device its parameters live on."""
    model, compiled = unwrap_compiled(model)
    key = id(model)
    if hasattr(model, "reducer") and hasattr(model, "process_group"):     # a DDP model
        from . import comm

        comm.hook_model(model)
    if not compiled:
        _patch_forward(type(model))
        recorder.fwd0 = 0
    # Ids, not references: holding the model would keep its memory (and a DDP model's process
    # group) alive until interpreter exit. trace_step compares against model_id to skip this call.
    recorder.model_id = key
    if key not in recorder.models:
        recorder.models.add(key)
        try:
            # forget the id when the model goes: a new object at that address is a new model
            weakref.finalize(model, _forget_model, recorder, key).atexit = False
        except TypeError:
            _unweakrefable.append(model)  # rare: keep it alive rather than risk a reused id
    return _cuda_device(model)


_unweakrefable: list[Any] = []


def _forget_model(recorder: hotpath.StepRecorder, key: int) -> None:
    recorder.models.discard(key)
    if recorder.model_id == key:
        recorder.model_id = 0


def _patch_forward(cls: type) -> None:
    if cls in _patched_classes:
        return
    orig = cls.forward
    if not getattr(orig, "_traceml", False):
        wrapped = hotpath.make_forward(orig, gpu=_gpu_mode)
        wrapped._traceml = True  # type: ignore[attr-defined]
        _originals.append((cls, "forward", cls.__dict__.get("forward", _INHERITED)))
        cls.forward = wrapped  # type: ignore[method-assign]
    _patched_classes.add(cls)


def enable_gpu() -> None:
    """Regenerate every wrapper in its CUDA variant (once, when a CUDA model is first traced)."""
    global _gpu_mode
    if _gpu_mode:
        return
    _reinstall(gpu=True, infer=_infer_mode)
    install_copy_timing()


def set_inference(on: bool) -> None:
    """Regenerate the backward and optimizer wrappers with (or without) step inference; called
    when inference starts (the worker bootstrap) and when trace_step or a framework takes over."""
    if on != _infer_mode:
        _reinstall(gpu=_gpu_mode, infer=on)


def _reinstall(*, gpu: bool, infer: bool) -> None:
    global _gpu_mode, _infer_mode
    classes = list(_patched_classes)
    was_installed, had_copy = _installed, _copy_installed
    uninstall()
    _gpu_mode, _infer_mode = gpu, infer
    if was_installed:
        install_global()
    for cls in classes:
        _patch_forward(cls)
    if had_copy:
        install_copy_timing()


_INHERITED = object()


def uninstall() -> None:
    """Put every patched attribute back (benchmarks compare against a truly untouched torch).

    Training code never needs this: with tracing off every wrapper is a pass-through."""
    global _installed, _copy_installed
    while _originals:
        owner, name, orig = _originals.pop()
        if orig is _INHERITED:
            try:
                delattr(owner, name)
            except AttributeError:
                pass
        else:
            setattr(owner, name, orig)
    while _hook_handles:
        _hook_handles.pop().remove()
    _unwrap_optimizer_classes()
    _patched_classes.clear()
    _installed = _copy_installed = False


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
