"""Framework integrations: step boundaries from the framework's own hooks.

* :mod:`.lightning` -- ``TraceMLCallback`` for ``lightning.pytorch`` and the legacy
  ``pytorch_lightning`` (a Lightning ``Callback``);
* :mod:`.huggingface` -- ``TraceMLCallback`` for the Hugging Face ``Trainer`` (a ``TrainerCallback``);
* :mod:`.accelerate` -- ``attach(accelerator)`` for an Accelerate loop.

Under ``traceml run`` none of this needs a line of code: the worker bootstrap adds them where the
script uses the framework (:mod:`.zero_code`). Used directly, each one calls ``traceml.init()``
itself (a no-op without ``traceml run`` unless ``init(aggregator=...)`` was called first). They
never raise into training: a failure is logged once and the integration turns itself off.

Importing this package imports no framework (and not torch).
"""
