"""CUDA-event timing of the step phases, resolved without ever synchronising the device.

On a GPU the host returns from ``model(x)`` or ``loss.backward()`` long before the kernels have
run, so host wall time measures kernel *launches*, not work. Each phase is therefore bracketed by a
pair of CUDA events recorded on the current stream; a step's row is held back until its events have
completed (``Event.query()``, which never blocks) and then committed with the GPU times. The host
times are kept as the fallback: if a row's events are still pending after :attr:`max_pending` later
steps (the host far ahead of the device) or at shutdown, it is committed with host times and counted
in :attr:`CudaPhaseTimer.fallbacks` -- never a ``synchronize()``, which could stall training.

The event and stream factories are injectable so the deferred-commit logic can be exercised with
stand-in events on machines without a GPU; on a GPU the defaults are ``torch.cuda.Event`` and
``torch.cuda.current_stream(device)``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from .hotpath import C_BWD, C_FWD, C_H2D, C_OPT, StepRecorder

_MAX_PRE_SPANS = 256


class CudaPhaseTimer:
    """Brackets phases with CUDA events and commits rows to the recorder once the events are done."""

    def __init__(
        self,
        device: Any,
        *,
        event_factory: Optional[Callable[[], Any]] = None,
        stream_fn: Optional[Callable[[], Any]] = None,
        max_pending: int = 64,
    ) -> None:
        if event_factory is None or stream_fn is None:
            import torch

            if event_factory is None:
                def event_factory() -> Any:
                    return torch.cuda.Event(enable_timing=True)
            if stream_fn is None:
                def stream_fn() -> Any:
                    return torch.cuda.current_stream(device)
        self.device = device
        self._new_event = event_factory
        self._stream = stream_fn
        self.max_pending = max_pending
        self._pool: list[Any] = []
        self._spans: list[tuple[int, Any, Any]] = []       # (column, start, end) in the current step
        self._pre_spans: list[tuple[int, Any, Any]] = []   # h2d copies between steps
        self._pending: deque[tuple[Any, ...]] = deque()    # rows waiting for their events
        self.fallbacks = 0                                  # rows committed with host times
        self._opt_ev: Any = None
        self._opt_mark = 0

    # ---- recording (training thread) ---------------------------------------------------------

    def start(self) -> Any:
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record(self._stream())
        return ev

    def stop(self, col: int, ev0: Any) -> None:
        ev1 = self._pool.pop() if self._pool else self._new_event()
        ev1.record(self._stream())
        self._spans.append((col, ev0, ev1))

    def stop_pre(self, col: int, ev0: Any) -> None:
        """End a span that began between steps (credited to the next step)."""
        ev1 = self._pool.pop() if self._pool else self._new_event()
        ev1.record(self._stream())
        self._pre_spans.append((col, ev0, ev1))
        if len(self._pre_spans) > _MAX_PRE_SPANS:
            _, a, b = self._pre_spans.pop(0)
            self._pool += (a, b)

    def release(self, ev: Any) -> None:
        self._pool.append(ev)

    def clear_pre(self) -> None:
        for _, a, b in self._pre_spans:
            self._pool += (a, b)
        self._pre_spans = []

    def opt_start(self) -> None:
        self._opt_ev = self.start()
        self._opt_mark = len(self._spans)

    def opt_stop(self) -> None:
        ev, self._opt_ev = self._opt_ev, None
        if ev is None:
            return
        if any(col in (C_FWD, C_BWD) for col, _, _ in self._spans[self._opt_mark:]):
            # forward/backward ran inside the step (a closure): the event span would hold them
            # too, so this step's optimizer time stays the host time without them
            self._pool.append(ev)
            return
        self.stop(C_OPT, ev)

    def begin_step(self) -> None:
        self._spans = self._pre_spans
        self._pre_spans = []
        self._opt_ev = None

    def abort_step(self) -> None:
        """The step's block raised, or it was abandoned: it is not recorded; its events go back
        to the pool."""
        for _, a, b in self._spans:
            self._pool += (a, b)
        self._spans = []
        if self._opt_ev is not None:
            self._pool.append(self._opt_ev)
            self._opt_ev = None

    def end_step(self, r: StepRecorder, t1: int, mem: int) -> None:
        """Called at step exit instead of appending the row: it waits here for its events."""
        self._pending.append((t1, t1 - r.t0, r.inp, r.fwd, r.bwd, r.opt, mem, self._spans))
        self._spans = []
        self.drain(r)

    # ---- commit ------------------------------------------------------------------------------

    def drain(self, r: StepRecorder, final: bool = False) -> None:
        """Commit, in order, every row whose events have completed (all rows when ``final``)."""
        pending = self._pending
        while pending:
            row = pending[0]
            spans = row[7]
            done = all(end.query() for _, _, end in spans)
            if not done and not final and len(pending) <= self.max_pending:
                return
            pending.popleft()
            t1, step_ns, inp, fwd, bwd, opt, mem, _ = row
            if done:
                gpu = {C_FWD: 0, C_BWD: 0, C_OPT: 0, C_H2D: 0}
                seen = set()
                for col, a, b in spans:
                    gpu[col] += int(a.elapsed_time(b) * 1e6)   # elapsed_time is in milliseconds
                    seen.add(col)
                fwd = gpu[C_FWD] if C_FWD in seen else fwd
                bwd = gpu[C_BWD] if C_BWD in seen else bwd
                opt = gpu[C_OPT] if C_OPT in seen else opt
                h2d = gpu[C_H2D]
            else:
                self.fallbacks += 1
                h2d = -1
            for _, a, b in spans:
                self._pool += (a, b)
            r.append((t1, step_ns, inp, fwd, bwd, opt, h2d, mem), t1)

    @property
    def pending(self) -> int:
        return len(self._pending)
