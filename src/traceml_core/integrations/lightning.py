"""PyTorch Lightning: a ``Callback`` that records one TraceML step per optimizer step.

Use it directly (``traceml run`` adds it by itself; see :mod:`.zero_code`)::

    from traceml_core.integrations.lightning import TraceMLCallback
    trainer = L.Trainer(..., callbacks=[TraceMLCallback()])

``TraceMLCallback`` subclasses ``lightning.pytorch.Callback`` when the ``lightning`` package is
installed, else ``pytorch_lightning.Callback``; :func:`callback_class` picks one explicitly.

Where a step begins and ends, and what each phase is (all from Lightning's own hooks):

* a step opens at ``on_train_batch_start`` of the first micro-batch and closes at
  ``on_train_batch_end`` of the batch in which the optimizer stepped: with
  ``accumulate_grad_batches=N`` the N micro-batches are one step (said in the summary);
* ``input``: the DataLoader fetches Lightning made for the step's batches;
* ``forward``: ``on_train_batch_start`` .. ``on_before_backward`` -- the ``training_step``
  (and ``zero_grad``), run by Lightning inside ``optimizer.step(closure)``;
* ``backward``: ``loss.backward()`` itself (torch's autograd, as for any traced step);
* ``optimizer``: ``on_before_optimizer_step`` .. the optimizer step's return (gradient clipping
  and the parameter update) -- never the closure, so the phases do not overlap;
* validation fetches are not counted as the next step's input.
"""

from __future__ import annotations

from typing import Any

from ..sdk.driven import StepDriver, ensure_init
from ..sdk.source import StepSource

PACKAGES = ("lightning.pytorch", "pytorch_lightning")


class _Hooks:
    """The callback's behaviour; mixed into the Callback class of either Lightning package."""

    _traceml_package = "lightning.pytorch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._driver = StepDriver("Lightning", owns_optimizer=True, owns_forward=True)
        self._handles: list[Any] = []

    # -- setup and teardown ---------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        d = self._driver
        try:
            if not ensure_init():
                return
            if getattr(trainer.strategy, "handles_gradient_accumulation", False):
                note = "the strategy steps the optimizer itself (e.g. DeepSpeed): steps may be micro-batches"
            else:
                note = None
            src = StepSource("lightning", accumulation=_accumulation(trainer),
                             framework=_version(self._traceml_package), note=note)
            if not d.claim(src):
                return
            d.use_cuda(getattr(pl_module, "device", None))
            for opt in getattr(trainer, "optimizers", []) or []:
                register = getattr(opt, "register_step_post_hook", None)
                if register is not None:
                    self._handles.append(register(self._after_optimizer_step))
            d.forget_pending_input()
        except Exception as exc:
            d.failed(exc)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._remove_hooks()
        self._driver.release()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._remove_hooks()
        self._driver.release()   # drops the step the exception left open

    def _remove_hooks(self) -> None:
        while self._handles:
            try:
                self._handles.pop().remove()
            except Exception:
                pass

    # -- one step ------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._driver.open()
        self._driver.forward_begin()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._driver.forward_end()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._driver.optimizer_begin()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._driver.optimizer_end()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        d = self._driver
        d.forward_end()       # a training_step without backward (returned None)
        if d.stepped:
            d.close()

    # -- between steps -------------------------------------------------------------------------

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.forget_pending_input()

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._driver.forget_pending_input()


def _accumulation(trainer: Any) -> Any:
    try:
        n = int(trainer.accumulate_grad_batches)
        return n if n >= 1 else None
    except Exception:
        return None


def _version(package: str) -> str:
    top = package.split(".")[0]
    try:
        from importlib.metadata import version

        return f"{top} {version(top)}"
    except Exception:
        return top


_classes: dict[str, type] = {}


def callback_class(package: str = "") -> type:
    """The callback class for ``package`` ("lightning.pytorch" or "pytorch_lightning"; default:
    the first of the two that imports)."""
    import importlib

    last: Exception = ImportError("neither lightning nor pytorch_lightning is installed")
    for pkg in ([package] if package else PACKAGES):
        if pkg in _classes:
            return _classes[pkg]
        try:
            base = importlib.import_module(pkg).Callback
        except Exception as exc:
            last = exc
            continue
        cls = type("TraceMLCallback", (_Hooks, base), {
            "_traceml_package": pkg, "__module__": __name__, "__doc__": __doc__})
        _classes[pkg] = cls
        return cls
    raise ImportError(f"traceml: cannot build the Lightning callback: {last}")


def __getattr__(name: str) -> Any:
    if name == "TraceMLCallback":
        return callback_class()
    raise AttributeError(name)


# ---- the entry points Lightning calls for every Trainer (pyproject.toml) ---------------------------

def _zero_code(package: str) -> list[Any]:
    from .zero_code import enabled

    if not enabled():
        return []
    try:
        return [callback_class(package)()]
    except Exception:
        return []


def lightning_callbacks() -> list[Any]:
    """Entry point ``lightning.pytorch.callbacks_factory``."""
    return _zero_code("lightning.pytorch")


def pytorch_lightning_callbacks() -> list[Any]:
    """Entry point ``pytorch_lightning.callbacks_factory``."""
    return _zero_code("pytorch_lightning")
