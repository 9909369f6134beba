"""Faults of TraceML's own processes on node 0: the aggregator SIGKILLed mid-run, its port taken.

Training must not notice the first (same speed, same result, same exit code) and the run's summary
must still come out, rebuilt from the last checkpoint; the second must be a clear error before any
training process starts.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import time

from traceml_core.rundir import CHECKPOINT_NAME, load_checkpoint

from harness import (PY, Launch, aggregator_pid, assert_counted, assert_no_leftovers, base_env,
                     run)

#: 60 steps of 100 ms (a steady, mostly sleeping rate): the same training as
#: test_worker_faults.py's control, so the two share one plain-torchrun baseline (conftest.py)
STEPS = 60
STEP_MS = 100


def _rate(times: list[float]) -> float:
    """Steps/s from the median step interval (robust to a shared machine's scheduling pauses)."""
    return 1.0 / statistics.median(b - a for a, b in zip(times, times[1:]))


def test_aggregator_sigkilled_mid_run(tmp_path, baseline):
    launch = Launch(tmp_path, ("--steps", str(STEPS), "--step-ms", str(STEP_MS)), run_name="aggkill",
                    flags=["--hang-timeout=2"])  # a dead aggregator must not look like a hang
    agg = aggregator_pid(launch.pid)
    deadline = time.monotonic() + 150
    checkpointed = 0
    while checkpointed < 20:  # kill once a checkpoint holds some steps of both ranks (>= 1 s in)
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()
        time.sleep(0.05)
        try:
            checkpointed = load_checkpoint(launch.logs / "aggkill" / CHECKPOINT_NAME)["state"]["records"]
        except (OSError, ValueError):
            pass
    killed_at = time.time()
    os.kill(agg, signal.SIGKILL)
    r = launch.wait(90)
    plain = baseline("--steps", str(STEPS))

    # training: same exit code, same result, and the same speed after the kill
    assert r.code == plain.code == 0, r.err[-2000:]
    assert r.progress.result == plain.progress.result is not None
    steps0 = r.progress.steps[0]
    before = [t for _, t in steps0 if killed_at - 1.5 <= t < killed_at]
    after = [t for _, t in steps0 if killed_at + 0.2 <= t < killed_at + 1.7]
    rb, ra = _rate(before), _rate(after)
    print(f"rank 0 steps/s: {rb:.1f} in the 1.5 s before the kill, {ra:.1f} in the 1.5 s after")
    assert ra > 0.6 * rb, (rb, ra)  # generous: 2 shared cores; benchmarks/aggregator_kill.py measures it

    # the summary: from a new aggregator the launcher started from the last checkpoint; every
    # rank's records are counted exactly against what training did, the lost ones named
    s = r.summary()
    assert not s["rebuilt"] and s["telemetry"]["aggregator_restarts"] == 1
    assert s["run"]["status"] == "completed" and s["run"]["exit_code"] == 0
    assert "the aggregator exited (killed by SIGKILL); starting a new one" in r.err
    assert "restarted 1 time(s) from its last checkpoint" in " ".join(s["notes"])
    tel = s["telemetry"]
    for rank in s["ranks"]:
        t = rank["telemetry"]
        truth = r.progress.done(rank["rank"])
        assert rank["status"] == "clean" and t["expected"] == truth, (rank["rank"], t, truth)
        assert t["received"] + t["lost"] == truth
    print(f"after the SIGKILL: {tel['records_received']} received, {tel['records_lost']} lost (counted), "
          f"truth {2 * STEPS}")
    assert tel["records_received"] + tel["records_lost"] == 2 * STEPS
    assert tel["complete"] == (tel["records_lost"] == 0)
    assert checkpointed <= tel["records_received"]
    assert ("none lost" in r.out) == tel["complete"]
    assert_counted(r, s)
    assert_no_leftovers(r, [agg])

    # and anyone can rebuild it again later: `traceml summarize RUN_DIR`
    for f in ("final_summary.json", "final_summary.txt"):
        (r.run_dir / f).unlink()
    env = base_env(tmp_path)
    out = subprocess.run([PY, "-m", "traceml_core.cli", "summarize", str(r.run_dir)], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "TraceML summary: run aggkill" in out.stdout and "rebuilt from the checkpoint" in out.stdout
    assert str(r.run_dir / "final_summary.json") in out.stderr
    again = r.summary()
    assert again["telemetry"]["records_received"] == s["telemetry"]["records_received"]


def test_summarize_without_a_run_is_one_clear_line(tmp_path):
    out = subprocess.run([PY, "-m", "traceml_core.cli", "summarize", str(tmp_path / "nope")],
                         env=base_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert out.stderr.startswith("traceml: error: No TraceML checkpoint found")
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_aggregator_port_in_use_is_a_clear_error_before_training(tmp_path):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        # (the pre-flight's torch import comes first: tens of seconds on a loaded CI machine)
        r = run(tmp_path, ("--steps", "5"), aggregator_port=port, run_name="busy", timeout=150)
    finally:
        holder.close()
    assert r.code == 3
    assert f"port {port} (from --aggregator-port) is already in use" in r.err
    assert "Traceback" not in r.err
    assert not r.progress.pids, "training started although the aggregator could not"
    assert not (r.run_dir / "final_summary.json").exists()
