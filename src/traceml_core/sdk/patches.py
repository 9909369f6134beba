"""Installing the hooks (hooks.py, comm.py) into torch: once per process, at class level, never
per step. One :class:`Patches` per tracer remembers everything it replaced.

* DataLoader: ``_BaseDataLoaderIter.__next__`` (both the single- and multi-process iterators
  inherit it) -- so the user's iterator keeps its type, ``len()`` and every attribute;
* backward: ``torch.autograd.backward``, which ``Tensor.backward`` calls (so ``loss.backward()``,
  AMP's ``scaler.scale(loss).backward()`` and direct calls are all seen);
* optimizer: each optimizer class's ``step`` (one call per step; torch's global pre/post hooks
  would be two), see :meth:`Patches._install_optimizer_timing`;
* forward: the ``forward`` of each traced model's *class*, checking ``id(self)`` against the
  traced set. Module hooks (``register_forward_pre_hook``) were measured first: they push
  ``nn.Module.__call__`` onto its slow path and cost about 2 us per call on our test machine,
  half the whole budget; the class-level wrapper costs about 0.2 us. Patching the class, not the
  instance, keeps ``copy.deepcopy(model)`` (EMA copies) and ``torch.save(model)`` working, and
  ``functools.wraps`` keeps ``inspect.signature(model.forward)``;
* CUDA only: ``Tensor.to``/``Tensor.cuda`` for host-to-device copies;
* communication (comm.py): ``torch.distributed``'s collectives, ``Work.wait``, and DDP.

Every hook passes straight through outside a step and when tracing is off. Nothing is ever
re-generated: CUDA timing and inferred steps are states the hooks read, not variants of them.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

from . import hooks
from .step import StepState


class Patches:
    """What the process's tracer replaced in torch, and how to put it back."""

    _INHERITED = object()

    def __init__(self, state: StepState) -> None:
        self.state = state
        #: wrappers compiled with the wrapped function's parameters (codegen.py); False: the same
        #: bodies over ``*args, **kwargs`` (benchmarks/step_overhead.py compares the two)
        self.specialise = True
        #: torch.distributed timing (False: the benchmarks' comm-off loop)
        self.comm = True
        self.installed = False
        self.copy_installed = False
        self.patched_classes: set[type] = set()
        #: (owner, attribute, original) of everything replaced, for :meth:`uninstall`
        self.originals: list[tuple[Any, str, Any]] = []
        #: originals comm.py calls itself (the default all-reduce, DDP's register_comm_hook)
        self.comm_originals: dict[str, Any] = {}
        #: the torch.distributed hooks (comm.Comm) once installed
        self.comm_hooks: Any = None

    def install_global(self) -> None:
        """DataLoader, backward, optimizer and communication timing (idempotent)."""
        if self.installed:
            return
        import torch
        from torch.utils.data import dataloader as dl

        t = self.state
        base = dl._BaseDataLoaderIter
        if not getattr(base.__next__, "_traceml", False):
            wrapped = hooks.fetch(base.__next__, t)
            wrapped._traceml = True  # type: ignore[attr-defined]
            self.originals.append((base, "__next__", base.__next__))
            base.__next__ = wrapped  # type: ignore[method-assign]

        if not getattr(torch.autograd.backward, "_traceml", False):
            orig = torch.autograd.backward
            wrapped_bwd = hooks.backward(orig, t, self.specialise)
            wrapped_bwd._traceml = True  # type: ignore[attr-defined]
            self.originals.append((torch.autograd, "backward", orig))
            torch.autograd.backward = wrapped_bwd  # type: ignore[assignment]

        self._install_optimizer_timing()
        if self.comm:
            from . import comm

            self.comm_hooks = comm.install(self.originals, self.comm_originals, t)
        self.installed = True

    def _install_optimizer_timing(self) -> None:
        """Time ``Optimizer.step`` by wrapping each optimizer class's ``step`` (hooks.STEP: one
        wrapper call per step, where torch's global pre/post hooks would be two).

        torch wraps a class's ``step`` the first time an instance is created
        (``Optimizer._patch_step_function`` via the ``profile_hook_step`` staticmethod). So:
        classes already wrapped (optimizers created before ``init()``) are found among
        ``Optimizer``'s subclasses and wrapped now; classes created later go through our
        ``profile_hook_step``, outside torch's wrapper (its step hooks are optimizer time).
        A torch without that staticmethod gets the same wrapper another way
        (:meth:`_wrap_every_optimizer_class`).
        """
        from torch.optim.optimizer import Optimizer

        orig_phs = Optimizer.__dict__.get("profile_hook_step")
        if not isinstance(orig_phs, staticmethod):
            self._wrap_every_optimizer_class(Optimizer)
            return
        if not getattr(orig_phs.__func__, "_traceml", False):
            torch_hook_step = orig_phs.__func__

            def profile_hook_step(func: Any) -> Any:
                return self._wrap_step(torch_hook_step(func))

            profile_hook_step._traceml = True  # type: ignore[attr-defined]
            self.originals.append((Optimizer, "profile_hook_step", orig_phs))
            Optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[method-assign]

        for cls in _subclasses(Optimizer):
            step = cls.__dict__.get("step")
            if step is not None and getattr(step, "hooked", False) and not getattr(step, "_traceml", False):
                self.originals.append((cls, "step", step))
                cls.step = self._wrap_step(step)

    def _wrap_every_optimizer_class(self, optimizer: type) -> None:
        """An unexpected torch (no ``profile_hook_step`` to go through): wrap the ``step`` that
        each optimizer class defines, now for the classes that exist and from
        ``Optimizer.__init_subclass__`` for those defined later. A class torch has not wrapped
        yet is wrapped inside torch's wrapper (its step hooks then run outside the timing)."""

        def wrap(cls: type) -> None:
            step = cls.__dict__.get("step")   # (a plain function: not a staticmethod or property)
            if isinstance(step, FunctionType) and not getattr(step, "_traceml", False):
                self.originals.append((cls, "step", step))
                wrapped = hooks.step(step, self.state, self.specialise)
                wrapped._traceml = True   # (copied onto torch's wrapper of it: never wrapped twice)
                cls.step = wrapped  # type: ignore[attr-defined]

        for cls in _subclasses(optimizer):
            wrap(cls)

        own = optimizer.__dict__.get("__init_subclass__", self._INHERITED)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if isinstance(own, classmethod):
                own.__func__(cls, **kwargs)
            else:
                super(optimizer, cls).__init_subclass__(**kwargs)
            wrap(cls)

        self.originals.append((optimizer, "__init_subclass__", own))
        optimizer.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]

    def _wrap_step(self, step: Any) -> Any:
        wrapped = hooks.step(step, self.state, self.specialise)
        wrapped._traceml = True
        wrapped._traceml_inner = step   # uninstall() unwraps classes torch hooked through us
        wrapped.hooked = True       # torch's marker: "already wrapped, do not wrap again"
        return wrapped

    def install_copy_timing(self) -> None:
        """``Tensor.to``/``Tensor.cuda`` wrappers, only once a CUDA model is traced."""
        if self.copy_installed:
            return
        import functools

        import torch

        for name in ("to", "cuda"):
            orig = getattr(torch.Tensor, name)
            if getattr(orig, "_traceml", False):
                continue
            wrapped = functools.wraps(orig)(hooks.copy(orig, self.state))
            wrapped._traceml = True  # type: ignore[attr-defined]
            self.originals.append((torch.Tensor, name, orig))
            setattr(torch.Tensor, name, wrapped)
        self.copy_installed = True

    def patch_forward(self, cls: type) -> None:
        """Time the ``forward`` of ``cls`` (for the instances registered with the tracer)."""
        if cls in self.patched_classes:
            return
        orig = cls.forward
        if not getattr(orig, "_traceml", False):
            wrapped = hooks.forward(orig, self.state, self.specialise)
            wrapped._traceml = True  # type: ignore[attr-defined]
            self.originals.append((cls, "forward", cls.__dict__.get("forward", self._INHERITED)))
            cls.forward = wrapped  # type: ignore[method-assign]
        self.patched_classes.add(cls)

    def uninstall(self) -> None:
        """Put every patched attribute back (benchmarks compare against a truly untouched torch).

        Training code never needs this: with tracing off every wrapper is a pass-through."""
        while self.originals:
            owner, name, orig = self.originals.pop()
            if orig is self._INHERITED:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, orig)
        self._unwrap_optimizer_classes()
        self.patched_classes.clear()
        self.comm_hooks = None
        self.installed = self.copy_installed = False

    @staticmethod
    def _unwrap_optimizer_classes() -> None:
        """Classes first instantiated after install_global got our wrapper from torch's own
        ``_patch_step_function`` (via profile_hook_step), so it is not among ``originals``."""
        try:
            from torch.optim.optimizer import Optimizer
        except Exception:
            return
        for cls in _subclasses(Optimizer):
            inner = getattr(cls.__dict__.get("step"), "_traceml_inner", None)
            if inner is not None:
                inner.hooked = True     # torch's profiling wrapper: torch must not wrap it again
                cls.step = inner


def _subclasses(cls: type) -> list[type]:
    out, stack, seen = [], list(cls.__subclasses__()), set()
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        out.append(c)
        stack.extend(c.__subclasses__())
    return out
