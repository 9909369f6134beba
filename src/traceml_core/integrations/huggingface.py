"""Hugging Face ``Trainer``: a ``TrainerCallback`` that records one TraceML step per optimizer step.

Use it directly (``traceml run`` adds it by itself; see :mod:`.zero_code`)::

    from traceml_core.integrations.huggingface import TraceMLCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TraceMLCallback()])

Where a step begins and ends, and what each phase is:

* a step opens at ``on_step_begin`` and closes at ``on_step_end``: the Trainer calls them once
  per optimizer step, so with ``gradient_accumulation_steps=N`` the N micro-batches are one step
  (said in the summary). Logging, evaluation and saving come after ``on_step_end``: outside steps;
* ``input``: the DataLoader fetches the Trainer made for the step's batches (it fetches all
  micro-batches of a step before ``on_step_begin``; they are credited to that step);
* ``forward``: the model's ``forward`` (the model the Trainer hands to ``on_train_begin``);
* ``backward``: ``loss.backward()`` (the Trainer's ``accelerator.backward``);
* ``optimizer``: the wrapped torch optimizer's ``step``. Gradient clipping, the learning-rate
  scheduler and ``zero_grad`` are in the step but in none of these phases.
"""

from __future__ import annotations

from typing import Any

from ..sdk.driven import StepDriver, ensure_init
from ..sdk.source import StepSource


class _Hooks:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._driver = StepDriver("Hugging Face Trainer")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        d = self._driver
        try:
            d.abandon()      # a step an earlier train() left open when it raised
            if not ensure_init():
                return
            src = StepSource("huggingface", accumulation=_accumulation(args), framework=_version())
            if not d.claim(src):
                return
            if model is not None:
                d.time_model(model)    # its forward is the step's forward
            d.forget_pending_input()
        except Exception as exc:
            d.failed(exc)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        d = self._driver
        if d.is_open:      # the previous step never reached on_step_end (an exception was caught)
            d.abandon()
        d.open()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.close()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.release()


def _accumulation(args: Any) -> Any:
    try:
        n = int(args.gradient_accumulation_steps)
        return n if n >= 1 else None
    except Exception:
        return None


def _version() -> str:
    try:
        from importlib.metadata import version

        return f"transformers {version('transformers')}"
    except Exception:
        return "transformers"


_class: list[type] = []


def callback_class() -> type:
    if not _class:
        from transformers import TrainerCallback

        _class.append(type("TraceMLCallback", (_Hooks, TrainerCallback), {
            "__module__": __name__, "__doc__": __doc__}))
    return _class[0]


def __getattr__(name: str) -> Any:
    if name == "TraceMLCallback":
        return callback_class()
    raise AttributeError(name)
