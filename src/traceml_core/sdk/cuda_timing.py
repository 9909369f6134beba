"""CUDA-event timing of the step phases, resolved without ever synchronising the device.

On a GPU the host returns from ``model(x)`` or ``loss.backward()`` long before the kernels have
run, so host wall time measures kernel *launches*, not work. Each phase is therefore bracketed by a
pair of CUDA events recorded on the current stream; a step's row is held back until its events have
completed (``Event.query()``, which never blocks) and then committed with the GPU times. The host
times are kept as the fallback: if a row's events are still pending after :attr:`max_pending` later
steps (the host far ahead of the device) or at shutdown, it is committed with host times and counted
in :attr:`CudaPhaseTimer.fallbacks` -- never a ``synchronize()``, which could stall training.

Communication (sdk/comm.py) is timed the same way: a blocking collective, or a ``wait()`` on an
asynchronous one, between two events on the current stream (the stream waits for the collective,
so the gap between them is the exposed communication); a DDP bucket or an asynchronous collective
from an event at launch to one recorded in its future's callback, which torch runs with the
current stream synchronised with the collective's completion. Exposed time of a DDP backward is
from the last bucket's launch (its gradients ready: compute done) to the last completion.

This is the CUDA timing strategy (timing.py): the step context and the hooks call it for every
phase (``events`` is the timer itself) and at step exit.

The event and stream factories are injectable so the deferred-commit logic can be exercised with
stand-in events on machines without a GPU; on a GPU the defaults are ``torch.cuda.Event`` and
``torch.cuda.current_stream(device)``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from .collectives import NO_COMM, CommFigures, put_comm, union_ns
from .recorder import C_BWD, C_FWD, C_H2D, C_OPT, C_TEND
from .step import StepState
from .timing import HostClock

_MAX_PRE_SPANS = 256


class CudaPhaseTimer(HostClock):
    """Brackets phases with CUDA events and commits records once the events are done."""

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
        self.events = self
        self.direct = False
        #: communication of the current step: ("b", ev0, ev1, S, bus, phase) blocking,
        #: ("s", ev0, [ev1], S, bus) launched (ev1 appended at completion), ("w", ev0, ev1, phase)
        #: a wait, ("r", ev0 of the last bucket, [its "s" items]) a DDP backward's buckets
        self._comm: list[tuple[Any, ...]] = []
        self._round: list[tuple[Any, ...]] = []

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

    def phase_start(self) -> tuple[Any, int]:
        """The token of a phase (hooks.py, ``StepState.begin``): its start event and where its
        step's spans stood."""
        return self.start(), len(self._spans)

    def forward_start(self, x: Any) -> tuple[Any, int]:
        """:meth:`phase_start` of a forward (hooks.py passes the forward's first argument, which
        the CPU's work sampler measures; the events need only the start)."""
        return self.start(), len(self._spans)

    def phase_stop(self, col: int, token: tuple[Any, int]) -> None:
        ev, mark = token
        if col == C_OPT and any(c in (C_FWD, C_BWD) for c, _, _ in self._spans[mark:]):
            # forward/backward ran inside the step (a closure): the event span would hold them
            # too, so this step's optimizer time stays the host time without them
            self._pool.append(ev)
            return
        self.stop(col, ev)

    def new_event(self) -> Any:
        return self._pool.pop() if self._pool else self._new_event()

    def end_event(self) -> Any:
        """An event recorded now on the current stream (completion callbacks; may run on another
        thread, so it takes a fresh event rather than one from the pool)."""
        ev = self._new_event()
        ev.record(self._stream())
        return ev

    # ---- communication (sdk/comm.py) ----------------------------------------------------------

    def comm_blocking(self, ev0: Any, nbytes: int, bus: float, phase: int) -> None:
        self._comm.append(("b", ev0, self.start(), nbytes, bus, phase))

    def comm_async(self, ev0: Any, nbytes: int, bus: float) -> list[Any]:
        holder: list[Any] = []
        self._comm.append(("s", ev0, holder, nbytes, bus))
        return holder

    def comm_wait(self, ev0: Any, phase: int) -> None:
        self._comm.append(("w", ev0, self.start(), phase))

    def comm_bucket(self, ev0: Any, nbytes: int, bus: float, last: bool) -> list[Any]:
        holder = self.comm_async(ev0, nbytes, bus)
        self._round.append(self._comm[-1])
        if last:
            self._comm.append(("r", ev0, self._round))
            self._round = []
        return holder

    def begin_step(self) -> None:
        """The step context enters a step: the copies since the last step are its own."""
        self._spans = self._pre_spans
        self._pre_spans = []

    def abort_step(self, t: StepState) -> None:
        """The step's block raised, or it was abandoned: it is not recorded; its events go back
        to the pool."""
        HostClock.abort_step(self, t)
        for _, a, b in self._spans:
            self._pool += (a, b)
        self._spans = []
        # its collectives' events: the launch events are ours; end events may still be appended by
        # completion callbacks, so those are left to the garbage collector
        self._pool += [it[1] for it in self._comm if it[0] in ("b", "s", "w")]
        self._comm = []
        self._round = []

    def end_step(self, t: StepState, t1: int) -> None:
        """At step exit, instead of committing the record: it waits here for its events."""
        comm = None
        if t.cn:        # (calls, host-clock figures of CPU collectives, CUDA items)
            if self._round:     # a backward whose last bucket we did not see (an error)
                self._comm.append(("r", self._round[-1][1], self._round))
            comm = (t.cn, t.comm.figures() if t.cdef >= 0 else None, self._comm)
            if t.cdef < 0:
                t.comm.reset()
            t.cn = 0
            self._comm = []
            self._round = []
        self._pending.append((t.vals, self._spans, comm))
        self._spans = []
        self.drain(t)

    # ---- commit ------------------------------------------------------------------------------

    def drain(self, t: StepState, final: bool = False) -> None:
        """Commit, in order, every record whose events have completed (all when ``final``); a
        record whose events have not completed commits with its host times (h2d -1)."""
        pending = self._pending
        while pending:
            vals, spans, comm = pending[0]
            done = all(end.query() for _, _, end in spans) and (comm is None or _comm_done(comm[2]))
            if not done and not final and len(pending) <= self.max_pending:
                return
            pending.popleft()
            if done:
                gpu = {C_FWD: 0, C_BWD: 0, C_OPT: 0, C_H2D: 0}
                for col, a, b in spans:
                    gpu[col] += int(a.elapsed_time(b) * 1e6)   # elapsed_time is in milliseconds
                for col in {col for col, _, _ in spans} | {C_H2D}:
                    vals[col] = gpu[col]
            else:
                self.fallbacks += 1
            for _, a, b in spans:
                self._pool += (a, b)
            if comm is not None:
                calls, host, items = comm
                # coverage incomplete, or no device times for the communication: not measured
                put_comm(vals, calls, host.plus(comm_figures(items)) if host is not None and done else None)
                self._recycle(items)
            t.rec.commit(vals, vals[C_TEND])

    def _recycle(self, items: list[tuple[Any, ...]]) -> None:
        seen: set[int] = set()
        for ev in _events(items):
            if id(ev) not in seen:
                seen.add(id(ev))
                self._pool.append(ev)

    @property
    def pending(self) -> int:
        return len(self._pending)


def _events(items: list[tuple[Any, ...]]) -> list[Any]:
    out: list[Any] = []
    for it in items:
        kind = it[0]
        if kind in ("b", "w"):
            out += (it[1], it[2])
        elif kind == "s":
            out.append(it[1])
            out += it[2]
    return out


def _comm_done(items: list[tuple[Any, ...]]) -> bool:
    for it in items:
        if it[0] == "s" and not it[2]:
            return False     # the completion callback has not run yet
    return all(ev.query() for ev in _events(items))


def comm_figures(items: list[tuple[Any, ...]]) -> CommFigures:
    """A step's communication figures from completed CUDA events (same rules as the host path)."""
    if not items:
        return NO_COMM
    ref = items[0][1]

    def t(ev: Any) -> int:
        return 0 if ev is ref else int(ref.elapsed_time(ev) * 1e6)

    exposed = nbytes = 0
    bus = 0.0
    sub = {C_FWD: 0, C_BWD: 0, C_OPT: 0}
    intervals = []
    for it in items:
        kind = it[0]
        if kind == "b":
            a, b = t(it[1]), t(it[2])
            intervals.append((a, b))
            nbytes += it[3]
            bus += it[4]
            exposed += max(0, b - a)
            if it[5] in sub:
                sub[it[5]] += max(0, b - a)
        elif kind == "s":
            intervals.append((t(it[1]), t(it[2][0])))
            nbytes += it[3]
            bus += it[4]
        elif kind == "w":
            wait = max(0, t(it[2]) - t(it[1]))
            exposed += wait
            if it[3] in sub:
                sub[it[3]] += wait
        elif kind == "r":
            ends = [t(s[2][0]) for s in it[2] if s[2]]
            if ends:
                wait = max(0, max(ends) - t(it[1]))
                exposed += wait
                sub[C_BWD] += wait
    return CommFigures(exposed, union_ns(intervals), nbytes, bus, sub[C_FWD], sub[C_BWD], sub[C_OPT])
