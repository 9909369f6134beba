"""How a step is timed: the strategies the step context and the hooks call through.

* :class:`HostClock` (CPU): every phase on the host clock, read inline by the hooks; at step
  exit the step's collectives, if any, become its communication columns and the record is
  committed;
* :class:`ReducerPolling` (CPU, once a DDP model is watched): the same, and at step exit the
  reducer's own timings of the step's all-reduce are read first (see below);
* ``cuda_timing.CudaPhaseTimer`` (once a CUDA model is traced): phases are also bracketed by
  CUDA events, and the record is held back until they complete.

A strategy's interface: ``events`` (itself when it brackets phases with device events, else
None: the hooks then read the host clock only), ``end_step(state, t1)`` (``direct``: a step
without collectives has nothing to add, and the step context commits it itself),
``abort_step(state)``, ``pending`` (records waiting for the device) and ``drain(state, final)``.

Why the reducer's timings on CPU: DDP's gradient all-reduce never passes through
``torch.distributed.all_reduce`` (the reducer calls the process group from C++). DDP's reducer
records, in C++, when the first bucket's all-reduce was launched, when the last gradient was
ready (its compute done) and when the last all-reduce completed (``finalize``); with the
sampling rate at 1 it does so every iteration. :meth:`ReducerPolling.poll` reads them at step
exit (one ``set_runtime_stats_and_log`` and one ``_get_ddp_logging_data``: ~15 us per step, not
per bucket): exposed = comm end - compute end, in flight = comm end - comm start (first launch
to last completion: it includes any gap between buckets), bytes = the buckets reduced. A Python
comm hook would instead cost a GIL hand-over on gloo's thread for every bucket (~250 us per
bucket measured, benchmarks/README.md). Only the last synchronising backward of a step is seen
(gradient accumulation without ``no_sync()`` syncs every micro-batch: the earlier ones are then
not counted).
"""

from __future__ import annotations

import weakref
from typing import Any

from .collectives import bus_factor, put_comm
from .recorder import C_BWD
from .step import StepState


class HostClock:
    """Every phase on the host clock (the hooks read it inline; nothing to do per phase)."""

    events: Any = None
    direct = True
    pending = 0

    def end_step(self, t: StepState, t1: int) -> None:
        """The step's values are complete but for its communication: record it."""
        if t.cn:
            calls = t.cn
            t.cn = 0
            if t.cdef < 0:  # coverage incomplete: say nothing rather than something too low
                t.comm.reset()
                put_comm(t.vals, calls, None)
            else:
                put_comm(t.vals, calls, t.comm.figures())
        t.rec.commit(t.vals, t1)

    def abort_step(self, t: StepState) -> None:
        """The step is not recorded (its block raised, or it was abandoned): nor its collectives."""
        if t.cn:
            t.cn = 0
            t.comm.reset()

    def drain(self, t: StepState, final: bool = False) -> None:
        """Records held back (none on the host clock)."""


class Watched:
    """A DDP model on CPU whose all-reduce its own reducer times (``Logger`` runtime stats)."""

    __slots__ = ("ref", "last_end")

    def __init__(self, model: Any) -> None:
        self.ref = weakref.ref(model)
        self.last_end = 0


class ReducerPolling(HostClock):
    """The host clock, plus the reducer timings of the watched DDP models read at step exit
    (see the module docstring)."""

    direct = False

    def __init__(self) -> None:
        self.watched: list[Watched] = []

    def watch(self, model: Any) -> bool:
        """Have the reducer time every iteration; False if it cannot."""
        try:
            model._set_ddp_runtime_logging_sample_rate(1)
        except Exception:
            return False
        w = Watched(model)
        self.watched.append(w)
        model._traceml_comm = w
        return True

    def end_step(self, t: StepState, t1: int) -> None:
        self.poll(t)
        HostClock.end_step(self, t, t1)

    def poll(self, t: StepState) -> None:
        """Add the communication of the watched DDP models' last backward, if it is new."""
        for w in list(self.watched):
            m = w.ref()
            if m is None:
                self.watched.remove(w)
                continue
            try:
                m.logger.set_runtime_stats_and_log()
                d = m._get_ddp_logging_data()
                end = d.get("backward_comm_time_end") or 0
                start = d.get("backward_comm_time_start") or 0
                if not end or not start or end == w.last_end:
                    continue                # no synchronising backward since the last step
                w.last_end = end
                ready = d.get("backward_compute_time_end") or start
                sizes = d.get("rebuilt_bucket_sizes") if d.get("has_rebuilt_buckets") else None
                sizes = [int(x) for x in str(sizes or d.get("bucket_sizes") or "").split(",") if x.strip()]
                calls = int(d.get("num_buckets_reduced") or len(sizes) or 1)
                n = int(d.get("world_size") or 1)
            except Exception:
                continue
            nbytes = sum(sizes)
            a = t.comm
            off = t.rec.wall_offset     # the reducer's stamps are wall clock; spans are perf_counter
            a.spans.append([start - off, end - off, nbytes, nbytes * bus_factor("all_reduce", n)])
            a.charge(C_BWD, max(0, end - max(ready, start)))
            t.cn += calls
