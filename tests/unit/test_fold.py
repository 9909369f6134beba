"""Relay folding (issue 17 item 4): a node's relay sends each rank's window of step records as a
``fold`` frame of partial statistics; node 0 adds them. Fed the same real records (recorded from
``examples/ddp_minimal.py`` on two gloo ranks, tests/fixtures/frames), the folded and the unfolded
paths must give the same summary; and the loss accounting of a folded window is that of its
records."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from aggpeers import make_settings
from traceml_core.aggregator.ingest import Ingest
from traceml_core.aggregator.series import series_phases, series_values
from traceml_core.aggregator.state import RunState
from traceml_core.launcher.relayframes import fold_frame, merge_into, steps_frame
from traceml_core.report.summary import build_summary
from traceml_core.rundata import RunData
from traceml_core.wire import fold as layout
from traceml_core.wire.auth import Identity
from traceml_core.wire.frames import validate
from traceml_core.wire.protocol import HEADER, ProtocolError, decode_body, encode

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "frames" / "ddp_minimal_2ranks.msgpack"


def recorded() -> dict[int, list[dict[str, Any]]]:
    """The recorded ``steps`` frames per rank, in order."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for f in msgpack.unpackb(FIXTURE.read_bytes()):
        by_rank.setdefault(f["rank"], []).append(f)
    return by_rank


def recut(frames: list[dict[str, Any]], rnd: random.Random) -> list[dict[str, Any]]:
    """The same records in frames of 1..12 records (a rank that seals batches more often)."""
    out = []
    for f in frames:
        i = 0
        while i < f["n"]:
            m = min(rnd.randint(1, 12), f["n"] - i)
            out.append({"t": "steps", "rank": f["rank"], "seq": f["seq"] + i, "n": m, "dropped": 0,
                        "cols": {k: v[i:i + m] for k, v in f["cols"].items()}})
            i += m
    return out


def cut_windows(frames: list[dict[str, Any]], rnd: random.Random, most: int) -> list[dict[str, Any]]:
    """Merge consecutive frames into windows of 1..``most`` frames, as the relay does per flush."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(frames):
        take = rnd.randint(1, most)
        first = frames[i]
        cur = steps_frame(dict(first, cols={k: list(v) for k, v in first["cols"].items()}))
        for f in frames[i + 1:i + take]:
            assert merge_into(cur, f)
        out.append(cur)
        i += take
    return out


def replay(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], folded: bool) -> RunState:
    """Node 0's real ingest of what one node's relay sends: joins, the windows (folded or not,
    through the wire encoding and the trust boundary's validation), byes."""
    state = RunState(make_settings(tmp_path, nnodes=1, nproc_per_node=len(per_rank)))
    ingest = Ingest(state, lambda _m: None)
    link, ident = object(), Identity("node", 0, -1, "host0", None, nproc=len(per_rank))
    ingest.node_joined(link, ident, time.time())
    send = lambda msg: ingest.node_frame(link, ident, validate("node", decode_body(encode(msg)[HEADER.size:])))  # noqa: E731
    for rank in per_rank:
        send({"t": "join", "rank": rank, "local_rank": rank, "host": "host0", "pid": 100 + rank, "new": True})
    for rank, wins in per_rank.items():
        for w in wins:
            send(fold_frame(w) if folded else w)
            state.flush()  # node 0 computes pending records every second: once per window here
        send({"t": "bye", "rank": rank, "status": "clean", "steps": wins[-1]["seq"] + wins[-1]["n"],
              "dropped": 0, "error": None})
    state.flush()
    return state


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what differs between two replays by construction (wall clock times of
    the replay itself)."""
    drop = {"generated_at", "aggregator_started_at", "joined_at", "last_seen", "closed_at", "at",
            "wall_s", "duration_s", "files", "started_at", "ended_at", "join_delay_s"}

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    return clean(summary)


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += diff(a.get(k), b.get(k), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("cut", ["as recorded", "recut"])
def test_folded_and_unfolded_windows_give_the_same_summary(tmp_path, cut):
    rnd = random.Random(7)
    frames = recorded()
    assert sorted(frames) == [0, 1] and sum(f["n"] for fs in frames.values() for f in fs) == 1200
    if cut == "recut":  # small frames in windows of up to 9 frames: windows straddle series buckets
        per_rank = {r: cut_windows(recut(fs, rnd), rnd, 9) for r, fs in frames.items()}
    else:  # the recorded frames (~40 records each), two per window
        per_rank = {r: cut_windows(fs, rnd, 2) for r, fs in frames.items()}
    plain = replay(tmp_path / "plain", per_rank, folded=False)
    folded = replay(tmp_path / "folded", per_rank, folded=True)
    a, b = plain.to_data(), folded.to_data()
    # the per-rank aggregates node 0 keeps: identical (sketches included)
    for ra, rb in zip(a["ranks"], b["ranks"]):
        assert ra["received"] == rb["received"] == 600
        for key in ("phases", "sums", "mem", "outside", "next_seq", "last_step", "first_t_end",
                    "last_t_end", "sketched", "gaps", "duplicates", "rejected"):
            assert ra[key] == rb[key], key
        sa, sb = ra["series"], rb["series"]
        assert sa["width"] == sb["width"] and sa["used"] == sb["used"]
        # per bucket: counts and maxima exact on both paths; a window straddling buckets had its
        # sums shared out in proportion on the unfolded path, split exactly when folded
        for key in ("step_cnt", "step_max", "mem_max", "t_end"):
            assert series_values(sa, key) == series_values(sb, key), key
        assert sum(series_values(sa, "step_sum")) == sum(series_values(sb, "step_sum"))
        for p in series_phases(sa):
            assert series_values(sa, "phase_cnt", p) == series_values(sb, "phase_cnt", p), p
            assert sum(series_values(sa, "phase_sum", p)) == sum(series_values(sb, "phase_sum", p)), p
    sa, sb = stable(build_summary(RunData.from_checkpoint(a))), stable(build_summary(RunData.from_checkpoint(b)))
    # the summary the user reads: equal, but for per-bucket figures of straddling windows
    # (timeline points: the unfolded path's were proportional shares)
    assert sa["telemetry"] == sb["telemetry"] and sa["telemetry"]["records_received"] == 1200
    different = [d for d in diff(sa, sb) if "timeline" not in d and "series" not in d]
    assert not different, "\n".join(different[:20])
    # ... and the folded path's per-bucket sums are the exact ones, from the records themselves
    for rank, ra in zip(sorted(frames), b["ranks"]):
        w = ra["series"]["width"]
        steps = [x for f in frames[rank] for x in f["cols"]["step_ns"]]
        exact = [float(sum(steps[i:i + w])) for i in range(0, len(steps), w)]
        assert series_values(ra["series"], "step_sum") == exact


def test_a_folded_window_keeps_the_loss_accounting_of_its_records(tmp_path):
    """Gaps, duplicates and the rank's own drop count come through a fold frame as through the
    records: ``seq``/``n``/``dropped`` are the window's."""
    frames = recorded()[0]
    wins = cut_windows(frames, random.Random(1), 1)
    state = RunState(make_settings(tmp_path, nnodes=1, nproc_per_node=2))
    ingest = Ingest(state, lambda _m: None)
    link, ident = object(), Identity("node", 0, -1, "host0", None, nproc=2)
    ingest.node_joined(link, ident, time.time())
    ingest.node_frame(link, ident, validate("node", {"t": "join", "rank": 0, "host": "h", "new": True}))
    sent = 0
    for i, w in enumerate(wins):
        if i == 3:
            continue  # lost on the way: a gap of its records
        f = fold_frame(dict(w, dropped=5 if i > 5 else 0))
        ingest.node_frame(link, ident, validate("node", decode_body(encode(f)[HEADER.size:])))
        sent += w["n"]
        if i == 4:  # the same window again (a resend): duplicates, not new records
            ingest.node_frame(link, ident, validate("node", decode_body(encode(f)[HEADER.size:])))
    rs = state.ranks[0]
    assert rs.received == state.records == sent == 600 - wins[3]["n"]
    assert rs.gaps == wins[3]["n"] and rs.duplicates == wins[4]["n"] and rs.client_dropped == 5
    assert rs.phases["step_ns"].count == sent and rs.next_seq == 600


def test_malformed_fold_frames_are_refused_at_the_trust_boundary():
    w = steps_frame(recorded()[0][0])
    good = fold_frame(w)
    assert validate("node", decode_body(encode(good)[HEADER.size:])) is not None
    assert validate("rank", dict(good)) is None, "a rank never sends fold frames"
    edge = list(layout.unpack(good["v"]))
    edge[layout.H_T_FIRST] = layout.MAX_VALUE  # the limit itself is valid (its top byte is 0x40)
    assert validate("node", dict(good, v=layout.pack(edge)))["v"] == edge
    v0, o0 = list(layout.unpack(good["v"])), list(layout.unpack(good["o"]))
    pack = layout.pack
    bad = [
        {"v": pack(v0[:-1])},                                    # wrong length
        {"v": good["v"][:-1]},                                   # not whole int64s
        {"v": [*v0]},                                            # not packed
        {"v": pack([v0[0], (1 << 62) + 1, *v0[2:]])},            # out of range
        {"v": pack([v0[0], -2, *v0[2:]])},
        {"v": pack([v0[0], -(1 << 56), *v0[2:]])},               # top byte 0xff, yet not -1
        {"v": pack([v0[0], -1, -(1 << 62), *v0[3:]])},
        {"v": pack([v0[0], (1 << 63) - 1, *v0[2:]])},
        {"keys": good["keys"] + b"\0\0"},                       # more sketch keys than counted
        {"n": good["n"] + 1000},                                 # rows do not cover the records
        {"o": pack([*o0, 0])},                                   # o of the wrong length
        {"keys": "x"},
    ]
    for at, value in ((layout.PHASE0 + layout.P_COUNT, good["n"] + 1),   # more measured than records
                      (layout.H_WEIGHT, good["n"] + 1),                   # a sketch weight beyond them
                      (layout.S_G, 3)):                                   # not a power of two
        v = list(v0)
        v[at] = value
        bad.append({"v": pack(v)})
    # a window over several series rows, one of which counts more records than the window has
    multi = fold_frame(steps_frame(recorded()[0][1]))  # records 1..24: three rows of 8
    v = list(layout.unpack(multi["v"]))
    assert v[layout.S_K] > 1
    assert validate("node", decode_body(encode(multi)[HEADER.size:])) is not None
    v[layout.ROWS0 + layout.R_STEP_CNT] = multi["n"] + 1
    for change in bad:
        with pytest.raises(ProtocolError):
            validate("node", dict(good, **change))
    with pytest.raises(ProtocolError):
        validate("node", dict(multi, v=pack(v)))


def test_a_window_whose_sums_do_not_fit_goes_up_as_records(tmp_path):
    """Values near the protocol's limit are valid one by one, but their sum does not fit a fold
    frame: the relay sends that window's records instead, and node 0 takes them."""
    from traceml_core.launcher.relay import Relay

    from traceml_core import limits

    big = limits.STEP_NS.hi  # valid one by one: the column's physical bound
    w = steps_frame(recorded()[0][2])
    n = (1 << 62) // big + 1  # records whose sum passes what a fold frame holds
    w["cols"] = {k: (v * (n // len(v) + 1))[:n] for k, v in w["cols"].items()}
    w["n"] = n
    w["cols"]["forward_ns"] = [big] * n
    with pytest.raises(ValueError):
        fold_frame(w)
    relay = Relay.__new__(Relay)  # only the choice of bytes is exercised here
    relay.fold = True
    msg = decode_body(relay._steps_bytes(w, None)[HEADER.size:])
    assert msg["t"] == "steps" and msg["cols"]["forward_ns"][0] == big
    state = RunState(make_settings(tmp_path, nnodes=1, nproc_per_node=2))
    ingest = Ingest(state, lambda _m: None)
    link, ident = object(), Identity("node", 0, -1, "host0", None, nproc=2)
    ingest.node_joined(link, ident, time.time())
    ingest.node_frame(link, ident, validate("node", {"t": "join", "rank": 0, "host": "h", "new": True}))
    ingest.node_frame(link, ident, validate("node", msg))
    state.flush()
    assert state.ranks[0].phases["forward_ns"].max == big and state.records == w["n"]


def test_rows_copied_into_untouched_buckets_equal_rows_added_field_by_field():
    """Node 0 copies a folded window's series rows that land in buckets not touched yet as bytes
    (the fast path early in a run) and adds the others field by field: both must give the same
    series, through doublings, windows wider than the series' width (its buckets then hold
    several rows), a lost window and a resent one."""
    from traceml_core.aggregator.series import Series

    rnd = random.Random(3)
    one = recorded()[0]
    cols = {k: [x for f in one for x in f["cols"][k]] for k in one[0]["cols"]}
    cols = {k: v * 12 for k, v in cols.items()}  # 7,200 records: the width doubles to 32
    total = len(cols["step_ns"])
    fast, slow = Series(layout.SERIES_PHASES), Series(layout.SERIES_PHASES)
    seq = copied = sent = 0
    prev: dict[str, Any] = {}
    while seq < total:
        n = min(rnd.choice([rnd.randint(1, 12), rnd.randint(1, 12), rnd.randint(40, 140)]), total - seq)
        w = {"t": "steps", "rank": 0, "seq": seq, "n": n, "dropped": 0,
             "cols": {k: v[seq:seq + n] for k, v in cols.items()}}
        seq += n
        if rnd.random() < 0.03:
            continue  # lost on the way
        m = validate("node", decode_body(encode(fold_frame(w))[HEADER.size:]))
        extra = rnd.choice([None, rnd.randint(0, 10**6)])
        g, b0, k = m["v"][layout.S_G], m["v"][layout.S_B0], m["v"][layout.S_K]
        copied += k and fast.width == g and fast.used < b0 + k  # (before the call: an estimate)
        fast.add_rows(w["seq"], n, m["v"], m["o"], extra, m["va"], m["oa"])
        slow.add_rows(w["seq"], n, m["v"], m["o"], extra)
        sent += 1
        if prev and rnd.random() < 0.03:  # a resend of the previous window
            fast.add_rows(prev["seq"], prev["n"], prev["m"]["v"], prev["m"]["o"], None, prev["m"]["va"], prev["m"]["oa"])
            slow.add_rows(prev["seq"], prev["n"], prev["m"]["v"], prev["m"]["o"], None)
        prev = {"seq": w["seq"], "n": n, "m": m}
    assert fast.width >= 32 and copied > 30 and sent > 150
    assert fast.to_data() == slow.to_data()
    counts = series_values(fast.to_data(), "step_cnt")
    assert 0 < sum(counts) < total and fast.overflowed == 0


def test_a_series_sum_past_int64_is_dropped_and_counted_not_raised():
    """Buckets keep int64 nanoseconds; values are checked below their physical bound (2**52 ns)
    at the trust boundary, so only absurd data can overflow a bucket: node 0 drops that update
    and counts it."""
    from traceml_core import limits
    from traceml_core.aggregator.series import Series

    big = limits.STEP_NS.hi
    w = steps_frame(recorded()[0][1])  # records 1..24
    w["n"], w["cols"] = 2, {k: v[:2] for k, v in w["cols"].items()}
    w["cols"]["forward_ns"] = [big] * 2  # one record per series row here
    m = validate("node", decode_body(encode(fold_frame(w))[HEADER.size:]))
    s = Series(layout.SERIES_PHASES)
    for _ in range((1 << 63) // big + 1):  # a row holds one record of 2**52: the last passes 2**63 - 1
        s.add_rows(w["seq"], 2, m["v"], m["o"], None, m["va"], m["oa"])
    assert s.overflowed >= 1 and s.to_data()["overflowed"] == s.overflowed


def test_a_restarted_aggregators_series_merged_with_the_checkpoints_equals_one_series():
    """After an aggregator restart, node 0 merges the checkpoint's series with the new one's
    (aggregator/resume.py): bucket by bucket at the wider width, as if one series had seen every
    window (folded rows are exact per sub-bucket, so the split point cannot show)."""
    from traceml_core.aggregator.series import Series

    rnd = random.Random(5)
    frames = recut(recorded()[1], rnd)
    wins = cut_windows(frames, rnd, 6)
    whole, before, after = (Series(layout.SERIES_PHASES) for _ in range(3))
    for i, w in enumerate(wins):
        m = validate("node", decode_body(encode(fold_frame(w))[HEADER.size:]))
        for s in (whole, before if i < len(wins) // 3 else after):
            s.add_rows(w["seq"], w["n"], m["v"], m["o"], None, m["va"], m["oa"])
    assert before.width < after.width
    merged = Series.from_data(before.to_data()).merged(Series.from_data(after.to_data()))
    assert merged.to_data() == whole.to_data()
    assert sum(series_values(merged.to_data(), "step_cnt")) == 600
