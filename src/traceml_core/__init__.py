"""TraceML: training telemetry for PyTorch, native to Slurm GPU clusters.

``import traceml_core as traceml``; then ``traceml.init()`` once per process and
``with traceml.trace_step(model):`` around each training step. Importing this package does not
import torch; the SDK is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SDK_NAMES = {"init", "trace_step", "shutdown", "wrap_dataloader", "stats"}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from .sdk import api

        return getattr(api, name)
    raise AttributeError(name)
