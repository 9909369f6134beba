"""The bounded-memory statistics: quantile accuracy, sampling, merging, downsampled series."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from traceml_core.aggregator.rankstate import RankState
from traceml_core.aggregator.series import BUCKETS, series_values
from traceml_core.aggregator.sketch import MAX_BUCKETS, QuantileSketch, merge_dense, quantiles_of
from traceml_core.wire.protocol import STEP_COLUMNS

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
    rs = RankState(0, sketch_cap=64)
    rnd = random.Random(7)
    n = 4000
    vals = [rnd.choice((10_000_000, 20_000_000)) for _ in range(n)]  # half 10 ms, half 20 ms
    for seq in range(0, n, 1000):  # batches of 1000 with a cap of 64 sketched values each
        cols = {c: [1] * 1000 for c in STEP_COLUMNS}
        cols["step_ns"] = vals[seq:seq + 1000]
        cols["t_end_ns"] = list(range(seq, seq + 1000))
        rs.ingest_steps({"seq": seq, "n": 1000, "cols": cols, "dropped": 0})
    rs.flush()
    ph = rs.phases["step_ns"]
    assert ph.count == n and ph.sum == sum(vals) and ph.max == 20_000_000  # exact
    total = ph.sketch.total
    assert abs(total - n) <= 4 * 16  # weights stand for the unsampled records
    assert rs.sketched == total
    p25, p75 = ph.sketch.quantiles([0.25, 0.75])
    assert abs(p25 - 1e7) / 1e7 < 0.01 and abs(p75 - 2e7) / 2e7 < 0.01


def test_partly_unmeasured_column_is_exact():
    rs = RankState(0)
    cols = {c: list(range(1, 11)) for c in STEP_COLUMNS}
    cols["input_ns"] = [-1, -1, 5, 5, 5, 5, 5, 5, 5, 5]  # first fetches not measured
    rs.ingest_steps({"seq": 0, "n": 10, "cols": cols, "dropped": 0})
    rs.flush()
    ph = rs.phases["input_ns"]
    assert (ph.count, ph.sum, ph.unmeasured) == (8, 40, 2)
    assert ph.warm_count == 3 and ph.warm_sum == 15  # seq 0..4 are warm-up; two unmeasured


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=60))
def test_series_keeps_every_record_in_a_fixed_number_of_buckets(batch_sizes):
    """Whatever the batching, the buckets hold every record once: counts and sums of the step and
    of each phase add up, the memory and wall-clock maxima survive the merging, and the time
    outside the steps adds up to the rank's own total."""
    rs = RankState(0)
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
        rs.ingest_steps({"seq": seq, "n": n, "cols": cols, "dropped": 0})
        rs.flush()
        seq += n
        totals["step_ns"] += sum(steps)
        totals["forward_ns"] += sum(fwd)
        inputs_measured += sum(1 for v in inp if v >= 0)
        mx = max(mx, max(mems))
    d = rs.to_data()["series"]
    cnt = series_values(d, "step_cnt")
    assert len(cnt) <= BUCKETS and d["width"] * BUCKETS >= seq
    assert sum(cnt) == seq and sum(series_values(d, "step_sum")) == totals["step_ns"]
    assert sum(series_values(d, "phase_sum", "forward_ns")) == totals["forward_ns"]
    assert sum(series_values(d, "phase_cnt", "input_ns")) == inputs_measured
    assert sum(series_values(d, "phase_cnt", "backward_ns")) == 0
    assert max(series_values(d, "mem_max")) == mx and max(series_values(d, "t_end")) == t
    assert sum(series_values(d, "phase_sum", "outside")) == rs.outside_sum
    assert sum(series_values(d, "phase_cnt", "outside")) == rs.outside_n == seq - 1


def test_small_frames_are_pooled_and_give_the_same_statistics_as_one_frame():
    rnd = random.Random(3)
    names = STEP_COLUMNS
    cols = {k: [rnd.randrange(1, 10**8) for _ in range(60)] for k in names}
    cols["t_end_ns"] = sorted(cols["t_end_ns"])
    one, many = RankState(0, sketch_cap=64), RankState(1, sketch_cap=64)
    one.ingest_steps({"seq": 0, "n": 60, "cols": cols, "dropped": 0})
    for i in range(0, 60, 3):  # twenty 3-record frames, computed together
        many.ingest_steps({"seq": i, "n": 3, "cols": {k: v[i:i + 3] for k, v in cols.items()},
                           "dropped": 0})
    assert many.pending_n == 60 and many.phases["step_ns"].count == 0
    a, b = one.to_data(), many.to_data()
    assert a["phases"] == b["phases"] and a["series"] == b["series"] and a["outside"] == b["outside"]


def test_a_malformed_frame_in_a_pool_is_rejected_alone():
    rs = RankState(0)
    good = {k: [5] * 3 for k in STEP_COLUMNS}
    rs.ingest_steps({"seq": 0, "n": 3, "cols": good, "dropped": 0})
    rs.ingest_steps({"seq": 3, "n": 3, "cols": {**good, "forward_ns": [1, "x", 2]}, "dropped": 0})
    rs.ingest_steps({"seq": 6, "n": 3, "cols": good, "dropped": 0})
    assert rs.flush() == 3
    assert rs.received == 6 and rs.rejected == 3 and rs.phases["step_ns"].count == 6


def test_a_pause_between_steps_lands_in_the_bucket_of_the_step_after_it():
    """A batch of 12 steps (a rank's batch of records spans 0.2 s or more) straddles several
    buckets; the 500 ms pause before its 7th step (an evaluation every k steps) is in that
    step's bucket, not spread over the batch: the periodic-work verdict needs to see bursts."""
    rs = RankState(0)
    n, step, pause = 12, 40_000_000, 500_000_000
    t, t_end = 0, []
    for i in range(n):
        t += step + (pause if i == 6 else 1_000_000)
        t_end.append(t)
    cols = {c: [-1] * n for c in STEP_COLUMNS}
    cols.update({"step": list(range(n)), "t_end_ns": t_end, "step_ns": [step] * n})
    rs.ingest_steps({"seq": 0, "n": n, "cols": cols, "dropped": 0})
    rs.flush()
    d = rs.to_data()["series"]
    width = d["width"]
    assert width < n, "the batch must straddle buckets for this test to mean anything"
    out = series_values(d, "phase_sum", "outside")
    assert out[6 // width] >= pause, out
    assert all(v <= width * 1_000_000 for b, v in enumerate(out) if b != 6 // width), out
    assert sum(out) == rs.outside_sum
