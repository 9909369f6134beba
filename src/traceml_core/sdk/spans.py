"""Checkpoint saves timed in the worker with no code of the user's (the SDK's one span kind), and
where the script's own step numbering stands (``trace_step(model, step=global_step)``).

The goodput ledger (traceml_core/report/goodput) needs two facts a step record does not carry:
how long each checkpoint save took and at which step, and which of the script's global steps a
rank's own step is, so that the steps a requeued attempt redid are counted exactly. Both go to
the aggregator as rank events (``span`` and ``progress``: traceml_core/rankfacts.py), a few per
run, never on the hot path of a step.

Saves are timed where they happen: ``torch.save`` (and ``torch.serialization.save``), and once
``torch.distributed.checkpoint`` is imported (never imported for this), its ``save`` and
``save_state_dict``; once ``safetensors.torch`` is (safetensors is no dependency of ours),
``save_file`` and ``save_model``, which bypass torch.save (a name bound by ``from
safetensors.torch import save_file`` before TraceML's init is not seen). A save nested in another (``dcp.save`` writing through ``torch.save``) is one
span, the outermost, per thread. Nothing here raises into the user's save: a failure to report is
dropped, the save's own exceptions pass through unchanged.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from typing import Any, Callable, Optional

from . import imports
from .tracer import TRACER

#: the span kind this module reports (traceml_core.rankfacts.SPAN_KINDS)
CHECKPOINT = "checkpoint"
_local = threading.local()


class Progress:
    """The script's global step against the rank's own step index: a ``progress`` mark is sent
    when the worker starts (step 0, no global step yet: it also says that this worker times its
    checkpoints), whenever the offset between the two changes (the first ``step=``, a resume)
    and at the end."""

    __slots__ = ("send", "offset", "gstep", "last_sent")

    def __init__(self) -> None:
        self.send: Optional[Callable[[str, dict[str, Any]], bool]] = None
        self.offset: Optional[int] = None   # gstep - own step index; None: the script gives none
        self.gstep: Optional[int] = None    # the global step of the step entered last
        self.last_sent: Optional[int] = None

    def start(self, send: Callable[[str, dict[str, Any]], bool]) -> None:
        self.send = send
        self.offset = self.gstep = self.last_sent = None
        send("progress", {"step": 0, "gstep": None, "start": None, "end": None})

    def step(self, gstep: int) -> None:
        """``trace_step(step=gstep)``: the step about to be entered is the script's ``gstep``."""
        own = own_steps()
        self.gstep = gstep
        off = gstep - own
        if off != self.offset and self.send is not None:
            self.offset = off
            self.send("progress", {"step": own, "gstep": gstep, "start": time.time(), "end": None})
            self.last_sent = own

    def final(self) -> None:
        """At shutdown: the rank's last step and its global step."""
        n = own_steps()
        if self.send is None or n <= 0 or self.last_sent == n - 1:
            return
        g = None if self.offset is None else self.offset + n - 1
        self.send("progress", {"step": n - 1, "gstep": g, "start": None, "end": time.time()})


PROGRESS = Progress()


def own_steps() -> int:
    """Steps this rank has completed so far (the index of the next one, or of the open one)."""
    return int(TRACER.produced()) if TRACER.rec is not None else 0


def _span(start_ns: int, end_ns: int, api: str) -> None:
    send = PROGRESS.send
    if send is None or not TRACER.on:
        return
    in_step = TRACER.active > 0
    send("span", {"span": CHECKPOINT, "dur_ns": max(0, end_ns - start_ns), "end": time.time(),
                  "step": own_steps(), "gstep": PROGRESS.gstep, "in_step": in_step, "api": api})


def timed(fn: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``fn`` timed as one checkpoint save (the outermost of nested saves on this thread)."""
    if getattr(fn, "__traceml_span__", None):
        return fn

    @functools.wraps(fn)
    def save(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_local, "depth", 0)
        if depth or PROGRESS.send is None:
            return fn(*args, **kwargs)
        _local.depth = 1
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth = 0
            try:
                _span(t0, time.perf_counter_ns(), api)
            except Exception:  # noqa: BLE001 - reporting must never cost the save
                pass

    save.__traceml_span__ = True  # type: ignore[attr-defined]
    return save


def _patch_torch(torch: Any) -> None:
    ser = getattr(torch, "serialization", None)
    wrapped = timed(torch.save, "torch.save")
    if ser is not None and getattr(ser, "save", None) is torch.save:
        ser.save = wrapped
    torch.save = wrapped


def _patch_dcp(dcp: Any) -> None:
    saver = getattr(dcp, "state_dict_saver", None)
    for name, api in (("save", "torch.distributed.checkpoint.save"),
                      ("save_state_dict", "torch.distributed.checkpoint.save_state_dict")):
        fn = getattr(dcp, name, None)
        if fn is None:
            continue
        w = timed(fn, api)
        setattr(dcp, name, w)
        if saver is not None and getattr(saver, name, None) is fn:
            setattr(saver, name, w)


def _patch_safetensors(st: Any) -> None:
    for name in ("save_file", "save_model"):   # save_model writes through save_file: one span
        fn = getattr(st, name, None)
        if fn is not None:
            setattr(st, name, timed(fn, f"safetensors.torch.{name}"))


_installed = False


def install(send: Callable[[str, dict[str, Any]], bool]) -> None:
    """Time checkpoint saves from now on, reporting through ``send(kind, payload)``; the patches
    go in once per process (``torch`` is imported by now; dcp when the script imports it)."""
    global _installed
    PROGRESS.start(send)
    if _installed:
        return
    _installed = True
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "save"):
        # init() runs from torch's own import hook (the worker bootstrap), when torch's module
        # has run but is still marked initialising: a hook registered now would never fire
        _patch_torch(torch)
    else:
        imports.when_imported("torch", _patch_torch)
    imports.when_imported("torch.distributed.checkpoint", _patch_dcp)
    imports.when_imported("safetensors.torch", _patch_safetensors)


def event_sender(notify: Callable[[dict[str, Any]], bool]) -> Callable[[str, dict[str, Any]], bool]:
    """``send(kind, payload)`` over the session's ``notify`` (an ``event`` frame, JSON text)."""

    def send(kind: str, payload: dict[str, Any]) -> bool:
        return bool(notify({"t": "event", "kind": kind, "text": json.dumps(payload), "ts": time.time()}))

    return send
