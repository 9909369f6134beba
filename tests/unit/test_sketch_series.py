"""The bounded-memory statistics: quantile accuracy, sampling, merging, downsampled series."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

import pytest

from traceml_core.launcher.relayframes import merge_into, steps_frame
from traceml_core.statistics.series import BUCKETS, series_values
from traceml_core.statistics.sketch import MAX_BUCKETS, QuantileSketch, merge_dense, quantiles_of
from traceml_core.statistics.window import WindowStats
from traceml_core.wire.frames import validate
from traceml_core.wire.protocol import STEP_COLUMNS, ProtocolError

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0)
REL = 1 / 128 + 1e-6  # a bucket's midpoint is within 1/128 of every value in it


def _true(values, q):
    s = sorted(values)
    return s[int(q * (len(s) - 1))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0), st.integers(min_value=2**10, max_value=2**40)),  # 1 us .. 18 min
                min_size=1, max_size=400),
       st.integers(min_value=1, max_value=64))
def test_quantiles_within_relative_error(values, chunk):
    sk = QuantileSketch()
    for i in range(0, len(values), chunk):
        sk.add(values[i:i + chunk])
    assert sk.total == len(values)
    for q, est in zip(QS, sk.quantiles(QS)):
        want = _true(values, q)
        assert abs(est - want) <= REL * want + 1e-9, (q, est, want)


def test_merge_equals_sketching_everything():
    rnd = random.Random(1)
    a = [int(rnd.lognormvariate(15, 1)) for _ in range(3000)]
    b = [int(rnd.lognormvariate(17, 0.5)) for _ in range(2000)]
    sa, sb, sab = QuantileSketch(), QuantileSketch(), QuantileSketch()
    sa.add(a)
    sb.add(b)
    sab.add(a + b)
    sa.merge(sb)
    assert sa.quantiles(QS) == sab.quantiles(QS)
    lo, counts = merge_dense(sb.lo, sb.counts, sab.lo, sab.counts)
    assert sum(counts) == 2000 + 5000 and quantiles_of(lo, counts, 0, [1.0])[0] > 0


def test_memory_is_capped_and_upper_quantiles_stay_accurate():
    values = [int(1.05 ** k) + 1 for k in range(900)]  # ~19 decades (63 octaves), one per 5 %
    sk = QuantileSketch()
    sk.add(values)
    sk.fold()
    assert len(sk.counts) <= MAX_BUCKETS
    for q in (0.5, 0.9, 0.99):
        want = _true(values, q)
        assert abs(sk.quantiles([q])[0] - want) <= REL * want


def test_weighted_samples_of_large_batches_keep_quantiles_unbiased():
    run = WindowStats.running()
    rnd = random.Random(7)
    n = 4000
    vals = [rnd.choice((10_000_000, 20_000_000)) for _ in range(n)]  # half 10 ms, half 20 ms
    for seq in range(0, n, 1000):  # windows of 1000 with a cap of 64 sketched values each
        cols = {c: [1] * 1000 for c in STEP_COLUMNS}
        cols["step_ns"] = vals[seq:seq + 1000]
        cols["t_end_ns"] = list(range(seq, seq + 1000))
        run.merge(WindowStats.of_columns(seq, cols, cap=64))
    ph = run.to_data()["phases"]["step_ns"]
    assert ph["count"] == n and ph["sum"] == sum(vals) and ph["max"] == 20_000_000  # exact
    sk = run.sketch("step_ns")
    total = sk.total
    assert abs(total - n) <= 4 * 16  # weights stand for the unsampled records
    assert run.field("sketched") == total
    p25, p75 = sk.quantiles([0.25, 0.75])
    assert abs(p25 - 1e7) / 1e7 < 0.01 and abs(p75 - 2e7) / 2e7 < 0.01


def test_partly_unmeasured_column_is_exact():
    cols = {c: list(range(1, 11)) for c in STEP_COLUMNS}
    cols["input_ns"] = [-1, -1, 5, 5, 5, 5, 5, 5, 5, 5]  # first fetches not measured
    ph = WindowStats.of_columns(0, cols).to_data()["phases"]["input_ns"]
    assert (ph["count"], ph["sum"], ph["unmeasured"]) == (8, 40, 2)
    assert ph["warm_count"] == 3 and ph["warm_sum"] == 15  # seq 0..4 are warm-up; two unmeasured


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=60))
def test_series_keeps_every_record_in_a_fixed_number_of_buckets(batch_sizes):
    """Whatever the batching, the buckets hold every record once: counts and sums of the step and
    of each phase add up, the memory and wall-clock maxima survive the merging, and the time
    outside the steps adds up to the rank's own total."""
    run = WindowStats.running()
    rnd = random.Random(len(batch_sizes))
    seq = t = 0
    totals = {"step_ns": 0, "forward_ns": 0}
    inputs_measured = mx = 0
    for n in batch_sizes:
        steps = [rnd.randrange(1, 1000) for _ in range(n)]
        gaps = [rnd.randrange(0, 50) for _ in range(n)]
        t_end = []
        for st_, g in zip(steps, gaps):
            t += st_ + g
            t_end.append(t)
        fwd = [rnd.randrange(0, 500) for _ in range(n)]
        inp = [rnd.choice([-1, rnd.randrange(0, 99)]) for _ in range(n)]  # partly not measured
        mems = [rnd.randrange(0, 10**9) for _ in range(n)]
        cols = {c: [-1] * n for c in STEP_COLUMNS}     # not measured, unless set below
        cols.update({"step": list(range(seq, seq + n)), "t_end_ns": t_end, "step_ns": steps,
                     "input_ns": inp, "forward_ns": fwd, "mem_peak": mems})
        run.merge(WindowStats.of_columns(seq, cols))
        seq += n
        totals["step_ns"] += sum(steps)
        totals["forward_ns"] += sum(fwd)
        inputs_measured += sum(1 for v in inp if v >= 0)
        mx = max(mx, max(mems))
    data = run.to_data()
    d = data["series"]
    cnt = series_values(d, "step_cnt")
    assert len(cnt) <= BUCKETS and d["width"] * BUCKETS >= seq
    assert sum(cnt) == seq and sum(series_values(d, "step_sum")) == totals["step_ns"]
    assert sum(series_values(d, "phase_sum", "forward_ns")) == totals["forward_ns"]
    assert sum(series_values(d, "phase_cnt", "input_ns")) == inputs_measured
    assert sum(series_values(d, "phase_cnt", "backward_ns")) == 0
    assert max(series_values(d, "mem_max")) == mx and max(series_values(d, "t_end")) == t
    assert sum(series_values(d, "phase_sum", "outside")) == data["outside"]["sum"]
    assert sum(series_values(d, "phase_cnt", "outside")) == data["outside"]["count"] == seq - 1


def test_small_frames_are_pooled_and_give_the_same_statistics_as_one_frame():
    """A relay merges a rank's small frames of one flush into one window: its statistics are
    those of one frame holding the same records."""
    rnd = random.Random(3)
    names = STEP_COLUMNS
    cols = {k: [rnd.randrange(1, 10**8) for _ in range(60)] for k in names}
    cols["t_end_ns"] = sorted(cols["t_end_ns"])
    one = WindowStats.of_columns(0, cols)
    window = None
    for i in range(0, 60, 3):  # twenty 3-record frames, merged
        frame = validate("rank", {"t": "steps", "rank": 0, "seq": i, "n": 3,
                                  "cols": {k: v[i:i + 3] for k, v in cols.items()}, "dropped": 0})
        if window is None:
            window = steps_frame(frame)
        else:
            assert merge_into(window, frame)
    assert window is not None and window["n"] == 60
    a, b = one.to_data(), WindowStats.of_columns(0, window["cols"]).to_data()
    assert a["phases"] == b["phases"] and a["series"] == b["series"] and a["outside"] == b["outside"]


def test_a_malformed_frame_in_a_pool_is_rejected_alone():
    """A frame is checked whole where it enters (the relay): a bad one is refused, and the
    good frames around it still count."""
    good = {k: [5] * 3 for k in STEP_COLUMNS}
    frames = [{"t": "steps", "rank": 0, "seq": 0, "n": 3, "cols": good, "dropped": 0},
              {"t": "steps", "rank": 0, "seq": 3, "n": 3, "cols": {**good, "forward_ns": [1, "x", 2]}, "dropped": 0},
              {"t": "steps", "rank": 0, "seq": 6, "n": 3, "cols": good, "dropped": 0}]
    run, rejected = WindowStats.running(), 0
    for f in frames:
        try:
            validate("rank", f)
        except ProtocolError:
            rejected += f["n"]
            continue
        run.merge(WindowStats.of_columns(f["seq"], f["cols"]))
    assert rejected == 3
    assert run.records == 6 and run.to_data()["phases"]["step_ns"]["count"] == 6
    with pytest.raises(ProtocolError):
        validate("rank", frames[1])


def test_a_pause_between_steps_lands_in_the_bucket_of_the_step_after_it():
    """12 steps in one frame (a rank's batch of records spans 0.2 s or more: ~12 steps in the
    live cli mode of the verdict matrix): the 500 ms pause before step 6 (an evaluation every k
    steps) is in that step's bucket, not spread over the frame's: the periodic-work verdict
    needs to see bursts."""
    run = WindowStats.running()
    n, step, pause = 12, 40_000_000, 500_000_000
    t, t_end = 0, []
    for i in range(n):
        t += step + (pause if i == 6 else 1_000_000)
        t_end.append(t)
    cols = {c: [-1] * n for c in STEP_COLUMNS}
    cols.update({"step": list(range(n)), "t_end_ns": t_end, "step_ns": [step] * n})
    run.merge(WindowStats.of_columns(0, cols))
    data = run.to_data()
    d = data["series"]
    width = d["width"]
    out = series_values(d, "phase_sum", "outside")
    assert out[6 // width] >= pause, out
    assert all(v <= width * 1_000_000 for b, v in enumerate(out) if b != 6 // width), out
    assert sum(out) == data["outside"]["sum"]
