"""The window statistics value (traceml_core/statistics/window.py): one mergeable value that relays
build from records and everything else only merges. Checked against the statistics computed by
definition from the raw records, whatever the cut into windows and the order of merging, through
the wire and through a checkpoint."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from traceml_core.statistics.columns import DURATION_COLUMNS, STEP_COLUMNS, SUM_COLUMNS
from traceml_core.statistics.series import (
    BUCKETS, OUTSIDE, SERIES_PHASES, SPAN, Series, run_buckets, series_phases, series_values,
)
from traceml_core.statistics.sketch import QuantileSketch
from traceml_core.statistics.window import (
    MAX_VALUE, SKETCH_CAP, WARMUP_STEPS, WindowStats, fold_len, pack, unpack,
)
from traceml_core.statistics import window as layout

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "frames" / "ddp_minimal_2ranks.msgpack"


def recorded(rank: int = 0) -> dict[str, list[int]]:
    """Every record of one rank of a real 2-rank DDP run (examples/ddp_minimal.py), as columns."""
    frames = [f for f in msgpack.unpackb(FIXTURE.read_bytes()) if f["rank"] == rank]
    return {k: [x for f in frames for x in f["cols"][k]] for k in STEP_COLUMNS}


def synthetic(n: int, rnd: random.Random, seq: int = 0) -> dict[str, list[int]]:
    """Records with every kind of column, some phases partly or never measured."""
    t, cols = 10**18, {k: [] for k in STEP_COLUMNS}
    for i in range(n):
        step = rnd.randrange(1, 10**7)
        t += step + rnd.randrange(0, 10**6)
        cols["step"].append(seq + i)
        cols["t_end_ns"].append(t)
        cols["step_ns"].append(step if rnd.random() > 0.03 else -1)
        cols["input_ns"].append(rnd.choice([-1, rnd.randrange(0, 10**6)]))
        cols["forward_ns"].append(rnd.randrange(0, step))
        cols["backward_ns"].append(rnd.randrange(0, step))
        cols["optimizer_ns"].append(0)
        cols["h2d_ns"].append(-1)
        cols["mem_peak"].append(rnd.randrange(10**8, 10**9))
        cols["comm_ns"].append(rnd.randrange(0, 10**5))
        for c in SUM_COLUMNS:
            cols[c].append(rnd.choice([-1, rnd.randrange(0, 10**9)]))
    return cols


def cut(cols: dict[str, list[int]], sizes: list[int]) -> list[tuple[int, dict[str, list[int]]]]:
    """The records cut into consecutive windows of the given sizes: (seq, columns)."""
    out, seq, n = [], 0, len(cols["step"])
    for m in sizes:
        if seq >= n:
            break
        m = min(m, n - seq)
        out.append((seq, {k: v[seq:seq + m] for k, v in cols.items()}))
        seq += m
    if seq < n:
        out.append((seq, {k: v[seq:] for k, v in cols.items()}))
    return out


def reference(cols: dict[str, list[int]], width: int) -> dict[str, Any]:
    """The statistics by definition, one record at a time (no window anywhere)."""
    n = len(cols["step"])
    out: dict[str, Any] = {"phases": {}, "sums": {}}
    for c in DURATION_COLUMNS:
        vals = [(i, x) for i, x in enumerate(cols[c]) if x >= 0]
        warm = [x for i, x in vals if i < WARMUP_STEPS]
        out["phases"][c] = {"count": len(vals), "sum": sum(x for _, x in vals),
                            "max": max((x for _, x in vals), default=-1),
                            "min": min((x for _, x in vals), default=-1),
                            "warm_count": len(warm), "warm_sum": sum(warm), "unmeasured": n - len(vals)}
    for c in SUM_COLUMNS:
        vals = [(i, x) for i, x in enumerate(cols[c]) if x >= 0]
        warm = [x for i, x in vals if i < WARMUP_STEPS]
        out["sums"][c] = {"count": len(vals), "sum": sum(x for _, x in vals),
                          "max": max((x for _, x in vals), default=-1),
                          "warm_count": len(warm), "warm_sum": sum(warm)}
    mem = [x for x in cols["mem_peak"] if x >= 0]
    out["mem"] = {"count": len(mem), "sum": sum(mem), "max": max(mem, default=-1)}
    t, s = cols["t_end_ns"], cols["step_ns"]
    gaps = {i: t[i] - t[i - 1] - s[i] for i in range(1, n) if s[i] >= 0}
    out["outside"] = {"sum": sum(gaps.values()), "count": len(gaps)}
    nb = (n - 1) // width + 1
    b: dict[str, list] = {"step_cnt": [0] * nb, "step_sum": [0] * nb, "step_max": [-1] * nb,
                          "mem_max": [-1] * nb, "t_end": [-1] * nb}
    ph = {p: ([0] * nb, [0] * nb) for p in (*SERIES_PHASES, OUTSIDE)}
    for i in range(n):
        k = i // width
        if s[i] >= 0:
            b["step_cnt"][k] += 1
            b["step_sum"][k] += s[i]
            b["step_max"][k] = max(b["step_max"][k], s[i])
        b["mem_max"][k] = max(b["mem_max"][k], cols["mem_peak"][i])
        b["t_end"][k] = max(b["t_end"][k], t[i])
        for p in SERIES_PHASES:
            if cols[p][i] >= 0:
                ph[p][0][k] += 1
                ph[p][1][k] += cols[p][i]
        if i in gaps:
            ph[OUTSIDE][0][k] += 1
            ph[OUTSIDE][1][k] += gaps[i]
    out["series"] = b, ph
    return out


def check_against_reference(d: dict[str, Any], cols: dict[str, list[int]]) -> None:
    ref = reference(cols, d["series"]["width"])
    for c in DURATION_COLUMNS:
        got = {k: v for k, v in d["phases"][c].items() if k != "sketch"}
        assert got == ref["phases"][c], c
    outside = {k: v for k, v in d["outside"].items() if k != "sketch"}
    assert d["sums"] == ref["sums"] and d["mem"] == ref["mem"] and outside == ref["outside"]
    b, ph = ref["series"]
    s = d["series"]
    for key, vals in b.items():
        assert series_values(s, key) == vals, key
    for p, (cnt, tot) in ph.items():
        assert series_values(s, "phase_cnt", p) == cnt, p
        assert series_values(s, "phase_sum", p) == tot, p
    assert d["first_t_end"] == cols["t_end_ns"][0] and d["last_t_end"] == cols["t_end_ns"][-1]
    assert d["last_step"] == cols["step"][-1]


def merged(windows: list[tuple[int, dict[str, list[int]]]], **kw: Any) -> WindowStats:
    run = WindowStats.running(**kw)
    for seq, c in windows:
        run.merge(WindowStats.of_columns(seq, c))
    return run


@pytest.mark.parametrize("source", ["recorded", "synthetic"])
def test_merged_windows_equal_the_statistics_of_every_record(source):
    """Whatever the cut into windows (one record, a few, a whole second of records, all of them),
    node 0's running value equals the statistics computed by definition from the records:
    counts, sums, extremes, the warm-up split, the time outside the steps, every series bucket."""
    rnd = random.Random(11)
    cols = recorded() if source == "recorded" else synthetic(900, rnd)
    for sizes in ([1] * 40 + [7] * 30, [rnd.randint(1, 12) for _ in range(200)],
                  [rnd.randint(40, 140) for _ in range(40)], [10**6]):
        run = merged(cut(cols, sizes))
        d = run.to_data()
        check_against_reference(d, cols)
        assert d["series"]["used"] <= BUCKETS


def test_sketches_of_windows_within_the_cap_equal_one_sketch_of_every_record():
    """At most SKETCH_CAP records per phase and window, every record is sketched: the merged
    sketches are those of all the records."""
    cols = recorded(1)
    run = merged(cut(cols, [SKETCH_CAP] * 100)).to_data()
    for c in DURATION_COLUMNS:
        sk = QuantileSketch()
        vals = [x for x in cols[c] if x >= 0]
        if vals:
            sk.add(vals)
        assert run["phases"][c]["sketch"] == sk.to_data(), c
    assert run["sketched"] == len(cols["step_ns"])


def test_large_windows_are_sketched_by_a_weighted_sample():
    """Beyond the cap a systematic sample, each key standing for ``stride`` records: the sketch
    still counts (about) every record and its quantiles stay within the bucket accuracy."""
    rnd = random.Random(7)
    n = 4000
    cols = synthetic(n, rnd)
    cols["step_ns"] = [rnd.choice((10_000_000, 20_000_000)) for _ in range(n)]
    run = merged(cut(cols, [1000] * 4))
    sk = run.sketches[0]
    assert abs(sk.total - n) <= 4 * (1000 // SKETCH_CAP + 1) and run.field("sketched") == sk.total
    p25, p75 = sk.quantiles([0.25, 0.75])
    assert abs(p25 - 1e7) / 1e7 < 0.01 and abs(p75 - 2e7) / 2e7 < 0.01
    d = run.to_data()
    assert d["phases"]["step_ns"]["count"] == n and d["phases"]["step_ns"]["sum"] == sum(cols["step_ns"])


def at_width(d: dict[str, Any], width: int) -> dict[str, Any]:
    """A value's plain data with its series regrouped to ``width`` (a coarser power of two)."""
    s = Series.from_data(d["series"])
    s.widen(width)
    return dict(d, series=s.to_data())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=3, max_size=40), st.integers(0, 2**16))
def test_merging_is_associative(sizes, salt):
    """A group relay that merges a rank's windows before node 0 merges them gives node 0 the same
    value: (a + b) + c == a + (b + c), for every statistic, sketches included. (Only the series'
    resolution may differ: a longer window's rows are wider, so node 0's buckets may start wider;
    at the coarser of the two widths the buckets are equal.)"""
    rnd = random.Random(salt)
    cols = synthetic(sum(sizes), rnd)
    wins = [WindowStats.of_columns(seq, c) for seq, c in cut(cols, sizes)]
    flat = WindowStats.running()
    for w in wins:
        flat.merge(w)
    grouped = WindowStats.running()
    pending = None
    sent = 0

    def send(g: WindowStats) -> None:
        if rnd.random() < 0.5:
            g.count_sketches()  # as a group relay forwards them (else as a node relay does)
        # through the wire
        grouped.merge(WindowStats.from_wire(g.seq, g.records, g.to_wire()))

    for w in wins:
        if pending is not None and pending.joins(w) and rnd.random() < 0.7:
            pending.merge(w)
            continue
        if pending is not None:
            send(pending)
            sent += 1
        pending = WindowStats().merge(w)
    send(pending)
    a, b = grouped.to_data(), flat.to_data()
    width = max(a["series"]["width"], b["series"]["width"])
    assert a["series"]["width"] >= b["series"]["width"]
    assert at_width(a, width) == at_width(b, width)
    check_against_reference(a, cols)


def test_a_window_through_the_wire_is_the_same_value():
    rnd = random.Random(2)
    cols = synthetic(300, rnd)
    for seq, c in cut(cols, [1, 3, 8, 9, 17, 64, 198]):
        w = WindowStats.of_columns(seq, c)
        fields = w.to_wire()
        back = WindowStats.from_wire(seq, len(c["step"]), fields)
        assert back.to_data() == w.to_data()
        k = unpack(fields["v"])[layout.S_K]
        assert len(unpack(fields["v"])) == fold_len(k) and k != 1 and k <= SPAN + 1
        w.count_sketches()  # counted, as a group relay sends them: the same value
        assert WindowStats.from_wire(seq, len(c["step"]), w.to_wire()).to_data() == back.to_data()


def test_a_checkpoint_round_trip_and_a_restart_merge_equal_one_value():
    """A restarted aggregator merges its checkpoint's value (plain data) with the one it built
    since: the same as one value over every window, the interval across the restart included."""
    cols = recorded()
    wins = cut(cols, [random.Random(4).randint(1, 30) for _ in range(80)])
    whole = merged(wins)
    third = len(wins) // 3
    before, after = merged(wins[:third]), merged(wins[third:])
    data = before.to_data()
    data.update(received=before.records, next_seq=before.end)
    assert WindowStats.from_data(data).to_data() == before.to_data()
    combined = WindowStats.from_data(data).merge(after)
    assert combined.to_data() == whole.to_data()
    assert sum(series_values(combined.to_data()["series"], "step_cnt")) == 600


def test_window_sums_stay_within_int64_and_a_ranks_sums_are_exact_past_2_64():
    """Values at their column's bound are valid one by one: a window whose sums would pass what
    travels as int64 is refused (its relay cuts it, test_fold.py), a group relay does not join
    windows past it, and a rank's running value adds them exactly, however far: a checkpoint
    stores it exactly (traceml_core.rundir)."""
    from traceml_core import limits
    from traceml_core.rundir import load_checkpoint, pack_checkpoint

    big = limits.BYTES.hi  # 1 PiB of memory in a step: valid
    win = {k: (v * 4)[:2400] for k, v in recorded().items()}  # 2,400 records of 1 PiB: 2**61.2
    win["mem_peak"] = [big] * 2400
    w = WindowStats.of_columns(0, win)
    assert w.field("mem_peak.sum") == 2400 * big < MAX_VALUE
    w2 = WindowStats.of_columns(2400, {k: v[:] for k, v in win.items()})
    assert not w.joins(w2), "2 x 2,400 x 2**50 passes 2**62: a group relay sends them apart"
    with pytest.raises(ValueError):
        WindowStats.of_columns(0, {k: v * 2 for k, v in win.items()})
    run = WindowStats.running()
    for i in range(10):
        run.merge(WindowStats.from_wire(i * 2400, 2400, WindowStats.of_columns(i * 2400, win).to_wire()))
    d = run.to_data()
    assert d["mem"]["sum"] == 24000 * big > 1 << 64 and d["mem"]["count"] == 24000
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "aggregate.state"
        path.write_bytes(pack_checkpoint({"ranks": [dict(d, received=24000, next_seq=24000)]}, final=False))
        again = load_checkpoint(path)["state"]["ranks"][0]
    assert again["mem"]["sum"] == 24000 * big
    assert WindowStats.from_data(again).to_data()["mem"] == d["mem"]


def test_malformed_windows_are_refused():
    c = {k: v[:24] for k, v in recorded().items()}
    w = WindowStats.of_columns(1, {k: v[1:24] for k, v in c.items()})  # records 1..23: rows of 8
    fields = w.to_wire()
    v, o, keys = fields["v"], fields["o"], fields["keys"]
    n = 23
    WindowStats.from_wire(1, n, fields)
    v0, o0 = list(unpack(v)), list(unpack(o))
    assert v0[layout.S_K] > 1
    bad = [
        dict(v=pack(v0[:-1])), dict(v=v[:-1]), dict(v=[*v0]), dict(o=pack([*o0, 0])), dict(keys="x"),
        dict(keys=keys + b"\0\0"), dict(n=n + 1000), dict(n=n - 1),
    ]
    for at, value in ((layout.H_T_FIRST, MAX_VALUE + 1), (layout.H_T_FIRST, -2),
                      (layout.H_T_FIRST, -(1 << 56)), (layout.H_T_FIRST, (1 << 63) - 1),
                      (layout.AT["step_ns.count"], n + 1),            # more measured than records
                      (layout.AT["forward_ns.unmeasured"], 1),        # measured + not != records
                      (layout.H_WEIGHT, n + 1),                       # a sketch weight beyond them
                      (layout.AT["sketched"], 7),                     # not keys x weight
                      (layout.S_G, 3),                                # not a power of two
                      (layout.ROWS0 + 0, n + 1)):                     # a row counts too many
        vv = list(v0)
        vv[at] = value
        bad.append(dict(v=pack(vv)))
    for change in bad:
        args = dict(v=v, o=o, keys=keys) | change
        with pytest.raises(ValueError):
            WindowStats.from_wire(1, args.pop("n", n), args)
    edge = list(v0)
    edge[layout.H_T_FIRST] = MAX_VALUE  # the limit itself is valid
    assert WindowStats.from_wire(1, n, dict(fields, v=pack(edge))).field("t_first") == MAX_VALUE
    # counted sketches (a group relay's): buckets out of range, more counts than records
    w.count_sketches()
    counted = w.to_wire()
    WindowStats.from_wire(1, n, counted)
    heads = list(unpack(counted["sk"]))
    for at, value in ((0, 1 << 15), (2, 10 * n), (1, heads[1] + 1)):
        hh = list(heads)
        hh[at] = value
        with pytest.raises(ValueError):
            WindowStats.from_wire(1, n, dict(counted, sk=pack(hh)))


def test_series_of_very_large_runs_keep_fewer_buckets_and_merge_wider():
    """Node 0 keeps fewer buckets per rank for very large runs (its memory); windows merge into
    such a series exactly, at a wider width."""
    assert run_buckets(16384) == BUCKETS and run_buckets(65536) == 64 and run_buckets(10**7) == 32
    cols = synthetic(2000, random.Random(5))
    run = merged(cut(cols, [10] * 200), buckets=64)
    d = run.to_data()
    assert d["series"]["used"] <= 64 and d["series"]["width"] == 32
    check_against_reference(d, cols)


def test_series_merge_of_two_runs_aligns_widths():
    a, b = Series(), Series()
    cols = synthetic(3000, random.Random(9))
    for seq, c in cut(cols, [13] * 300)[:80]:
        a.merge(WindowStats.of_columns(seq, c).series)
    for seq, c in cut(cols, [13] * 300)[80:]:
        b.merge(WindowStats.of_columns(seq, c).series)
    assert a.width < b.width
    whole = merged(cut(cols, [13] * 300)).series
    a.merge(b)
    ad, wd = a.to_data(), whole.to_data()
    for key in ("step_cnt", "step_sum", "step_max", "mem_max"):
        assert series_values(ad, key) == series_values(wd, key)
    assert series_phases(ad) == [*SERIES_PHASES, OUTSIDE]



def test_the_statistics_package_never_shadows_the_sdks_names():
    """``traceml.stats()`` is the SDK's (traceml_core/__init__.py); a subpackage of the same name
    would replace it once imported (the wire protocol imports the statistics' columns)."""
    import traceml_core
    import traceml_core.statistics.window  # noqa: F401
    import traceml_core.wire.protocol  # noqa: F401

    pkg = Path(traceml_core.__file__).parent
    for name in traceml_core._SDK_NAMES:
        assert not (pkg / name).exists() and not (pkg / f"{name}.py").exists(), name
    assert callable(traceml_core.stats) and traceml_core.stats.__module__ == "traceml_core.sdk.api"


def test_the_gaps_between_steps_are_sketched_after_the_warm_up():
    """The time between steps as a distribution (what tells a pause every k steps from time
    spread over every step): one unsampled window's sketch holds every steady gap exactly (those
    after the warm-up steps, whose first intervals are one-off set-up), each in its bucket."""
    n = 60
    step = [10_000_000] * n
    gap = [0] + [40_000_000 if i % 10 == 0 else 200_000 for i in range(1, n)]
    gap[1] = 2_000_000_000          # a set-up pause inside the warm-up: not sketched
    t, now = [], 0
    for i in range(n):
        now += gap[i] + step[i]
        t.append(now)
    cols = {"step": list(range(n)), "t_end_ns": t, "step_ns": step}
    for c in DURATION_COLUMNS:
        cols.setdefault(c, [-1] * n)
    for c in (*SUM_COLUMNS, "mem_peak"):
        cols.setdefault(c, [-1] * n)
    run = WindowStats.running()
    run.merge(WindowStats.of_columns(0, cols, cap=n))
    sk = run.sketch("outside")
    steady = gap[WARMUP_STEPS:]
    assert sk.total == len(steady) == n - WARMUP_STEPS
    n_lo, _, n_hi, s_hi = sk.split(10_000_000)
    assert (n_lo, n_hi) == (len(steady) - 5, 5)            # steps 10, 20, 30, 40, 50
    assert abs(s_hi - 5 * 40_000_000) <= 0.1 * 5 * 40_000_000   # 1/4-octave buckets: within ~9 %
    # through the wire and a checkpoint, the same
    again = WindowStats.from_data(run.to_data())
    assert again.sketch("outside").split(10_000_000)[2] == 5

    # sampled windows (64 records, a sample of 16 per phase): the longest gaps are kept exactly,
    # so the pauses are all there, whatever the windows' edges; through a group relay's merge too
    for sizes in ([64] * 4, [17, 64, 3, 50, 60, 46]):
        n = sum(sizes)
        step = [10_000_000] * n
        gap = [0] + [40_000_000 if i % 10 == 0 else 200_000 + i for i in range(1, n)]
        t, now = [], 0
        for i in range(n):
            now += gap[i] + step[i]
            t.append(now)
        cols = {"step": list(range(n)), "t_end_ns": t, "step_ns": step}
        for c in (*DURATION_COLUMNS, *SUM_COLUMNS, "mem_peak"):
            cols.setdefault(c, [-1] * n)
        wins = [WindowStats.of_columns(seq, c) for seq, c in cut(cols, sizes)]
        flat, grouped = WindowStats.running(), WindowStats.running()
        for w in wins:
            flat.merge(w)
        pending = WindowStats()
        for w in wins:
            pending.merge(w)
        grouped.merge(WindowStats.from_wire(pending.seq, pending.records, pending.to_wire()))
        pauses = sum(1 for i in range(WARMUP_STEPS, n) if gap[i] > 10_000_000)
        for run in (flat, grouped):
            n_lo, _, n_hi, _ = run.sketch("outside").split(10_000_000)
            assert n_hi == pauses, (sizes, n_hi, pauses)
            assert abs(n_lo - (n - WARMUP_STEPS - pauses)) <= 0.1 * n, (sizes, n_lo)


def test_median_of_a_window_is_its_sketchs_within_the_exact_extremes():
    """The live views' recent medians (aggregator/snapshot.py): read off a window's own keys, the
    same answer as its counted sketch, and steps of one length give exactly that length."""
    rnd = random.Random(5)
    for _ in range(200):
        n = rnd.randint(1, 64)
        cols = {c: [rnd.choice((-1, 0, rnd.randint(1, 10**9))) for _ in range(n)] for c in STEP_COLUMNS}
        cols["step"], cols["t_end_ns"] = list(range(n)), [10**18 + i * 10**6 for i in range(n)]
        keys, counted = WindowStats.of_columns(0, cols, cap=64), WindowStats.of_columns(0, cols, cap=64)
        counted.count_sketches()
        for c in DURATION_COLUMNS:
            measured = sorted(v for v in cols[c] if v >= 0)
            m = keys.median(c)
            assert m == counted.median(c)
            assert (m is None) == (not measured)
            if measured:
                assert measured[0] <= m <= measured[-1] and abs(m - measured[(len(measured) - 1) // 2]) <= 0.008 * m
    const = {c: [40_000_000] * 64 for c in STEP_COLUMNS}
    const["step"], const["t_end_ns"] = list(range(64)), [10**18 + i * 10**6 for i in range(64)]
    assert WindowStats.of_columns(0, const, cap=64).median("step_ns") == 40_000_000  # the sketch alone: 40.1 ms
