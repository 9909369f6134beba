"""Attaching the integrations to an unmodified script (the worker bootstrap calls :func:`install`).

Each framework is reached through the mechanism it offers for extensions, without touching the
user's code:

* Lightning: its ``lightning.pytorch.callbacks_factory`` / ``pytorch_lightning.callbacks_factory``
  entry points (declared in our ``pyproject.toml``); every ``Trainer`` asks them for callbacks,
  and they answer only inside a bootstrapped worker (:func:`enabled`);
* Hugging Face: when ``transformers.trainer`` is imported, our callback class joins the module's
  ``DEFAULT_CALLBACKS`` list, which every ``Trainer`` starts from;
* Accelerate: when ``accelerate.accelerator`` is imported, ``Accelerator.prepare`` is wrapped so
  the models it prepares get their forward timed and the gradient-accumulation setting is known;
  steps stay inferred from optimizer steps (Accelerate's optimizer wrapper steps the real one only
  at the end of an accumulation window).
"""

from __future__ import annotations

import functools
from typing import Any

from ..sdk import imports


#: install() ran: this is a worker started by ``traceml run`` with automatic steps on
_installed = [False]


def enabled() -> bool:
    """True inside a worker started by ``traceml run`` with automatic steps on (the worker
    bootstrap, traceml_core/bootstrap.py, called :func:`install`)."""
    return _installed[0]


def install() -> None:
    _installed[0] = True
    imports.when_imported("transformers.trainer", _huggingface)
    imports.when_imported("accelerate.accelerator", _accelerate)


def _huggingface(module: Any) -> None:
    from . import huggingface

    defaults = getattr(module, "DEFAULT_CALLBACKS", None)
    if isinstance(defaults, list):
        cls = huggingface.callback_class()
        if cls not in defaults:
            defaults.append(cls)


def _accelerate(module: Any) -> None:
    acc = getattr(module, "Accelerator", None)
    prepare = getattr(acc, "prepare", None)
    if prepare is None or getattr(prepare, "_traceml", False):
        return
    from . import accelerate

    @functools.wraps(prepare)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare(self, *args, **kwargs)
        accelerate.prepared(self, out)
        return out

    wrapped._traceml = True  # type: ignore[attr-defined]
    acc.prepare = wrapped
