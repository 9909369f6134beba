"""The hang rules by state (report/hangstate.py) and node 0's detection around them
(aggregator/hangwatch.py), on readings of ranks as report/hang.py writes them. The real runs, with
real gloo ranks that block, stop, save or evaluate, are tests/faults/test_hang_state.py."""

from __future__ import annotations

from typing import Any, Optional

from traceml_core.aggregator.hangwatch import HangWatch
from traceml_core.report.hangstate import judge

S = 1_000_000_000


def row(rank: int, state: str, t: float, *, cpu: float = 0.0, kids: float = 0.0, proc: Optional[float] = None,
        io: int = 0, step: int = 40, launched: int = 80, where: str = "train.py:61 in main",
        collective: Optional[str] = None) -> dict[str, Any]:
    """One rank's reading at ``t`` s, its counters as if it had used ``cpu`` cores since 0."""
    return {"rank": rank, "node": rank // 2, "host": f"n{rank // 2}", "state": state,
            "collective": collective or ("all_reduce" if state == "collective" else None),
            "where": where, "stack": [where], "threads": 1, "in_flight": None, "step": step,
            "error": None, "launched": launched, "main_cpu_ns": int(cpu * t * S),
            "children_cpu_ns": int(kids * t * S), "proc_cpu_ns": int((proc if proc is not None else cpu) * t * S),
            "io_bytes": io, "at_ns": int(t * S)}


def test_a_peer_that_makes_no_progress_while_the_others_wait_is_the_hang():
    first = [row(0, "collective", 0), row(1, "running", 0, cpu=0.02)]
    last = [row(0, "collective", 10), row(1, "running", 10, cpu=0.02)]
    j = judge(first, last, 10.0)
    assert j.state == "hang" and j.rule == "peer" and j.culprits == [1]
    assert j.because.startswith("rank 1 made no progress for 10 s (0.02 of a core in its main thread)")


def test_a_peer_that_works_is_working_however_long_the_others_wait():
    first = [row(0, "collective", 0), row(1, "running", 0, cpu=0.9, where="train.py:88 in save_checkpoint")]
    last = [row(0, "collective", 10), row(1, "running", 10, cpu=0.9, where="train.py:88 in save_checkpoint")]
    j = judge(first, last, 10.0)
    assert j.state == "working" and j.working == [(1, "save_checkpoint (train.py:88)")]
    # ... and a save that only writes (a slow shared file system) works too
    io = judge([row(0, "collective", 0), row(1, "running", 0)],
               [row(0, "collective", 10), row(1, "running", 10, io=50 << 20)], 10.0)
    assert io.state == "working" and io.progress[1].words() == "5.24 MB/s of I/O"


def test_a_loader_whose_workers_compute_is_working_and_one_whose_workers_idle_is_a_hang():
    busy = judge([row(0, "collective", 0), row(1, "dataloader", 0, kids=1.5)],
                 [row(0, "collective", 10), row(1, "dataloader", 10, kids=1.5)], 10.0)
    assert busy.state == "working"
    idle = judge([row(0, "collective", 0), row(1, "dataloader", 0)],
                 [row(0, "collective", 10), row(1, "dataloader", 10)], 10.0)
    assert idle.state == "hang" and idle.culprits == [1]


def test_a_stopped_rank_is_the_hang_even_beside_a_rank_that_works():
    j = judge([row(0, "running", 0, cpu=1.0), row(1, "stopped", 0)],
              [row(0, "running", 10, cpu=1.0), row(1, "stopped", 10)], 10.0)
    assert j.state == "hang" and j.rule == "stopped" and j.culprits == [1]


def test_every_rank_in_a_collective_with_no_progress_is_all_stuck_or_mismatched():
    same = judge([row(0, "collective", 0), row(1, "collective", 0)],
                 [row(0, "collective", 10), row(1, "collective", 10)], 10.0)
    assert same.state == "hang" and same.rule == "all_stuck"
    mixed = judge([row(0, "collective", 0, collective="barrier"), row(1, "collective", 0)],
                  [row(0, "collective", 10, collective="barrier"), row(1, "collective", 10)], 10.0)
    assert mixed.state == "hang" and mixed.rule == "mismatch"
    # data moving (the collective library's threads busy) or collectives completing: not stuck
    moving = judge([row(0, "collective", 0, proc=0.8), row(1, "collective", 0, proc=0.8)],
                   [row(0, "collective", 10, proc=0.8), row(1, "collective", 10, proc=0.8)], 10.0)
    assert moving.state == "working"
    done = judge([row(0, "collective", 0), row(1, "collective", 0)],
                 [row(0, "collective", 10, launched=96), row(1, "collective", 10, launched=96)], 10.0)
    assert done.state == "working"


def test_every_rank_idle_in_its_own_code_is_left_to_the_backstop():
    j = judge([row(0, "running", 0), row(1, "running", 0)], [row(0, "running", 10), row(1, "running", 10)], 10.0)
    assert j.state == "undecided"


def _report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"at": 0.0, "silent_s": 0.0, "threshold_s": 0.0, "threshold_source": "", "finding": "f",
            "culprits": [], "groups": [], "ranks": rows, "records_at": 80}


def _silence(w: HangWatch, t0: float = 100.0) -> None:
    assert not w.observe(t0, 80, True, 10.0)          # steps arrive...
    assert not w.observe(t0 + 4.9, 80, True, 10.0)    # ... then none: too soon to look


def test_node_0_reads_the_ranks_after_5_s_and_names_a_hang_10_s_of_no_progress_later():
    w = HangWatch("auto")
    _silence(w)
    times, declared = [], None
    t = 105.0
    while declared is None and t < 200:
        if w.observe(t, 80, True, 10.0, wall=1000.0 + t):
            times.append(t)
            declared = w.reading(t, _report([row(0, "collective", t), row(1, "running", t)]), 10.0,
                                 wall=1000.0 + t)
        t += 1.0
    assert times == [105.0, 110.0, 115.0]
    assert declared is not None and declared["rule"]["kind"] == "state" and declared["rule"]["name"] == "peer"
    assert declared["detect_s"] == 15.0 and declared["began_at"] == 1100.0, "the last steps came at 100 s"
    assert any(line.startswith("hang report: no rank completed a step for 15 s, and rank 1 made no "
                               "progress for 10 s") for _, line in w.notices), list(w.notices)
    assert not w.observe(130.0, 80, True, 10.0), "one declaration per silence"


def test_a_long_save_is_logged_as_working_and_never_declared_then_a_hang_once_it_stops():
    w = HangWatch("auto")
    _silence(w)
    t, declared = 105.0, None
    while t < 105.0 + 400:                                 # a 400 s save: far past the backstop
        if w.observe(t, 80, True, 10.0):
            declared = w.reading(t, _report([row(0, "collective", t),
                                             row(1, "running", t, cpu=0.95, where="train.py:88 in save_checkpoint")]),
                                 10.0)
            assert declared is None, declared
        t += 1.0
    working = [line for _, line in w.notices]
    assert working[0].startswith("rank 1 (node 0, n0) has been in save_checkpoint (train.py:88) for 30 s "
                                 "(working: 0.95 of a core in its main thread)"), working
    assert [line.split(" for ")[1].split(" (")[0] for line in working] == ["30 s", "60 s", "2 min", "4 min"]
    # the save ends and rank 1 blocks: its CPU stops; a hang once 10 s of no progress are seen
    base = row(1, "running", t, cpu=0.95)["main_cpu_ns"]
    for k in range(4):
        now = t + k * 5.0
        r1 = row(1, "running", now)
        r1["main_cpu_ns"] = base
        if w.observe(now, 80, True, 10.0):
            declared = w.reading(now, _report([row(0, "collective", now), r1]), 10.0)
            if declared is not None:
                break
    assert declared is not None and declared["rule"]["name"] == "peer", declared


def test_the_backstop_fires_when_nothing_answers_and_nobody_is_seen_working():
    w = HangWatch("auto")
    _silence(w)
    t, declared = 105.0, None
    while declared is None and t < 200:
        if w.observe(t, 80, True, 10.0):
            declared = w.reading(t, _report([row(0, "running", t), row(1, "running", t)]), 10.0)
        t += 1.0
    assert declared is not None and declared["rule"]["kind"] == "time" and declared["silent_s"] == 60.0
    assert HangWatch("off").observe(1e6, 5, True, 1.0) is False


def test_an_explicit_short_threshold_reports_at_its_first_reading():
    w = HangWatch("4")
    assert not w.observe(10.0, 80, True, 10.0)
    assert w.observe(14.0, 80, True, 10.0)
    declared = w.reading(14.0, _report([row(0, "collective", 14), row(1, "running", 14)]), 10.0)
    assert declared is not None and declared["rule"]["kind"] == "time"
