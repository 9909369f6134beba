"""What a step's collectives add up to: their sizes and bus factors, the account of one step, the
figures it becomes and the one function that writes them into the step's record. No torch and
no hooks here (those are in comm.py); the CUDA timer (cuda_timing.py) computes the same figures
from events.

The columns (``comm_*`` in the wire protocol's table):

* ``comm_ns`` - **exposed** communication: the time this rank's training thread waited for
  collectives (see comm.py for how each kind is timed). The phase a wait happened in (forward,
  backward, optimizer) is reported *without* it, so ``backward_ns`` is backward's compute and
  ``comm_ns`` its wait;
* ``comm_busy_ns`` - the time at least one collective was in flight (the union of their
  intervals from launch to completion, overlapped with compute or not);
* ``comm_bytes`` - the collectives' sizes ``S`` as nccl-tests defines them, summed;
  ``comm_bus_bytes`` - each size times its operation's bus factor (:func:`bus_factor`), summed.
  So ``algbw = comm_bytes / comm_busy_ns`` and ``busbw = comm_bus_bytes / comm_busy_ns``;
* ``comm_calls`` - collectives launched in the step.
"""

from __future__ import annotations

from time import time_ns
from typing import Any, NamedTuple, Optional

from .recorder import C_BWD, C_COMM, C_FWD, C_OPT


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: ``busbw = algbw * factor`` for a group of ``n`` ranks.

    All-reduce moves ``2(n-1)/n`` of its size over each rank's link, all-gather, reduce-scatter and
    all-to-all ``(n-1)/n``, broadcast and reduce the size itself (nccl-tests, PERFORMANCE.md).
    """
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    if op == "barrier":
        return 0.0
    return (n - 1) / n


class Collective(NamedTuple):
    """A collective this rank launched and that has not completed yet."""

    op: str            # "all_reduce", ..., or "ddp_bucket" (a DDP gradient bucket's all-reduce)
    nbytes: int        # its size S (see the module docstring)
    seq: int           # this rank's count of collectives TraceML saw before it (0-based)
    started_ns: int    # wall clock (time.time_ns) at launch
    group_size: int


class InFlight:
    """The collectives this rank launched that have not completed, by ``seq``: written at launch
    and completion (any thread), read by the hang autopsy (:meth:`oldest`). One dict operation
    each way: cheap enough to be always on."""

    __slots__ = ("_open", "launched")

    def __init__(self) -> None:
        self._open: dict[int, Collective] = {}
        #: collectives launched so far (while tracing was on): the ``seq`` the next one gets
        self.launched = 0

    def launch(self, op: str, nbytes: int, n: int) -> int:
        seq = self.launched
        self.launched = seq + 1
        self._open[seq] = Collective(op, nbytes, seq, time_ns(), n)
        return seq

    def landed(self, seq: int) -> None:
        self._open.pop(seq, None)

    def oldest(self) -> Optional[Collective]:
        """The oldest collective this rank launched that has not completed, or None.

        A rank stuck in communication is stuck in this one (an all-reduce's partner never
        arrived), and comparing ``seq`` across ranks shows which rank fell behind. Safe from any
        thread at any time; costs a dict copy of the few outstanding entries."""
        for _ in range(3):
            try:
                items = list(self._open.values())
                break
            except RuntimeError:   # resized by another thread while copying: try again
                continue
        else:
            return None
        return min(items, key=lambda c: c.seq) if items else None


class CommFigures(NamedTuple):
    """One step's communication, before it becomes columns (see the module docstring)."""

    exposed: int
    busy: int
    nbytes: int
    bus: float
    sub_fwd: int      # exposed time that happened inside forward, backward, optimizer
    sub_bwd: int
    sub_opt: int

    def plus(self, o: "CommFigures") -> "CommFigures":
        return CommFigures(*(a + b for a, b in zip(self, o)))


NO_COMM = CommFigures(0, 0, 0, 0.0, 0, 0, 0)


class CommAccount:
    """What the collectives of the current step left behind on the host clock.

    ``spans`` are ``[t0, t1, S, bus_bytes]`` lists (``t1`` is filled in by the completion
    callback, maybe on another thread); ``rounds`` are DDP backward passes:
    ``(t_last_bucket_ready, [spans])``. ``sub_*`` hold the exposed time to take out of forward,
    backward and optimizer. With CUDA timing the same facts are CUDA events, kept by the CUDA
    timer instead.
    """

    __slots__ = ("spans", "exposed", "sub_fwd", "sub_bwd", "sub_opt", "rounds", "round", "works",
                 "inflight")

    def __init__(self, inflight: InFlight) -> None:
        self.inflight = inflight
        self.spans: list[list[Any]] = []
        self.exposed = 0
        self.sub_fwd = self.sub_bwd = self.sub_opt = 0
        self.rounds: list[tuple[int, list[list[Any]]]] = []
        self.round: list[list[Any]] = []
        #: id(Work) -> (Work, its span (None: timed with CUDA events), seq): asynchronous
        #: collectives of this step not waited yet
        self.works: dict[int, tuple[Any, Any, int]] = {}

    def reset(self) -> None:
        self.spans = []
        self.exposed = 0
        self.sub_fwd = self.sub_bwd = self.sub_opt = 0
        self.rounds = []
        self.round = []
        for _work, span, seq in self.works.values():
            if span is not None:
                self.inflight.landed(seq)     # never waited in its step: no longer tracked
        self.works = {}

    def charge(self, phase: int, wait: int) -> None:
        """``wait`` ns of exposed communication, inside ``phase`` (a column, or 0 for none)."""
        self.exposed += wait
        if phase == C_BWD:
            self.sub_bwd += wait
        elif phase == C_FWD:
            self.sub_fwd += wait
        elif phase == C_OPT:
            self.sub_opt += wait

    def figures(self) -> CommFigures:
        """This step's figures from the host clock; resets the account."""
        exposed, sub_bwd = self.exposed, self.sub_bwd
        rounds = self.rounds
        if self.round:      # a backward whose last bucket we did not see (an error)
            rounds.append((max(s[0] for s in self.round), self.round))
        for last_ready, spans in rounds:
            ends = [s[1] for s in spans if s[1] is not None]
            if ends:
                wait = max(0, max(ends) - last_ready)
                exposed += wait
                sub_bwd += wait
        done = [s for s in self.spans if s[1] is not None]
        out = CommFigures(exposed, union_ns([(s[0], s[1]) for s in done]), sum(s[2] for s in done),
                          sum(s[3] for s in done), self.sub_fwd, sub_bwd, self.sub_opt)
        self.reset()
        return out


def put_comm(vals: list[int], calls: int, f: Optional[CommFigures]) -> None:
    """Write a step's communication into its values: the ``comm_*`` columns, and forward,
    backward and optimizer without the waits inside them; ``f`` None: not measured (-1
    throughout: say nothing rather than something too low). The one place these columns are
    written, for host-clock and CUDA-event figures alike."""
    if f is None:
        vals[C_COMM:] = [-1] * (len(vals) - C_COMM)
        return
    vals[C_FWD] = without(vals[C_FWD], f.sub_fwd)
    vals[C_BWD] = without(vals[C_BWD], f.sub_bwd)
    vals[C_OPT] = without(vals[C_OPT], f.sub_opt)
    vals[C_COMM:] = [f.exposed, f.busy, f.nbytes, int(f.bus), calls]


#: a wait may exceed the phase it was charged to by this share of the phase (two clocks: the
#: phase's host times and, for DDP, the reducer's own timings) and still leave it at 0
CLOCK_SLACK = 1 / 32


def without(phase_ns: int, wait_ns: int) -> int:
    """A phase's time without the communication it waited for (unmeasured phases stay -1).

    When more wait was charged to the phase than it lasted (beyond :data:`CLOCK_SLACK`), the
    wait did not all happen inside it, so its own time is not known: -1 (not measured), never a
    made-up 0 (a clamp once hid a wrongly charged Lightning broadcast behind "optimizer 0.0 ms")."""
    if wait_ns <= 0 or phase_ns <= 0:
        return phase_ns
    own = phase_ns - wait_ns
    if own >= 0:
        return own
    return 0 if -own <= phase_ns * CLOCK_SLACK else -1


def union_ns(intervals: list[tuple[Any, Any]]) -> int:
    """Total length of the union of ``(start, end)`` intervals (overlaps counted once)."""
    if not intervals:
        return 0
    intervals = sorted(intervals)
    total = 0
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    total += cur_e - cur_s
    return int(total)
