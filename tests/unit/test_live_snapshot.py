"""The ``snapshot`` request of a real aggregator process, and what the live views make of it.

Ranks are real TCP peers speaking the wire protocol (tests/unit/aggpeers.py); the snapshot
travels over the launcher's real control link. No torch: these run in about a second.
"""

from __future__ import annotations

import re
import time

import pytest

from aggpeers import RankPeer
from traceml_core.livesnapshot import LiveSnapshot
from traceml_core.rundata import GpuData, Running, SystemData
from traceml_core.views.feed import LiveFeed
from traceml_core.views.snapshot import STALE_MIN_S, read_snapshot
from traceml_core.views.terminal import render, status_line


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def snap(handle, **req):
    return handle.snapshot({"series": False, "verdict": False, **req}, timeout=3.0)


def test_snapshot_describes_each_rank_from_its_recent_steps(rig):
    h = rig(nproc_per_node=3, mode="cli")
    fast, slow = RankPeer(h.port, 0), RankPeer(h.port, 1)
    fast.steps(40, step_ms=10, forward_ms=3, mem=200 << 20)
    slow.steps(40, step_ms=40, forward_ms=30, mem=300 << 20)
    frame = wait_for(lambda: (f := snap(h, series=True)) and len(f.ranks) == 2 and all(r.received == 40 for r in f.ranks) and f)
    by = {r.rank: r for r in frame.ranks}
    assert by[0].recent.ms["forward"] == pytest.approx(3.0, rel=0.01)
    assert by[1].recent.ms["forward"] == pytest.approx(30.0, rel=0.01)
    assert by[1].recent.steps_per_s == pytest.approx(25.0, rel=0.05)  # from t_end spacing
    assert by[1].recent.mem_peak == 300 << 20
    series = by[0].series  # the whole run so far, in buckets of `width` steps
    assert (len(series.step_ms) - 1) * series.width < 40 <= len(series.step_ms) * series.width
    assert series.step_ms == [pytest.approx(10.0)] * len(series.step_ms)

    st = read_snapshot(frame)
    assert [r.state for r in st.ranks] == ["ok", "ok", "waiting"]  # rank 2 never connected
    text = status_line(st, (True, 0.0, None))
    assert "step 40" in text and "ranks 2/3 running, 1 waiting" in text and "worst rank 1 40.0" in text
    assert "steps/s per rank" in text  # a per-rank median, never the sum over ranks
    rate = float(re.search(r"([\d.]+) steps/s per rank", text).group(1))
    assert rate <= 1.1 * 100  # the fast rank's 100 steps/s at most, not 125 summed
    # no progress since the previous line: said, not repeated as news
    again = status_line(st, (True, 0.0, None), prev_step=40, since_s=30)
    assert "step 40 (no new step in 30 s)" in again
    # the table fits an 80- and a 100-column terminal: columns dropped whole, no number cut
    for width, height in ((80, 24), (100, 30)):
        lines = rendered(render(st, (True, 0.0, None), width, height), width)
        assert all(len(ln) <= width for ln in lines), lines
        table = "\n".join(lines)
        assert "\u2026" not in table and "..." not in table.split("so far")[0], table
        head = next(ln for ln in lines if ln.lstrip().startswith("rank"))
        assert {"rank", "step", "status", "own"} <= set(head.replace("step ms", "step_ms").split()), head
        rows = [ln.split() for ln in lines if re.match(r"^\s*[012]\s", ln)]
        assert [r[0] for r in rows] == ["0", "1", "2"]
        assert "40" in rows[0] and "10.0" in rows[0] and "40.0" in rows[1], rows
        assert "too narrow for:" in table  # says what it left out
    fast.close()
    slow.close()


def test_rate_per_rank_is_timed_by_the_ranks_steps_not_by_their_arrival(rig):
    # the relay delivers records in bursts: 40 steps of 10 ms arriving within a few ms of the
    # previous snapshot are 100 steps/s, not thousands (CI printed 104.5 steps/s for 10.7 ms steps)
    h = rig(nproc_per_node=1, mode="cli")
    peer = RankPeer(h.port, 0)
    t0 = time.time_ns()
    peer.steps(20, step_ms=10, t0_ns=t0)
    first = wait_for(lambda: (f := snap(h)) and f.ranks and f.ranks[0].received == 20 and f)
    peer.steps(40, step_ms=10, t0_ns=t0)
    second = wait_for(lambda: (f := snap(h)) and f.ranks[0].received == 60 and f)
    st = read_snapshot(second, prev=first)
    assert st.ranks[0].rate == pytest.approx(100.0, rel=0.01)
    line = status_line(st, (True, 0.0, None))
    assert "100.0 steps/s per rank" in line, line
    # no new step by the next snapshot: 0 now, not the old rate
    third = snap(h)
    assert read_snapshot(third, prev=second).ranks[0].rate == 0.0
    peer.close()


def rendered(renderable, width: int) -> list[str]:
    from rich.console import Console

    con = Console(width=width, record=True, color_system=None, force_terminal=False)
    con.print(renderable)
    return con.export_text().splitlines()


def test_a_rank_whose_connection_drops_is_shown_gone_and_the_age_keeps_growing(rig):
    h = rig(mode="cli")  # the raw tail for live views is kept in cli/dashboard modes
    a, b = RankPeer(h.port, 0), RankPeer(h.port, 1)
    a.steps(10)
    b.steps(10)
    wait_for(lambda: snap(h).records == 20)
    b.close()  # killed: no bye
    frame = wait_for(lambda: (f := snap(h)) and not {r.rank: r for r in f.ranks}[1].connected and f)
    st = read_snapshot(frame)
    r1 = st.ranks[1]
    assert r1.state == "gone" and r1.stale
    assert r1.note.startswith("connection lost without a bye, no data for")
    assert st.ranks[0].state == "ok"
    # no new snapshot arrives: the picture still ages (never frozen on the last good numbers)
    later = st.aged(st.read_at + STALE_MIN_S + 9)
    assert later.ranks[0].state == "stale" and later.ranks[0].note.startswith("no data for 1")
    assert "no data for 1" in later.ranks[1].note
    line = status_line(later, (True, 0.1, None))
    assert "rank 0: no data for" in line and "rank 1: connection lost" in line
    a.close()


def test_a_rank_that_said_bye_has_ended_not_stale(rig):
    h = rig(mode="cli")  # the raw tail for live views is kept in cli/dashboard modes
    a = RankPeer(h.port, 0)
    a.steps(5)
    a.bye("error", error="Traceback...\nRuntimeError: CUDA out of memory")
    frame = wait_for(lambda: (f := snap(h)) and f.ranks and f.ranks[0].bye and f)
    r0 = read_snapshot(frame).aged(time.monotonic() + 60).ranks[0]
    assert r0.state == "ended" and not r0.stale
    assert r0.note == "ended error: RuntimeError: CUDA out of memory"
    a.close()


def test_snapshot_requests_leave_the_control_link_working_for_finish(rig):
    h = rig(mode="cli")  # the raw tail for live views is kept in cli/dashboard modes
    a = RankPeer(h.port, 0)
    a.steps(30)
    frame = wait_for(lambda: (f := snap(h, verdict=True)) and f.records == 30 and f)
    assert frame.verdict.kind  # the verdict so far, from a provisional summary
    assert h.status()["records"] == 30  # the old query still answers on the same link
    a.bye()
    result = h.finish(0)
    assert result.summary_json is not None and not result.rebuilt
    a.close()


def test_the_feed_names_a_silent_aggregator_instead_of_freezing(rig):
    h = rig(mode="cli")  # the raw tail for live views is kept in cli/dashboard modes
    a = RankPeer(h.port, 0)
    a.steps(10)
    alive = {"on": True}

    def fetch(req):
        return h.snapshot(req, timeout=2.0) if alive["on"] else None

    feed = LiveFeed(fetch, interval=0.05)
    wait_for(lambda: feed.poll() and feed.state().records == 10)
    alive["on"] = False
    assert feed.poll() is None
    ok, age, err = feed.contact()
    assert not ok and err == "the aggregator did not answer"
    from rich.console import Console

    con = Console(width=160, record=True, file=open("/dev/null", "w"))
    con.print(render(feed.state(), feed.contact()))
    assert "aggregator not answering" in con.export_text()
    a.close()


def test_node_use_is_the_mean_since_the_previous_snapshot_and_stays_when_no_sample_came():
    # in-process: the records as the aggregator's handle decodes them, read as the feed reads them
    def snap(t, cpu, gpus):
        return LiveSnapshot(server_time=t, started_at=0.0, world_size=1, nodes=[SystemData(
            0, "h", last_ts=t, cpu_pct=Running(*cpu), ram_total=Running(1, 8.0, 8.0),
            gpus=[GpuData(i, util_pct=Running(*u), mem_total=Running(1, 4.0, 4.0)) for i, u in gpus])])

    a = snap(10.0, (2, 100.0, 60.0), [(0, (2, 180.0, 95.0))])
    first = read_snapshot(a)
    assert first.nodes[0].cpu_pct == 50.0 and first.nodes[0].gpus[0].util_pct == 90.0  # the run so far
    assert first.nodes[0].ram_total == 8.0 and first.nodes[0].gpus[0].mem_total == 4.0
    b = snap(11.0, (4, 180.0, 60.0), [(0, (3, 200.0, 95.0)), (1, (2, 30.0, 20.0))])
    second = read_snapshot(b, prev=a, prev_state=first)
    assert second.nodes[0].cpu_pct == 40.0 and second.nodes[0].gpus[0].util_pct == 20.0  # since a
    assert second.nodes[0].gpus[1].util_pct == 15.0  # a GPU new since a: its run so far
    third = read_snapshot(b, prev=b, prev_state=second)  # no sample since: what was shown stays
    assert third.nodes[0].cpu_pct == 40.0 and [g.util_pct for g in third.nodes[0].gpus] == [20.0, 15.0]
