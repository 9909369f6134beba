"""A training thread that blocks right after a step (a hang in a collective, a deadlock in its own
code) still gets its last steps to node 0: the client thread sends what the open batch holds once
the training thread is late to seal it (sdk/recorder.py), without taking the batch from it, and
the frames keep the order of their steps. The real path (a blocked gloo rank, its relay, node 0)
is tests/faults/test_hang_state.py."""

from __future__ import annotations

from traceml_core.sdk.recorder import HEARTBEAT_S, STALL_NS, StepRecorder, fresh_values

S = 1_000_000_000


def _commit(rec: StepRecorder, t_ns: int) -> None:
    v = fresh_values(forward_timed=True, comm=-1)
    v[1] = t_ns          # t_end_ns (the perf_counter clock)
    v[2] = t_ns - 1000   # the step's start
    rec.commit(v, t_ns)


def _frames(rec: StepRecorder) -> list[tuple[int, int, int]]:
    """(seq, n, open) of every queued frame, in the order the client sends them."""
    out = []
    while True:
        b = rec.pop()
        if b is None:
            return out
        f = rec.frame(b)
        assert f["cols"]["step"] == list(range(f["seq"], f["seq"] + f["n"]))
        out.append((f["seq"], f["n"], f["open"]))
        rec.recycle(b)


def test_a_stalled_open_batch_is_sent_and_the_next_frames_follow_in_order():
    rec = StepRecorder(batch_size=1024, seal_interval_s=0.2)
    t = rec.seal_at - int(0.2 * S)
    for i in range(5):
        _commit(rec, t + i * 1000)
    assert rec.pop() is None                       # nothing sealed: the thread is not late yet
    assert not rec.seal_stalled(rec.seal_at + STALL_NS - 1)
    assert rec.seal_stalled(rec.seal_at + STALL_NS)  # late: the five rows go
    assert _frames(rec) == [(0, 5, 0)]
    # the thread comes back: its next commit seals the batch, whose frame holds only the new row
    back = rec.seal_at + STALL_NS + 1000
    for i in range(3):
        _commit(rec, back + i * 1000)
    rec.flush_partial()
    assert _frames(rec) == [(5, 1, 2), (6, 2, 0)]
    assert rec.count == 8 and rec.lost == 0


def test_while_stalled_an_empty_frame_each_second_says_nothing_is_unsent():
    rec = StepRecorder(batch_size=1024, seal_interval_s=0.2)
    t0 = rec.seal_at
    assert not rec.seal_stalled(t0 + 10 * S), "before the first step a silent rank says nothing"
    _commit(rec, t0 - 1)
    late = rec.seal_at + STALL_NS
    assert rec.seal_stalled(late) and _frames(rec) == [(0, 1, 0)]
    assert not rec.seal_stalled(late + int(HEARTBEAT_S * S) - 1)
    assert rec.seal_stalled(late + int(HEARTBEAT_S * S))
    assert _frames(rec) == [(1, 0, 0)]


def test_nothing_overtakes_a_sealed_batch_still_waiting():
    rec = StepRecorder(batch_size=2, seal_interval_s=0.2)
    t = rec.seal_at - int(0.2 * S)
    for i in range(3):                              # rows 0-1 sealed (full), row 2 open
        _commit(rec, t + i * 1000)
    assert not rec.seal_stalled(rec.seal_at + 10 * S)   # the sealed batch goes first
    assert _frames(rec) == [(0, 2, 1)]
    assert rec.seal_stalled(rec.seal_at + 10 * S)
    assert _frames(rec) == [(2, 1, 0)]
