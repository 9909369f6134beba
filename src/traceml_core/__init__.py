"""TraceML: training telemetry for PyTorch, native to Slurm GPU clusters.

``import traceml_core as traceml``; then ``traceml.init()`` once per process and
``with traceml.trace_step(model):`` around each training step. Importing this package does not
import torch; the SDK is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SDK_NAMES = {"init", "trace_step", "shutdown", "wrap_dataloader", "stats", "declare_work"}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from .sdk import api

        value = getattr(api, name)
        # cache it in the module dict: ``traceml.trace_step`` is looked up every step, and a
        # module __getattr__ call on each lookup would cost more than the step's bookkeeping
        globals()[name] = value
        return value
    raise AttributeError(name)
