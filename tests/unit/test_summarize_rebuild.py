"""No run is ever lost: after the aggregator is SIGKILLed the summary is rebuilt from its checkpoint."""

from __future__ import annotations

import json
import time

import pytest

from aggpeers import RankPeer
from traceml_core.rundir import CHECKPOINT_NAME, load_checkpoint
from traceml_core.report.summarize import SummarizeError, main, summarize


def _wait_for_checkpoint(run_dir, records, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            doc = load_checkpoint(run_dir / CHECKPOINT_NAME)
            if doc["state"]["records"] >= records:
                return doc
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("no checkpoint with the records appeared")


def test_finish_rebuilds_after_sigkill(rig):
    h = rig(nproc_per_node=2, checkpoint_interval_s=0.1)
    peers = [RankPeer(h.port, r) for r in range(2)]
    for p in peers:
        p.steps(40, step_ms=20.0, input_ms=12.0)
    doc = _wait_for_checkpoint(h.run_dir, 80)
    h.proc.kill()  # SIGKILL: no chance to write anything
    h.proc.wait()
    assert not (h.run_dir / "final_summary.json").exists()
    res = h.finish(0, reason="training exited 0")  # the launcher does not notice beyond this
    assert res.rebuilt and "exited" in res.error
    s = json.loads(res.summary_json.read_text())
    assert s["rebuilt"]["checkpoint"] == str(h.run_dir / CHECKPOINT_NAME)
    assert abs(s["rebuilt"]["taken_at"] - doc["taken_at"]) < 5
    assert s["run"]["status"] == "completed" and s["run"]["exit_code"] == 0
    assert s["telemetry"]["records_received"] == 80
    assert s["verdict"]["kind"] == "input_bound"  # the data still tells the story
    assert "rebuilt from the checkpoint" in res.summary_txt.read_text()


def test_summarize_cli_on_a_run_dir(rig, capsys):
    h = rig(nproc_per_node=1, checkpoint_interval_s=0.1)
    p = RankPeer(h.port, 0)
    p.steps(30)
    _wait_for_checkpoint(h.run_dir, 30)
    h.kill()
    assert main([str(h.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "TraceML summary: run test-run" in out and "30 step records received" in out
    s = json.loads((h.run_dir / "final_summary.json").read_text())
    assert s["rebuilt"] and s["run"]["status"] == "unknown"
    assert s["ranks"][0]["status"] == "vanished"  # no bye, no exit report: outcome unknown


def test_summarize_without_checkpoint_says_what_is_missing(tmp_path, capsys):
    with pytest.raises(SummarizeError) as err:
        summarize(tmp_path / "nothing-here")
    assert "aggregate.state" in str(err.value) and str(tmp_path / "nothing-here") in str(err.value)
    assert main([str(tmp_path / "nothing-here")]) == 1
    assert "No TraceML checkpoint" in capsys.readouterr().err


def test_summarize_of_a_run_whose_end_was_recorded_is_exact(rig, capsys):
    """A run that completed (its final checkpoint holds the end): `traceml summarize` rebuilds
    exactly the live summary's figures and verdicts, and never says data is missing."""
    h = rig(nproc_per_node=2, checkpoint_interval_s=0.1)
    peers = [RankPeer(h.port, r) for r in range(2)]
    for p in peers:
        p.steps(40, step_ms=20.0, input_ms=12.0)
    for p in peers:
        p.bye()
    res = h.finish(0, reason="")
    live = json.loads(res.summary_json.read_text())
    assert not live["rebuilt"]
    assert main([str(h.run_dir)]) == 0
    out = capsys.readouterr().out
    again = json.loads((h.run_dir / "final_summary.json").read_text())
    assert again["rebuilt"]["final_checkpoint"] is True
    assert "missing" not in out and "exact" in out, out
    assert again["telemetry"]["complete"] is True and live["telemetry"]["complete"] is True
    for key in ("verdict", "other_verdicts", "step_time", "ranks", "across_ranks", "telemetry"):
        assert again[key] == live[key], key
    assert again["run"]["status"] == live["run"]["status"] == "completed"
