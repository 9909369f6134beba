"""A step while it is measured: the state every hook reads and writes, and the one step context.

Rules of the hot path (everything a traced step touches reads :class:`StepState`):

* no I/O, no locks, no environment or file lookups, no logging;
* the step's values are one list laid out like its record (recorder.py), a new one at each
  step entry: a hook adds the time it measured to its column (``t.vals[C_FWD] += ...``) and the
  record is that list at step exit;
* the cost is set by how many Python calls and distinct objects a step touches (caches are
  cold in the middle of a training step: benchmarks/README.md, "Rank side"), so each hook reads
  the host clock inline and calls the timing strategy only where the strategy has more to do.

Timing model (what the user sees in the summary):

* a step is recorded when its ``trace_step`` block completes; a block left by an exception is
  not a step (its time is often a collective waiting for a dead peer) and is not recorded, but
  its index is remembered (:attr:`StepState.raised_at`) for the failure report;
* ``step_ns`` = time inside ``trace_step`` + the input fetches credited to the step;
* ``input_ns`` = DataLoader ``__next__`` time spent inside the step, plus the fetches made after
  the previous step's exit and before this step's entry (the usual
  ``for batch in loader: with trace_step(model): ...`` shape); -1 (not measured) when no fetch
  of a DataLoader or a ``wrap_dataloader`` iterable was timed for the step (a ``get_batch()``
  function): the summary then reads the time between steps instead, and says so. A forward
  pass of a traced model outside any step (evaluation) clears those pending fetches, so an
  evaluation loop between two steps is never credited to the next step; other work between
  steps (checkpointing, logging) is never timed at all;
* ``forward_ns``/``backward_ns``/``optimizer_ns`` accumulate every forward of a traced model,
  every ``torch.autograd.backward`` (``loss.backward()``) and every ``Optimizer.step`` inside the
  step; a forward or backward run *inside* ``optimizer.step(closure)`` (LBFGS, Lightning) counts
  as forward/backward and is taken out of the optimizer time, so phases never overlap; on CUDA
  they are replaced by CUDA-event times once the events have completed (cuda_timing.py);
  ``forward_ns`` is -1 when no model was given to ``trace_step``;
* ``mem_peak`` is the highest memory sample taken by the client thread since the previous step
  (memory.py); -1 until the first sample;
* ``comm_*``: the step's collectives (collectives.py, comm.py). A step with some has its exposed
  communication taken out of the phase it waited in, so forward/backward/optimizer are compute
  and ``comm_ns`` is the wait; a step with none pays one attribute test (``t.cn``) for it.

How a phase is timed is the timing strategy's (timing.py): the host clock (CPU), plus the
reducer's own timings of a DDP model's all-reduce read at step exit (CPU DDP), or CUDA events
with the record held back until they complete (cuda_timing.py). The step context and every
hook call through it.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from .collectives import CommAccount, InFlight
from .recorder import (C_BWD, C_COMM, C_FWD, C_INPUT, C_MEM, C_OPT, C_STEPNS, C_TEND, StepRecorder,
                       fresh_values)

#: what a step without collectives says in its communication columns, by ``StepState.cdef``
COMM_MEASURED, COMM_INCOMPLETE, COMM_NO_GROUP = 0, -1, -2


class StepState:
    """Per-process step state; written by the training thread (and the memory fields by the
    client thread's memory probe). One instance, owned by the process's tracer (tracer.py)."""

    __slots__ = (
        # hot fields first: read by every hook
        "on", "active", "vals", "pending_input", "in_fwd", "opt_owner", "models",
        "model_id", "events", "infer", "nbwd", "cn", "comm", "cdef", "mem", "mem_last",
        "direct", "timing", "rec", "fresh", "inference",
        # colder
        "raised_at", "inflight", "forward_timed", "step",
    )

    def __init__(self, recorder: StepRecorder, timing: Any) -> None:
        self.on = True            # False: every hook passes straight through
        self.rec = recorder
        #: the timing strategy (timing.py); ``events`` is its CUDA-event part, None without one
        self.timing = timing
        self.events: Any = None
        #: the strategy's ``direct`` (timing.py), read by every step exit
        self.direct: bool = timing.direct
        self.active = 0           # 0 outside a step; 1 inside; 1 + n inside n nested blocks
        self.pending_input = -1   # -1: no batch fetch timed since the last step (not measured)
        self.in_fwd = False
        self.opt_owner: Any = None
        # id() of the model traced last (trace_step's fast check) and of every model passed to
        # trace_step (the forward wrappers' check). Ids, not references (Tracer.register_model).
        self.model_id = 0
        self.models: set[int] = set()
        #: steps are inferred from optimizer steps (inference.py), which is ``inference``
        self.infer = False
        self.inference: Any = None
        self.nbwd = 0             # backward passes since inference last counted them
        self.mem = -1             # highest memory sample since the last step
        self.mem_last = -1        # latest memory sample
        # communication (comm.py): collectives launched in the current step (0 = the fast path)
        self.cn = 0
        self.cdef = COMM_NO_GROUP
        self.inflight = InFlight()
        self.comm = CommAccount(self.inflight)
        self.forward_timed = False
        self.fresh = fresh_values(forward_timed=False, comm=-1)
        self.vals = list(self.fresh)
        #: index of the last step whose ``trace_step`` block an exception left (-1: none), so a
        #: failure report can say "during step N" rather than "after N steps"
        self.raised_at = -1
        self.step = StepContext(self)

    def use_timing(self, timing: Any) -> None:
        """Time steps with ``timing`` from the next step on (timing.py)."""
        self.timing = timing
        self.events = timing.events
        self.direct = timing.direct

    # ---- what a step starts from ---------------------------------------------------------------

    def time_forward(self, on: bool) -> None:
        """Forward is measured (a model is traced) or not (-1) from the next step on."""
        self.forward_timed = on
        self._refresh()

    def set_comm(self, cdef: int) -> None:
        """What a step without collectives says from now on (see ``COMM_*``); once coverage is
        incomplete, the open step's communication is not measured either."""
        self.cdef = cdef
        self._refresh()
        if cdef < 0 and self.active:
            self.vals[C_COMM:] = self.fresh[C_COMM:]

    def _refresh(self) -> None:
        self.fresh = fresh_values(forward_timed=self.forward_timed,
                                  comm=0 if self.cdef == COMM_MEASURED else -1)

    # ---- phases timed by callbacks rather than by wrapping a call (driven.py) ---------------------

    def begin(self) -> tuple[int, int, Any]:
        """Start timing a phase whose end another callback will see: the token for :meth:`end`.
        The wrappers (hooks.py) do the same inline."""
        ev = self.events
        s = ev.phase_start() if ev is not None else None
        v = self.vals
        return perf_counter_ns(), v[C_FWD] + v[C_BWD], s

    def end(self, col: int, token: tuple[int, int, Any]) -> None:
        """Add the time since :meth:`begin` to ``col`` (an optimizer phase without the forward
        and backward passes timed inside it)."""
        t0, nested0, s = token
        v = self.vals
        dt = perf_counter_ns() - t0
        if col == C_OPT:
            dt -= v[C_FWD] + v[C_BWD] - nested0
        v[col] += dt
        if s is not None and self.events is not None:
            self.events.phase_stop(col, s)

    # ---- between steps -------------------------------------------------------------------------

    def forget_pending_input(self, measured: bool) -> None:
        """The fetches since the last step were not for training (an evaluation, a sanity check):
        they are not the next step's input wait (which is then 0 if ``measured``, else -1)."""
        if not self.active:
            self.pending_input = 0 if measured else -1
            if self.events is not None:
                self.events.clear_pre()

    def abandon(self) -> None:
        """Drop the step in progress without recording it (a step left open by an exception in
        a framework's loop, or by inference when something else takes the steps over)."""
        self.active = 0
        self.opt_owner = None
        self.in_fwd = False
        self.nbwd = 0
        self.timing.abort_step(self)

    def produced(self) -> int:
        """Steps completed so far, recorded or still waiting for their CUDA events."""
        return self.rec.count + self.timing.pending


class StepContext:
    """What ``trace_step(model)`` returns: one reusable object, no allocation per step (CPU)."""

    __slots__ = ("t",)

    def __init__(self, state: StepState) -> None:
        self.t = state

    def __enter__(self) -> "StepContext":
        t = self.t
        if t.active:            # nested trace_step: counts toward the outer step
            t.active += 1
            return self
        t.active = 1
        t.vals = v = t.fresh.copy()     # (the record: the batch keeps it, recorder.py)
        inp = t.pending_input
        v[C_INPUT] = inp
        t.pending_input = -1
        if t.events is not None:
            t.events.begin_step()
        # the step's start, held in its duration's column until the client thread subtracts it
        # (recorder.py); the fetch made just before entering is part of the step: start that
        # much earlier
        v[C_STEPNS] = perf_counter_ns() - inp if inp > 0 else perf_counter_ns()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = perf_counter_ns()
        t = self.t
        a = t.active
        if a != 1:
            if a:
                t.active = a - 1
            return False
        t.active = 0
        if et is not None:      # an aborted step is no step: its time (often a collective
            t.raised_at = t.produced()  # timing out on a dead peer) would only mislead
            t.timing.abort_step(t)
            return False
        v = t.vals
        v[C_TEND] = t1
        v[C_MEM] = t.mem
        t.mem = t.mem_last
        if t.direct and not t.cn:  # the host clock, no collectives: nothing to add (fast path)
            t.rec.commit(v, t1)
        else:
            t.timing.end_step(t, t1)
        return False


class NullContext:
    """``trace_step`` when tracing is off: one call and two no-op methods."""

    __slots__ = ()

    def __enter__(self) -> "NullContext":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        return False


NULL_CONTEXT = NullContext()

