"""Faults of the training processes on one node: each case runs the real ``traceml run`` (real
torchrun, real gloo DDP workers, real aggregator) and checks what a user would see: training's own
exit code and result are what plain torchrun gives, nothing outlives its bound, the final summary
exists and says what happened, and every step that reached the aggregator is counted.
"""

from __future__ import annotations

import pytest

from harness import assert_counted, assert_no_leftovers, run

FAULT_STEP = 40
FAULT = ("--steps", "200", "--step-ms", "10", "--fault-rank", "1", "--fault-step", str(FAULT_STEP))


@pytest.fixture(scope="module")
def plain_runs(baseline):
    """The plain-torchrun references of the failure tests below, made side by side at once."""
    baseline.prefetch(*(FAULT + ("--fault", f) for f in ("kill", "raise", "exit")))
    return baseline


def _fault_time(r, rank=1):
    """Wall time the faulty rank hit its fault (its last step + the settle pause)."""
    return r.progress.steps[rank][-1][1] + 0.6


def _bounded(r, what: str, bound: float = 10.0) -> None:
    """The summary is written promptly after the fault: torchrun ends the run at the first failure."""
    after = (r.run_dir / "final_summary.json").stat().st_mtime - _fault_time(r)
    print(f"{what} -> summary written: {after:.1f} s")
    assert 0 < after < bound, after


def test_worker_sigkilled_mid_run(tmp_path, plain_runs):
    r = run(tmp_path, FAULT + ("--fault", "kill"), run_name="killed")
    plain = plain_runs(*FAULT, "--fault", "kill")
    assert r.code == plain.code != 0, (r.code, plain.code)
    assert r.progress.done(1) == FAULT_STEP
    s = r.summary()
    assert s["run"]["status"] == "failed" and s["run"]["exit_code"] == r.code
    ranks = {x["rank"]: x for x in s["ranks"]}
    assert ranks[1]["status"] == "crashed"  # no goodbye, failing exit: killed
    assert "rank 1 (node 0" in r.out and "crashed" in r.out  # the printed summary says so
    # failures first: the headline names the killed rank, its signal and where the run was
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"]["rank"] == 1, v
    ev = v["evidence"]
    assert ev["signal"] == "SIGKILL" and ev["consequence_ranks"] == [0], ev
    assert ev["oom_killed"] is not True  # a kill -9, not the OOM killer
    # where it died: rank 0's records say step 40; on a loaded machine both ranks' last records
    # can die with them (rank 0 is stopped by SIGTERM), and then the step is a lower bound, said so
    # (when rank 1's own telemetry reached step 40 and no other rank's went further, the step is
    # exact but node 0 cannot know it: 'after at least 40 steps' is the honest wording then too)
    assert 0 < ev["step"] <= FAULT_STEP, ev
    words = (f"rank 1 was killed by SIGKILL after at least {ev['step']} steps",) + \
        ((f"rank 1 was killed by SIGKILL around step {FAULT_STEP}",) if ev["step"] == FAULT_STEP else ())
    assert s["run"]["reason"].startswith(words), (s["run"]["reason"], words)
    assert "Verdict: RUN-FAILED (critical): rank 1 (node 0" in r.out
    assert ranks[0]["failure"]["role"] == "consequence" and ranks[1]["failure"]["role"] == "first"
    assert_counted(r, s)
    assert ranks[1]["telemetry"]["received"] >= r.progress.sent[1] > 0
    _bounded(r, "kill")
    assert_no_leftovers(r)


def test_worker_raises(tmp_path, plain_runs):
    r = run(tmp_path, FAULT + ("--fault", "raise"), run_name="raised")
    plain = plain_runs(*FAULT, "--fault", "raise")
    assert r.code == plain.code != 0
    s = r.summary()
    rank1 = s["ranks"][1]
    assert rank1["status"] == "error"
    assert "injected failure on rank 1 at step 40" in rank1["error"]
    assert "injected failure on rank 1 at step 40" in r.out
    assert s["run"]["status"] == "failed"
    # failures first: the raising rank, its step, the exception and where it was raised; rank 0's
    # gloo error is a consequence, and no performance verdict blames rank 0 for its aborted step
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"] == {"rank": 1, "node": 0, "host": rank1["host"]}
    ev = v["evidence"]
    assert ev["exception_type"] == "RuntimeError" and ev["step"] == FAULT_STEP, ev
    assert ev["message"] == "injected failure on rank 1 at step 40"
    assert ev["where"].startswith("faulty_train.py:") and ev["consequence_ranks"] == [0], ev
    assert s["run"]["reason"] == ("rank 1 raised RuntimeError before step 40: injected failure on "
                                  "rank 1 at step 40")
    assert not [o for o in s["other_verdicts"] if (o.get("culprit") or {}).get("rank") == 0]
    head = r.out.split("Verdict: ", 1)[1].splitlines()[0]
    assert head.startswith("RUN-FAILED (critical): rank 1 (node 0") and "RuntimeError" in head
    assert "rank 0 failed as a consequence (gloo lost the connection to a peer)" in head
    assert_counted(r, s)
    _bounded(r, "raise")
    assert_no_leftovers(r)


def test_worker_hangs_and_the_watchdog_gives_up(tmp_path):
    """Rank 1 deadlocks; rank 0 then waits in the all-reduce forever (gloo's timeout is 30 min).
    With --hang-timeout=3 the launcher takes the hang report (every rank's stack), stops the run,
    exits 124, and the summary names the ranks and where they were stuck."""
    from traceml_core.aggregator.autopsy import DEADLINE_S

    r = run(tmp_path, FAULT + ("--fault", "hang"), flags=["--hang-timeout=3"], run_name="hung",
            timeout=180)
    assert r.code == 124
    hung_at = _fault_time(r)
    s = r.summary()
    reason = s["run"]["reason"]
    assert s["run"]["status"] == "failed" and s["run"]["exit_code"] == 124
    assert "looks hung" in reason and "rank 1 (node 0" in reason and "--hang-timeout=3" in reason
    assert "[traceml] error: training looks hung" in r.err
    # the automatic report threshold (60 s) is far off: the watchdog takes the report itself,
    # before it stops the workers, so the run that was stopped still says where each rank was
    h = s["hang"]
    assert h and h["culprits"] == [1] and h["threshold_source"] == "--hang-timeout=3", h
    assert s["verdict"]["kind"] == "hang" and s["verdict"]["culprit"]["rank"] == 1, s["verdict"]
    assert reason.startswith("hung: rank 1 (node 0"), reason
    # bounds: the watchdog fires within the timeout + the 1 s watch interval + the relay's 0.2 s
    # window (+ records still queued in a rank on a loaded machine); the collection waits at most
    # DEADLINE_S; then torchrun stops the workers at once (SIGTERM ends a process blocked in gloo)
    # and the summary is written
    written = (r.run_dir / "final_summary.json").stat().st_mtime
    print(f"hang began -> report taken: {h['at'] - hung_at:.1f} s -> summary written: "
          f"{written - h['at']:.1f} s more (--hang-timeout=3)")
    # (generous: a loaded 2-core CI machine; a report or summary far later than this is a defect)
    assert 0 < h["at"] - hung_at < 3 + 2 + DEADLINE_S + 5, h["at"] - hung_at
    assert 0 < written - h["at"] < 30, written - h["at"]
    assert "Traceback" not in r.err, r.err[-3000:]  # torchrun's SignalException buries the why
    assert_counted(r, s)
    assert_no_leftovers(r)


def test_worker_exits_with_a_failing_status(tmp_path, plain_runs):
    r = run(tmp_path, FAULT + ("--fault", "exit"), run_name="exited")
    plain = plain_runs(*FAULT, "--fault", "exit")
    assert r.code == plain.code != 0
    s = r.summary()
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"]["rank"] == 1
    assert v["evidence"]["cause"] == "exit" and v["evidence"]["message"] == "sys.exit(7)"
    assert s["run"]["reason"] == f"rank 1 exited with sys.exit(7) before step {FAULT_STEP}"
    assert_no_leftovers(r)


def test_a_pause_shorter_than_the_hang_timeout_is_not_a_hang(tmp_path, baseline):
    """An evaluation-like pause of every rank (2.5 s) under --hang-timeout=6: the run completes
    untouched, with exactly plain torchrun's result. It is also the control of the failure tests
    above (same script, no fault): no failure headline, no rank with a failure. (Silence at node 0
    is the pause plus up to ~2 s of the relay's and the watch's 1 s windows, more under load.)"""
    args = ("--steps", "60", "--pause-at", "30", "--pause-s", "2.5")
    r = run(tmp_path, args, flags=["--hang-timeout=6"], run_name="paused")
    plain = baseline("--steps", "60")
    assert r.code == plain.code == 0
    assert r.progress.result == plain.progress.result is not None
    s = r.summary()
    assert s["run"]["status"] == "completed" and s["telemetry"]["complete"]
    assert s["telemetry"]["records_received"] == 2 * 60
    assert s["run"]["reason"] == ""
    assert s["verdict"]["kind"] != "run_failed"
    assert all(o["kind"] != "run_failed" for o in s["other_verdicts"])
    assert all("failure" not in x for x in s["ranks"])
    assert "FIRST FAILURE" not in r.out
    assert_no_leftovers(r)


def test_a_crash_after_training_is_told_apart_from_a_training_failure(tmp_path, baseline):
    """Rank 1 trains to the end, says goodbye, then aborts as the process exits (what gloo can do
    when a process group outlives interpreter shutdown). The exit code is torchrun's, every step is
    counted, and the summary says the failure came after training instead of leaving the user with
    "failed" next to "2 clean" ranks."""
    args = ("--steps", "30", "--fault", "abort-at-exit", "--fault-rank", "1")
    r = run(tmp_path, args, run_name="abort-at-exit")
    plain = baseline(*args)
    assert r.code == plain.code != 0
    assert r.progress.result == plain.progress.result is not None
    s = r.summary()
    assert s["run"]["status"] == "failed" and s["run"]["exit_code"] == r.code
    assert [x["status"] for x in s["ranks"]] == ["clean", "clean"]
    assert s["telemetry"]["records_received"] == 2 * 30 and s["telemetry"]["complete"]
    note = " ".join(s["notes"])
    assert "every rank finished training" in note and f"code {r.code}" in note
    assert "Note: every rank finished training" in r.out
    assert_no_leftovers(r)
