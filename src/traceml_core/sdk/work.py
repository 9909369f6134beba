"""What one training step is worth, as the script declares it: ``traceml.declare_work``.

Tokens, samples and model FLOPs per step, and the dtype the FLOPs run in. The rank sends them
once (a ``work`` event, traceml_core/rankfacts.py) with the name of its device (the GPU's, as
NVML and ``torch.cuda.get_device_name`` give it, or ``cpu``); node 0's goodput ledger turns them
into tokens/s and samples/s per node and MFU against the device's peak
(traceml_core/report/goodput/throughput.py). A declaration made before ``init()`` is sent when
the session starts; a later one replaces it. Bad values are dropped with a warning, never raised:
a telemetry call must not stop training.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, Callable, Optional

log = logging.getLogger("traceml")

#: dtypes MFU's peak table knows (traceml_core/report/goodput/throughput.PEAK_FLOPS)
DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
            "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}

_declared: Optional[dict[str, Any]] = None
_send: Optional[Callable[[str, dict[str, Any]], bool]] = None


def _amount(name: str, v: Any) -> Optional[float]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        log.warning("traceml.declare_work: %s=%r is not a number >= 0; it is left out (give the amount "
                    "one training step of this rank does, e.g. %s=4096)", name, v, name)
        return None
    return float(v)


def _dtype(v: Any) -> Optional[str]:
    if v is None:
        return None
    word = str(v).rsplit(".", 1)[-1].lower()   # "bf16", "bfloat16" or torch.bfloat16
    word = _ALIASES.get(word, word)
    if word not in DTYPES:
        log.warning("traceml.declare_work: dtype=%r is not one of %s; MFU will not be measured", v,
                    ", ".join(DTYPES))
        return None
    return word


def _device() -> str:
    """The rank's GPU name (the current CUDA device), or ``cpu``; torch is not imported here."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - a name must never cost the call
        return "unknown"
    return "cpu"


def declare_work(*, tokens_per_step: Optional[float] = None, samples_per_step: Optional[float] = None,
                 flops_per_step: Optional[float] = None, dtype: Any = None) -> None:
    """Declare what one training step of this rank is worth, for throughput and MFU.

    ``tokens_per_step``/``samples_per_step``: what one step of this rank consumes (its micro-
    batches times their tokens; not the global batch). ``flops_per_step``: the model FLOPs of one
    step of this rank (for a dense transformer about ``6 x parameters x tokens_per_step``).
    ``dtype``: what the matmuls run in (``"bf16"``, ``torch.bfloat16``, ...), for the device's
    peak. Any may be left out; what is left out is "not measured" in the summary."""
    global _declared
    _declared = {"tokens_per_step": _amount("tokens_per_step", tokens_per_step),
                 "samples_per_step": _amount("samples_per_step", samples_per_step),
                 "flops_per_step": _amount("flops_per_step", flops_per_step),
                 "dtype": _dtype(dtype), "device": _device()}
    if _send is not None:
        _send("work", _declared)


def install(send: Callable[[str, dict[str, Any]], bool]) -> None:
    """The session started: send what was declared before it, and whatever is declared later."""
    global _send
    _send = send
    if _declared is not None:
        send("work", _declared)


def _reset_for_tests() -> None:
    global _declared, _send
    _declared = _send = None
