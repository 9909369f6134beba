"""Relay folding (issue 17 item 4, issue 23 item 1): a node's relay sends each rank's window of
step records as a ``fold`` frame carrying the window's statistics (one WindowStats); node 0 merges
them, in every mode (the live modes get the window's last records beside it, in a ``tail``
frame). Fed real records (recorded from ``examples/ddp_minimal.py`` on two gloo ranks,
tests/fixtures/frames), node 0's statistics are those of the records however they were cut into
windows, merged on the way (a group relay) or not; the loss accounting of a window is that of
its records."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Optional

import msgpack
import pytest

from aggpeers import folded, make_settings
from test_stats_window import check_against_reference
from traceml_core.aggregator.adapter import checkpoint_data, rank_data
from traceml_core.aggregator.ingest import Ingest
from traceml_core.codec import decode, encode as encode_record
from traceml_core.aggregator.state import RunState
from traceml_core.launcher.outqueue import OutQueue
from traceml_core.launcher.relayframes import merge_into, steps_frame
from traceml_core.report.summary import build_summary
from traceml_core.statistics import window as layout
from traceml_core.statistics.series import R_STEP_CNT, SERIES_PHASES, OUTSIDE, Series, series_phases, series_values
from traceml_core.statistics.window import MAX_VALUE, WindowStats, pack, unpack
from traceml_core.rundata import RunData
from traceml_core.wire.auth import Identity
from traceml_core.wire.fold import fold_frame, tail_frame
from traceml_core.wire.frames import validate
from traceml_core.wire.protocol import HEADER, STEP_COLUMNS, ProtocolError, decode_body, encode

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


def grouped(wins: list[dict[str, Any]], rnd: random.Random) -> list[dict[str, Any]]:
    """What a group relay forwards for a rank's fold frames: runs of consecutive windows of the
    same sketch weight merged into one window, re-encoded (the rest as they came)."""
    out: list[dict[str, Any]] = []
    pending: Optional[WindowStats] = None
    for w in wins:
        value = validate("node", decode_body(encode(folded(w))[HEADER.size:]))["value"]
        if pending is not None and pending.joins(value) and rnd.random() < 0.7:
            pending.merge(value)
            continue
        if pending is not None:
            out.append(fold_frame(w["rank"], pending))
        pending = WindowStats().merge(value)
    if pending is not None:
        out.append(fold_frame(wins[0]["rank"], pending))
    return out


def replay(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], *, tails: bool = False,
           group: Optional[random.Random] = None, mode: str = "cli") -> RunState:
    """Node 0's real ingest of what one node's relay sends: joins, each window's fold frame (and
    tail frame), through the wire encoding and the trust boundary's validation, byes."""
    state = RunState(make_settings(tmp_path, nnodes=1, nproc_per_node=len(per_rank), mode=mode))
    ingest = Ingest(state, lambda _m: None)
    link, ident = object(), Identity("node", 0, -1, "host0", None, nproc=len(per_rank))
    ingest.node_joined(link, ident, time.time())
    send = lambda msg: ingest.node_frame(link, ident, validate("node", decode_body(encode(msg)[HEADER.size:])))  # noqa: E731
    for rank in per_rank:
        send({"t": "join", "rank": rank, "local_rank": rank, "host": "host0", "pid": 100 + rank, "new": True})
    for rank, wins in per_rank.items():
        if group is not None:
            for f in grouped(wins, group):
                send(f)
        for w in wins if group is None else ():
            send(folded(w))
            if tails:
                send(tail_frame(rank, w["seq"], w["n"], w["cols"]))
        end = wins[-1]["seq"] + wins[-1]["n"]
        send({"t": "bye", "rank": rank, "status": "clean", "steps": end, "dropped": 0, "error": None})
    return state


def stable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what differs between two replays by construction (wall clock times of
    the replay itself)."""
    drop = {"generated_at", "aggregator_started_at", "joined_at", "last_seen", "closed_at", "at",
            "wall_s", "duration_s", "files", "started_at", "ended_at", "join_delay_s", "t_s",
            "goodput"}  # the ledger's window is each replay's own wall clock (test_goodput_ledger.py)

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
def test_windows_merged_on_the_way_or_not_give_the_same_summary(tmp_path, cut):
    """The windows a node's relay sends, merged by a group relay before node 0 or not, in the
    live modes (with their last records) or not: node 0's statistics are those of the records
    (counts, sums, extremes, warm-up split, outside time, every series bucket), and the
    summaries are equal (the sketches too: merged windows keep their keys)."""
    rnd = random.Random(7)
    frames = recorded()
    assert sorted(frames) == [0, 1] and sum(f["n"] for fs in frames.values() for f in fs) == 1200
    if cut == "recut":  # small frames in windows of up to 9 frames: windows straddle series buckets
        per_rank = {r: cut_windows(recut(fs, rnd), rnd, 9) for r, fs in frames.items()}
    else:  # the recorded frames (~40 records each), two per window
        per_rank = {r: cut_windows(fs, rnd, 2) for r, fs in frames.items()}
    plain = replay(tmp_path / "plain", per_rank, tails=True)
    alone = replay(tmp_path / "alone", per_rank)
    merged = replay(tmp_path / "merged", per_rank, group=random.Random(3))
    a, b = checkpoint_data(plain), checkpoint_data(merged)
    assert plain.ranks[0].tail_end > 0 and merged.ranks[0].tail_end == 0  # the live views' tail
    for rank, ra, rb in zip(sorted(frames), a["ranks"], b["ranks"]):
        assert ra["received"] == rb["received"] == 600
        for key in ("phases", "sums", "mem", "outside", "next_seq", "last_step", "first_t_end",
                    "last_t_end", "sketched", "gaps", "duplicates"):
            assert ra[key] == rb[key], key
        cols = {k: [x for f in frames[rank] for x in f["cols"][k]] for k in STEP_COLUMNS}
        check_against_reference(ra, cols)   # every bucket exact, from the records themselves
        check_against_reference(rb, cols)
        assert rb["series"]["width"] >= ra["series"]["width"]  # longer windows: wider buckets
    summary = lambda d: stable(build_summary(decode(RunData, d)))  # noqa: E731
    sa, sb = summary(a), summary(b)
    # the tails the live modes add change nothing of the statistics: the same summary
    assert not diff(sa, summary(checkpoint_data(alone)))
    # merged on the way: the same summary, but for what is read per series bucket (timeline
    # points, the memory trend's medians), at the resolution of the longer windows
    assert sa["telemetry"] == sb["telemetry"] and sa["telemetry"]["records_received"] == 1200
    different = [d for d in diff(sa, sb) if "timeline" not in d and "series" not in d
                 and "mem_peak.trend" not in d]
    assert not different, "\n".join(different[:20])


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
        f = folded(dict(w, dropped=5 if i > 5 else 0))
        ingest.node_frame(link, ident, validate("node", decode_body(encode(f)[HEADER.size:])))
        sent += w["n"]
        if i == 4:  # the same window again (a resend): duplicates, not new records
            ingest.node_frame(link, ident, validate("node", decode_body(encode(f)[HEADER.size:])))
    rs = state.ranks[0]
    assert rs.received == state.records == sent == 600 - wins[3]["n"]
    assert rs.gaps == wins[3]["n"] and rs.duplicates == wins[4]["n"] and rs.client_dropped == 5
    assert encode_record(rank_data(rs))["phases"]["step_ns"]["count"] == sent and rs.next_seq == 600


def test_malformed_fold_frames_are_refused_at_the_trust_boundary():
    w = steps_frame(recorded()[0][0])
    good = folded(w)
    assert validate("node", decode_body(encode(good)[HEADER.size:])) is not None
    assert validate("rank", dict(good)) is None, "a rank never sends fold frames"
    assert validate("node", {"t": "steps", "rank": 0, "seq": 0, "n": 1, "cols": {}}) is None, \
        "a relay sends windows, never records: node 0 checks no steps frame"
    edge = list(unpack(good["v"]))
    edge[layout.H_T_FIRST] = MAX_VALUE  # the limit itself is valid (its top byte is 0x40)
    assert validate("node", dict(good, v=pack(edge)))["value"].field("t_first") == MAX_VALUE
    v0, o0 = list(unpack(good["v"])), list(unpack(good["o"]))
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
    for at, value in ((layout.AT["step_ns.count"], good["n"] + 1),   # more measured than records
                      (layout.H_WEIGHT, good["n"] + 1),              # a sketch weight beyond them
                      (layout.S_G, 3)):                              # not a power of two
        v = list(v0)
        v[at] = value
        bad.append({"v": pack(v)})
    # a window over several series rows, one of which counts more records than the window has
    multi = folded(steps_frame(recorded()[0][1]))  # records 1..24: three rows of 8
    v = list(unpack(multi["v"]))
    assert v[layout.S_K] > 1
    assert validate("node", decode_body(encode(multi)[HEADER.size:])) is not None
    v[layout.ROWS0 + R_STEP_CNT] = multi["n"] + 1
    for change in bad:
        with pytest.raises(ProtocolError):
            validate("node", dict(good, **change))
    with pytest.raises(ProtocolError):
        validate("node", dict(multi, v=pack(v)))


def test_a_window_whose_sums_do_not_fit_goes_up_in_smaller_windows(tmp_path):
    """Values at their column's bound are valid one by one, but their sum does not fit what a
    fold frame holds: the relay sends the records in smaller windows, and node 0 takes them all,
    its sums exact (past 2**64 too: a rank's sums are unbounded integers)."""
    from traceml_core.launcher.relay import Relay

    from traceml_core import limits

    big = limits.STEP_NS.hi  # valid one by one: the column's physical bound
    w = steps_frame(recorded()[0][2])
    n = (1 << 62) // big + 1  # records whose sum passes what a fold frame holds
    w["cols"] = {k: (v * (n // len(v) + 1))[:n] for k, v in w["cols"].items()}
    w["n"] = n
    w["cols"]["forward_ns"] = [big] * n
    with pytest.raises(ValueError):
        WindowStats.of_columns(w["seq"], w["cols"])
    relay = Relay.__new__(Relay)  # only the frames of one window are exercised here
    relay.tail = False
    out = OutQueue()
    relay._window(out, w)
    items = []
    while (item := out.pop()) is not None:
        items.append(item)
    msgs = [decode_body(item.data[HEADER.size:]) for item in items]
    assert len(msgs) > 1 and all(m["t"] == "fold" for m in msgs)
    assert sum(item.records for item in items) == sum(m["n"] for m in msgs) == n
    state = RunState(make_settings(tmp_path, nnodes=1, nproc_per_node=2))
    ingest = Ingest(state, lambda _m: None)
    link, ident = object(), Identity("node", 0, -1, "host0", None, nproc=2)
    ingest.node_joined(link, ident, time.time())
    ingest.node_frame(link, ident, validate("node", {"t": "join", "rank": 0, "host": "h", "new": True}))
    for msg in msgs:
        ingest.node_frame(link, ident, validate("node", msg))
    d = encode_record(rank_data(state.ranks[0]))
    assert d["phases"]["forward_ns"]["max"] == big and state.records == w["n"]
    assert d["phases"]["forward_ns"]["sum"] == n * big > MAX_VALUE


def _series_by_definition(events: list[tuple[dict[str, Any], Optional[int]]], width: int) -> dict:
    """The buckets at ``width`` of the windows merged (each with the outside interval before it,
    or None), record by record."""
    out: dict[str, dict[int, int]] = {k: {} for k in ("step_cnt", "step_sum", "step_max", "mem_max", "t_end")}
    ph: dict[str, tuple[dict[int, int], dict[int, int]]] = {p: ({}, {}) for p in (*SERIES_PHASES, OUTSIDE)}
    for w, extra in events:
        c, seq = w["cols"], w["seq"]
        for i in range(w["n"]):
            b = (seq + i) // width
            s = c["step_ns"][i]
            out["step_cnt"][b] = out["step_cnt"].get(b, 0) + 1
            out["step_sum"][b] = out["step_sum"].get(b, 0) + s
            out["step_max"][b] = max(out["step_max"].get(b, -1), s)
            out["mem_max"][b] = max(out["mem_max"].get(b, -1), c["mem_peak"][i])
            out["t_end"][b] = max(out["t_end"].get(b, -1), c["t_end_ns"][i])
            for p in SERIES_PHASES:
                if c[p][i] >= 0:
                    ph[p][0][b] = ph[p][0].get(b, 0) + 1
                    ph[p][1][b] = ph[p][1].get(b, 0) + c[p][i]
            gap = (c["t_end_ns"][i] - c["t_end_ns"][i - 1] - s) if i else extra
            if gap is not None:
                ph[OUTSIDE][0][b] = ph[OUTSIDE][0].get(b, 0) + 1
                ph[OUTSIDE][1][b] = ph[OUTSIDE][1].get(b, 0) + gap
    return {"out": out, "ph": ph}


def test_rows_copied_into_untouched_buckets_equal_rows_added_bucket_by_bucket():
    """Node 0 copies a window's series rows that land in buckets not touched yet as bytes (the
    fast path early in a run) and adds the others bucket by bucket: the series is the records'
    bucket by bucket, through doublings, windows wider than the series' width (its buckets then
    hold several rows), a lost window and a resent one."""
    rnd = random.Random(3)
    one = recorded()[0]
    cols = {k: [x for f in one for x in f["cols"][k]] for k in one[0]["cols"]}
    span = cols["t_end_ns"][-1] - cols["t_end_ns"][0] + 10**9
    cols = {k: v * 12 for k, v in cols.items()}  # 7,200 records: the width doubles to 32
    total = len(cols["step_ns"])
    cols["t_end_ns"] = [t + (i // 600) * span for i, t in enumerate(cols["t_end_ns"])]  # time goes on
    s = Series()
    seq = sent = 0
    events: list[tuple[dict[str, Any], Optional[int]]] = []
    prev: Optional[tuple[dict[str, Any], WindowStats]] = None
    while seq < total:
        n = min(rnd.choice([rnd.randint(1, 12), rnd.randint(1, 12), rnd.randint(40, 140)]), total - seq)
        w = {"t": "steps", "rank": 0, "seq": seq, "n": n, "dropped": 0,
             "cols": {k: v[seq:seq + n] for k, v in cols.items()}}
        seq += n
        if rnd.random() < 0.03:
            continue  # lost on the way
        value = validate("node", decode_body(encode(folded(w))[HEADER.size:]))["value"]
        extra = rnd.choice([None, rnd.randint(0, 10**6)])
        s.merge(value.series, None, extra, w["seq"])
        events.append((w, extra))
        sent += 1
        if prev and rnd.random() < 0.03:  # a resend of the previous window
            s.merge(prev[1].series)
            events.append((prev[0], None))
        prev = (w, value)
    assert s.width >= 32 and sent > 150 and s.overflowed == 0
    ref = _series_by_definition(events, s.width)
    d = s.to_data()
    for key, by_bucket in ref["out"].items():
        vals = series_values(d, key)
        assert {b: vals[b] for b in by_bucket} == by_bucket, key
    for p, (cnt, tot) in ref["ph"].items():
        got_c, got_s = series_values(d, "phase_cnt", p), series_values(d, "phase_sum", p)
        assert {b: got_c[b] for b in cnt} == cnt and {b: got_s[b] for b in tot} == tot, p
    counts = series_values(d, "step_cnt")
    assert 0 < sum(counts) and sum(counts) == sum(w["n"] for w, _ in events)


def test_a_series_sum_past_int64_is_held_and_counted_not_raised():
    """Buckets keep int64 nanoseconds; values are checked below their physical bound (2**52 ns)
    at the trust boundary, so only absurd data can overflow a bucket: node 0 holds that sum at
    the limit and counts it."""
    from traceml_core import limits

    big = limits.STEP_NS.hi
    w = steps_frame(recorded()[0][1])  # records 1..24
    w["n"], w["cols"] = 2, {k: v[:2] for k, v in w["cols"].items()}
    w["cols"]["forward_ns"] = [big] * 2  # one record per series row here
    m = validate("node", decode_body(encode(folded(w))[HEADER.size:]))
    s = Series()
    for _ in range((1 << 63) // big + 1):  # a row holds one record of 2**52: the last passes 2**63 - 1
        s.merge(m["value"].series)
    assert s.overflowed >= 1 and s.to_data()["overflowed"] == s.overflowed
    assert max(series_values(s.to_data(), "phase_sum", "forward_ns")) == (1 << 63) - 1


def test_a_restarted_aggregators_series_merged_with_the_checkpoints_equals_one_series():
    """After an aggregator restart, node 0's value goes on from the checkpoint's series
    (aggregator/resume.py): bucket by bucket at the wider width, as if one series had seen every
    window (windows' rows are exact per sub-bucket, so the split point cannot show)."""
    rnd = random.Random(5)
    frames = recut(recorded()[1], rnd)
    wins = cut_windows(frames, rnd, 6)
    whole, before, after = Series(), Series(), Series()
    for i, w in enumerate(wins):
        m = validate("node", decode_body(encode(folded(w))[HEADER.size:]))
        for s in (whole, before if i < len(wins) // 3 else after):
            s.merge(m["value"].series)
    assert before.width < after.width
    restarted = Series.from_data(before.to_data())
    restarted.merge(Series.from_data(after.to_data()))
    assert restarted.to_data() == whole.to_data()
    assert sum(series_values(restarted.to_data(), "step_cnt")) == 600
    assert series_phases(restarted.to_data()) == [*SERIES_PHASES, OUTSIDE]
