"""What a step consumed, without code: the batch a rank's model was given and the training
thread's CPU time in each phase, measured on a sample of steps.

Why: a rank slower than the others may wait longer (a slower device, storage, another process
on its cores) or *do more*: bigger batches from an uneven sampler, longer sequences without
bucketing, work only that rank does. Only the figures tell them apart, and the advice differs
(the node, or the data). So each rank measures, on sampled steps:

* **the batch**: what each forward of the traced model was given in the step, its first
  argument (``model(x)``, ``model(input_ids=...)``): samples (its first dimension) and elements
  (all of it; for an integer tensor such as token ids, its tokens), summed over the step's
  forwards (gradient accumulation's micro-batches are one step's work);
* **the CPU**: the training thread's own CPU time (``time.thread_time_ns``) from the step's
  start to the next step's start, and inside forward, backward and the optimizer step, with the
  wall time of the same spans beside it.

How, at no cost to the other steps: the hooks already call the timing strategy's device-event
part (``StepState.events``) at each phase, where there is one (CUDA); on a CPU run there is none
and the hooks skip it. Ten times a second, once the rank has settled (its first steps are
warm-up), the client thread *arms* the sampler by putting it there (:meth:`WorkSampler.tick`);
the next step's start begins a sample, the following step's start ends it and puts nothing back
(ten a second: a 60-step run of 40 ms steps still has about twenty). A thread-CPU clock read is a system call (0.1-4 us), so the
steps that are not sampled pay nothing, and a sampled step pays a few of them. Never on a CUDA run
(the device events own the slot there; the batch is not measured there). The sums go to node 0
in the CPU probe's events; nothing here raises into training.
"""

from __future__ import annotations

from time import perf_counter_ns, thread_time_ns
from typing import Any, Optional

from .recorder import C_BWD, C_FWD, C_OPT

_PHASE = {C_FWD: "forward", C_BWD: "backward", C_OPT: "optimizer"}
#: steps after which a rank has settled (its first steps are warm-up: sdk/threads.py's)
SETTLED_STEPS = 5
#: how often the client thread arms the sampler (s)
INTERVAL_S = 0.1
PHASES = tuple(_PHASE.values())
#: a batch's structure is looked into this deep (a dict of tuples of tensors) at most
MAX_DEPTH = 3


def _tensor(x: Any, depth: int = 0) -> Any:
    """The first tensor in ``x`` (a tensor, or the first tensor of a tuple, list or dict)."""
    if hasattr(x, "shape") and hasattr(x, "numel"):
        return x
    if depth >= MAX_DEPTH:
        return None
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for v in x[:8]:
            t = _tensor(v, depth + 1)
            if t is not None:
                return t
    return None


def batch_size(x: Any) -> Optional[tuple[int, int, bool]]:
    """(samples, elements, integer) of a forward's first argument, or None when it holds no
    tensor with a first dimension."""
    t = _tensor(x)
    if t is None:
        return None
    try:
        shape = tuple(t.shape)
        if not shape:
            return None
        return int(shape[0]), int(t.numel()), not bool(t.is_floating_point() or t.is_complex())
    except Exception:  # noqa: BLE001 - a measurement must never cost the step
        return None


class WorkSampler:
    """The sampler the CPU probe arms (see the module docstring). Its sums, since the rank
    settled: :meth:`figures`."""

    __slots__ = ("state", "armed", "recording", "t0", "w0", "cur", "n", "it_cpu", "it_wall", "cpu", "wall",
                 "fwd", "samples", "elements", "tokens", "measured", "batches")

    def __init__(self, state: Any) -> None:
        self.state = state
        self.armed = False
        self.recording = False
        self.t0 = self.w0 = 0
        #: the sample in progress: cpu and wall ns per phase, forwards, samples, elements, tokens
        self.cur: list[Any] = []
        self.n = 0                  # complete samples
        self.it_cpu = self.it_wall = 0
        self.cpu = {p: 0 for p in PHASES}
        self.wall = {p: 0 for p in PHASES}
        self.fwd = 0                # forwards in the samples
        self.samples = self.elements = self.tokens = 0
        self.measured = 0           # samples whose batch was measured
        self.batches = 0            # forwards whose first argument was measured

    # ---- client thread -------------------------------------------------------------------------

    def tick(self) -> None:
        """Arm the sampler once the rank has settled (the client thread calls it periodically)."""
        rec = getattr(self.state, "rec", None)
        if rec is not None and rec.count >= SETTLED_STEPS:
            self.arm()

    def arm(self) -> None:
        """Sample the next step (a no-op while a sample is armed or the slot is taken)."""
        st = self.state
        if self.armed or st.events is not None or getattr(st.timing, "events", None) is not None:
            return
        self.armed = True
        st.events = self

    def figures(self) -> dict[str, Any]:
        """The sums of the complete samples (ns, counts)."""
        return {"n": self.n, "cpu_ns": self.it_cpu, "wall_ns": self.it_wall,
                "phase_cpu_ns": dict(self.cpu), "phase_wall_ns": dict(self.wall), "forwards": self.fwd,
                "measured": self.measured, "samples": self.samples, "elements": self.elements,
                "tokens": self.tokens}

    # ---- training thread (the events interface the hooks call) -----------------------------------

    def _disarm(self) -> None:
        self.recording = False
        self.armed = False
        st = self.state
        if st.events is self:
            st.events = getattr(st.timing, "events", None)

    def begin_step(self) -> None:
        c, w = thread_time_ns(), perf_counter_ns()
        if self.recording:  # the sampled step's iteration ends here
            cur = self.cur
            self.n += 1
            self.it_cpu += c - self.t0
            self.it_wall += w - self.w0
            for p in PHASES:
                self.cpu[p] += cur[0][p]
                self.wall[p] += cur[1][p]
            self.fwd += cur[2]
            if cur[3]:
                self.measured += 1
                self.batches += cur[3]
                self.samples += cur[4]
                self.elements += cur[5]
                self.tokens += cur[6]
            self._disarm()
            return
        if getattr(self.state.timing, "events", None) is not None:  # the device took the slot over
            self._disarm()
            return
        self.recording = True
        self.t0, self.w0 = c, w
        self.cur = [{p: 0 for p in PHASES}, {p: 0 for p in PHASES}, 0, 0, 0, 0, 0]

    def phase_start(self) -> tuple[int, int]:
        return thread_time_ns(), perf_counter_ns()

    def forward_start(self, x: Any) -> tuple[int, int]:
        if self.recording:
            cur = self.cur
            cur[2] += 1
            b = batch_size(x)
            if b is not None:
                cur[3] += 1
                cur[4] += b[0]
                cur[5] += b[1]
                if b[2]:
                    cur[6] += b[1]
        return thread_time_ns(), perf_counter_ns()

    def phase_stop(self, col: int, token: tuple[int, int]) -> None:
        c, w = thread_time_ns(), perf_counter_ns()
        p = _PHASE.get(col)
        if self.recording and p is not None:
            self.cur[0][p] += c - token[0]
            self.cur[1][p] += w - token[1]

    def clear_pre(self) -> None:
        pass
