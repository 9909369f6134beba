"""The launcher's one rule from how the workers ended to the exit status and reason a user sees
(launcher/outcome.py), for both layouts, and the launch lifecycle's record (launcher/lifecycle.py).
The end-to-end runs (tests/launcher, tests/faults, tests/slurm) check the same rule on real
launches; these pin each case of it."""

from __future__ import annotations

import signal

import pytest

from traceml_core.launcher.lifecycle import LifecycleRecord, Phase
from traceml_core.launcher.outcome import HANG_EXIT_CODE, WorkersEnded, judge

TERM, INT = int(signal.SIGTERM), int(signal.SIGINT)
LIMIT = "the job reached its time limit (SLURM_JOB_END_TIME, 12:00:00)"


@pytest.mark.parametrize("ended, failure, cause, status, reason", [
    # the workers' own exit code, a signal's death the shell's way
    (WorkersEnded(0), None, None, 0, None),
    (WorkersEnded(1), None, None, 1, None),
    (WorkersEnded(-9), None, None, 137, None),
    # what node 0's watchdog saw is the reason of a failed run, never of a clean one
    (WorkersEnded(1), "node 1 (node2) failed (exit code 1)", None, 1, "node 1 (node2) failed (exit code 1)"),
    (WorkersEnded(0), "node 1 (node2) failed (exit code 1)", None, 0, None),
    # interrupted: 128 + N whatever the workers made of the signal, and who sent it when known
    (WorkersEnded(-15, TERM), None, LIMIT, 143, f"interrupted by SIGTERM: {LIMIT}"),
    (WorkersEnded(1, TERM), None, None, 143, "interrupted by SIGTERM"),
    (WorkersEnded(0, INT), None, None, 130, "interrupted by SIGINT (Ctrl-C)"),
    (WorkersEnded(-15, TERM), "node 1 (node2) vanished (its launcher's connection closed)", None, 143,
     "node 1 (node2) vanished (its launcher's connection closed); interrupted by SIGTERM"),
    # the hang watchdog: 124 (timeout(1)'s), unless a signal came first
    (WorkersEnded(-15, hung=True), "training looks hung: ...", None, HANG_EXIT_CODE, "training looks hung: ..."),
    (WorkersEnded(-15, TERM, hung=True), None, None, 143, "interrupted by SIGTERM"),
])
def test_how_a_launch_ended_gives_one_status_and_reason(ended, failure, cause, status, reason):
    out = judge(ended, failure=failure, cause=cause)
    assert (out.status, out.reason, out.interrupted) == (status, reason, ended.signal is not None)


def test_a_task_that_knows_only_its_own_worker_does_not_vouch_for_a_clean_run():
    """Rank 0's task (task layout): its worker ended cleanly, the others' exits are unknown to it,
    so the summary gets null and judges the run by how every rank ended; a failure it saw is
    reported as such, and torchrun (which saw every worker of the node) reports 0."""
    clean, failed = judge(WorkersEnded(0)), judge(WorkersEnded(1))
    assert clean.summary_exit_code(knows_every_worker=False) is None
    assert clean.summary_exit_code(knows_every_worker=True) == 0
    assert failed.summary_exit_code(knows_every_worker=False) == 1


def test_the_lifecycle_moves_forward_and_records_when_each_phase_began():
    rec = LifecycleRecord(allocation_start=1000.0, restarts=2)
    for at, phase in enumerate((Phase.PREFLIGHT, Phase.TELEMETRY_UP, Phase.TRAINING), start=1001):
        rec.enter(phase, at=float(at))
    rec.first_step(at=1003.5)
    rec.first_step(at=1009.0)             # the first one counts
    with pytest.raises(ValueError):
        rec.enter(Phase.TELEMETRY_UP)     # never backwards
    rec.enter(Phase.FINISHING, at=1010.0)
    rec.enter(Phase.DONE, at=1011.0)
    assert rec.began(Phase.TRAINING) == 1003.0 and rec.phase is Phase.DONE
    assert rec.to_wire() == {
        "first_step": 1003.5, "allocation_start": 1000.0, "restarts": 2,
        "phases": [["preflight", 1001.0], ["telemetry_up", 1002.0], ["training", 1003.0],
                   ["finishing", 1010.0], ["done", 1011.0]], "signals": [], "scheduled_end": None}


def test_a_launch_refused_in_preflight_goes_straight_to_done():
    rec = LifecycleRecord()
    rec.enter(Phase.PREFLIGHT, at=1.0)
    rec.enter(Phase.DONE, at=2.0)
    assert [p for p, _ in rec.to_wire()["phases"]] == ["preflight", "done"]
    with pytest.raises(ValueError):
        LifecycleRecord().enter(Phase.TRAINING)   # nothing starts without its pre-flight


def test_each_nodes_lifecycle_reaches_the_summary_through_the_real_aggregator(rig):
    """Node 1's launcher sends its record in its goodbye, node 0's in its finish (as NodeLaunch
    does); the summary's topology holds both, for the goodput ledger. What does not fit the
    trust boundary is left out, never the frame: an unknown phase is dropped, a time past 2**32 s
    is not measured (and counted among the values refused)."""
    import datetime
    import json

    from aggpeers import RankPeer

    h = rig(nnodes=2, nproc_per_node=1)
    for rank in (0, 1):
        p = RankPeer(h.relay_port(rank), rank, node=rank)
        p.steps(5)
        p.bye()
    t0 = 1_800_000_000.0

    def record(first: float) -> dict:
        rec = LifecycleRecord(allocation_start=t0, restarts=0)
        for i, phase in enumerate((Phase.PREFLIGHT, Phase.TELEMETRY_UP, Phase.TRAINING, Phase.FINISHING)):
            rec.enter(phase, at=t0 + first + i)
        rec.first_step(at=t0 + first + 2.5)
        return rec.to_wire()

    node1 = record(10.0)
    node1["phases"].insert(0, ["rendezvous", t0])      # not a phase of ours
    node1["first_step"] = 2.0 ** 40                    # not a time
    # the early warning reached node 1's launcher first; a signal name not of ours is dropped
    node1["signals"] = [["SIGFOO", t0 + 11], ["SIGUSR1", t0 + 12.5], ["SIGUSR1", t0 + 13]]
    h.relays[1].drain(2.0)
    h.relays[1].close(3.0, bye={"t": "bye", "status": "clean", "exit_code": 0, "lifecycle": node1})
    h.relays[0].drain(2.0)
    h.relays[0].run_ended()
    s = json.loads(h.handle.finish(0, report={"lifecycle": record(5.0)}).summary_json.read_text())

    def seconds(iso: str) -> float:
        return datetime.datetime.fromisoformat(iso).timestamp() - t0

    got = [(n["node"], {p: seconds(at) for p, at in n["lifecycle"]["phases"].items()},
            n["lifecycle"]["first_step"] and seconds(n["lifecycle"]["first_step"]),
            seconds(n["lifecycle"]["allocation_start"]), n["lifecycle"]["restarts"])
           for n in s["topology"]["nodes"]]
    assert got == [
        (0, {"preflight": 5.0, "telemetry_up": 6.0, "training": 7.0, "finishing": 8.0}, 7.5, 0.0, 0),
        (1, {"preflight": 10.0, "telemetry_up": 11.0, "training": 12.0, "finishing": 13.0}, None, 0.0, 0)]
    assert s["telemetry"]["wire"]["values_refused"] == 1, s["telemetry"]["wire"]
    ending = s["goodput"]["attempts"][-1]["ending"]
    assert ending["warning"] == "SIGUSR1" and ending["warning_at"] == t0 + 12.5, ending
    assert ending["scheduled_end"] is None and "the cluster did not say when the time limit was" in ending["words"]
