"""The deferred commit of CUDA-event phase times, with stand-in events (no GPU on this machine).

The stand-in implements the three calls the timer makes on ``torch.cuda.Event``: ``record``,
``query`` (non-blocking completion check) and ``elapsed_time`` (milliseconds). The "device"
completes events only when the test says so, like a GPU running behind the host.
"""

from __future__ import annotations

from traceml_core.sdk import hooks
from traceml_core.sdk.cuda_timing import CudaPhaseTimer
from traceml_core.sdk.recorder import C_BWD, C_FWD, C_H2D, C_OPT, StepRecorder
from traceml_core.sdk.step import COMM_MEASURED
from traceml_core.sdk.tracer import Tracer
from traceml_core.wire.protocol import STEP_COLUMNS


class Device:
    def __init__(self):
        self.clock_ms = 0.0
        self.completed_upto = -1      # events with id <= this have completed
        self.next_id = 0


class FakeEvent:
    def __init__(self, dev: Device):
        self.dev = dev
        self.id = -1
        self.t = 0.0

    def record(self, stream=None):
        self.id = self.dev.next_id
        self.dev.next_id += 1
        self.t = self.dev.clock_ms

    def query(self):
        return self.id <= self.dev.completed_upto

    def elapsed_time(self, end):
        assert self.query() and end.query(), "elapsed_time on an incomplete event would block"
        return end.t - self.t


def setup(max_pending=4):
    dev = Device()
    t = Tracer(StepRecorder(batch_size=16))
    timer = CudaPhaseTimer("cuda:0", event_factory=lambda: FakeEvent(dev), stream_fn=lambda: None,
                           max_pending=max_pending)
    t.use_timing(timer)
    t.time_forward(True)              # as if a model had been traced
    return dev, t, timer


def gpu_step(dev, t, fwd_ms, bwd_ms, h2d_ms=None):
    if h2d_ms is not None:                # a copy right after the fetch, before the step
        ev = t.events.start()
        dev.clock_ms += h2d_ms
        t.events.stop_pre(C_H2D, ev)
    with t.step:
        ev = t.events.start()
        dev.clock_ms += fwd_ms
        t.events.stop(C_FWD, ev)
        ev = t.events.start()
        dev.clock_ms += bwd_ms
        t.events.stop(C_BWD, ev)


def committed(t):
    """Committed records, in protocol column order (step index first), as the client encodes
    them (``Batch.columns``, which numbers the steps from the batch's ``seq``)."""
    rec = t.rec
    rows = []
    for b in list(rec.sealed) + ([rec.batch] if rec.batch is not None else []):
        cols = b.columns(0)
        rows.extend(zip(*(cols[name] for name in STEP_COLUMNS)))
    return rows


def test_rows_wait_for_their_events_then_carry_gpu_times():
    dev, t, timer = setup()
    gpu_step(dev, t, 3.0, 5.0, h2d_ms=0.5)
    gpu_step(dev, t, 3.0, 5.0)
    assert committed(t) == [] and timer.pending == 2, "nothing is committed before the GPU is done"
    dev.completed_upto = 5            # the first step's six events are done
    gpu_step(dev, t, 3.0, 5.0)
    rows = committed(t)
    assert [r[0] for r in rows] == [0]
    assert rows[0][C_FWD] == 3_000_000 and rows[0][C_BWD] == 5_000_000
    assert rows[0][C_H2D] == 500_000, "the copy before the step is credited to it"
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    rows = committed(t)
    assert [r[0] for r in rows] == [0, 1, 2] and rows[1][C_H2D] == 0 and timer.fallbacks == 0


def test_a_device_far_behind_gets_host_times_instead_of_a_sync():
    dev, t, timer = setup(max_pending=4)
    for _ in range(10):
        gpu_step(dev, t, 1.0, 1.0)
    rows = committed(t)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4, 5], "oldest rows go out once 4 are pending"
    assert timer.fallbacks == 6
    assert all(r[C_H2D] == -1 for r in rows), "host fallback: h2d not measured"
    assert all(r[C_FWD] >= 0 and r[C_FWD] < 1_000_000 for r in rows), "host time of a launch"
    timer.drain(t, final=True)
    assert len(committed(t)) == 10 and t.rec.count == 10


def test_an_evaluation_forward_between_steps_drops_pending_copies():
    dev, t, timer = setup()
    ev = timer.start()
    dev.clock_ms += 7.0
    timer.stop_pre(C_H2D, ev)
    timer.clear_pre()                 # what the forward wrapper does outside a step
    gpu_step(dev, t, 1.0, 1.0)
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    assert committed(t)[0][C_H2D] == 0


def test_cuda_variant_wrappers_bracket_each_phase_with_events():
    dev, t, timer = setup()

    class Net:
        pass

    net = Net()
    t.model_id = id(net)
    t.models.add(id(net))

    def forward(self, x):
        dev.clock_ms += 2.0
        return x

    def backward(tensors, grad_tensors=None):
        dev.clock_ms += 4.0

    def step(self, closure=None):
        dev.clock_ms += 1.0

    fwd = hooks.forward(forward, t)
    bwd = hooks.backward(backward, t)
    opt = hooks.step(step, t)
    with t.step:
        fwd(net, 1)
        bwd("loss")
        opt("optimizer")
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    (row,) = committed(t)
    assert (row[C_FWD], row[C_BWD], row[C_OPT]) == (2_000_000, 4_000_000, 1_000_000)
    assert row[C_H2D] == 0 and timer.fallbacks == 0


def test_cuda_optimizer_span_around_a_closure_is_not_counted_as_optimizer_time():
    """optimizer.step(closure) with forward and backward inside: the optimizer's event span would
    hold them too, so the row keeps the host optimizer time without them (never an overlap)."""
    dev, t, timer = setup()

    class Net:
        pass

    net = Net()
    t.model_id = id(net)
    t.models.add(id(net))

    def forward(self, x):
        dev.clock_ms += 2.0
        return x

    def backward(tensors, grad_tensors=None):
        dev.clock_ms += 4.0

    fwd = hooks.forward(forward, t)
    bwd = hooks.backward(backward, t)

    def step(self, closure=None):
        closure()
        dev.clock_ms += 1.0

    opt = hooks.step(step, t)
    with t.step:
        opt("optimizer", lambda: (fwd(net, 1), bwd("loss")))
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    (row,) = committed(t)
    assert (row[C_FWD], row[C_BWD]) == (2_000_000, 4_000_000)
    assert 0 <= row[C_OPT] < row[C_FWD], "host time of the step minus the closure, not 7 ms"


def test_communication_resolves_from_events_and_leaves_backward_its_compute():
    """A DDP backward on the device: buckets ready at 3, 4, 5 ms, their all-reduces done at 4.5,
    6 and 8 ms (the last one is what backward waits for), then a 1 ms blocking all-reduce."""
    from traceml_core.sdk.recorder import C_COMM, C_COMM_BUS, C_COMM_BUSY, C_COMM_BYTES, C_COMM_CALLS

    dev, t, timer = setup()
    t.set_comm(COMM_MEASURED)
    with t.step:
        ev = timer.start()
        dev.clock_ms = 2.0
        timer.stop(C_FWD, ev)
        bwd0 = timer.start()
        holders = []
        for ready in (3.0, 4.0, 5.0):
            dev.clock_ms = ready
            holders.append(timer.comm_bucket(timer.start(), 1000, 1000.0, last=ready == 5.0))
            t.cn += 1
        for holder, end in zip(holders[:2], (4.5, 6.0)):
            dev.clock_ms = end
            holder.append(timer.end_event())
    dev.completed_upto = 10**9
    timer.drain(t)
    assert committed(t) == [] and timer.pending == 1, "a bucket still in flight holds the row"
    timer._pending.clear()

    dev.clock_ms = 0.0
    with t.step:
        ev = timer.start()
        dev.clock_ms = 2.0
        timer.stop(C_FWD, ev)
        bwd0 = timer.start()
        holders = []
        for ready in (3.0, 4.0, 5.0):
            dev.clock_ms = ready
            holders.append(timer.comm_bucket(timer.start(), 1000, 1000.0, last=ready == 5.0))
            t.cn += 1
        for holder, end in zip(holders, (4.5, 6.0, 8.0)):
            dev.clock_ms = end
            holder.append(timer.end_event())
        timer.stop(C_BWD, bwd0)           # backward returns at 8 ms, after the last bucket
        e = timer.start()
        dev.clock_ms = 9.0
        timer.comm_blocking(e, 400, 400.0, 0)
        t.cn += 1
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    (row,) = committed(t)
    ms = 1_000_000
    assert row[C_COMM] == 4 * ms, "3 ms after the last bucket was ready + the blocking 1 ms"
    assert row[C_BWD] == 3 * ms, "backward's 6 ms on the device, less its 3 ms wait"
    assert row[C_COMM_BUSY] == 6 * ms, "3..8 ms (overlapping buckets) and 8..9 ms"
    assert (row[C_COMM_BYTES], row[C_COMM_BUS], row[C_COMM_CALLS]) == (3400, 3400, 4)
    assert row[C_FWD] == 2 * ms and timer.fallbacks == 0


def test_phases_timed_by_callbacks_get_device_times_and_the_optimizer_rule():
    """An integration's split brackets (StepState.begin/end: Lightning's training_step between
    two callbacks, the global optimizer hooks) take the same CUDA-event path as the wrappers,
    including the rule that an optimizer span holding forward/backward is not device time."""
    dev, t, timer = setup()
    with t.step:
        tok = t.begin()
        dev.clock_ms += 2.5
        t.end(C_FWD, tok)
        opt = t.begin()
        inner = t.begin()                 # a backward inside the optimizer's closure
        dev.clock_ms += 4.0
        t.end(C_BWD, inner)
        dev.clock_ms += 1.0
        t.end(C_OPT, opt)
    with t.step:
        opt = t.begin()
        dev.clock_ms += 1.5
        t.end(C_OPT, opt)
    dev.completed_upto = 10**9
    timer.drain(t, final=True)
    first, second = committed(t)
    assert (first[C_FWD], first[C_BWD]) == (2_500_000, 4_000_000)
    assert 0 <= first[C_OPT] < 4_000_000, "host time without the backward inside, not 5 ms"
    assert second[C_OPT] == 1_500_000 and timer.fallbacks == 0
