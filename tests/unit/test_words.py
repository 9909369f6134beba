"""Words that fit the context (issue 15): hints that name the fix for where a value came from."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from traceml_core.aggregator.server import port_clash_hint
from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_slurm.environment import SlurmEnvironment
from traceml_slurm.interrupts import explain

SLURM = [SlurmEnvironment]


def _settings(**kw) -> AggregatorSettings:
    return AggregatorSettings(run_name="r", token="t", run_dir=Path("/nonexistent"), **kw)


def test_the_port_clash_hint_fits_where_the_port_came_from():
    outside = port_clash_hint(_settings(port_source="default"))
    assert "job-derived" not in outside and "--standalone" in outside and "--aggregator-port" in outside
    derived = port_clash_hint(_settings(port_source="slurm:SLURM_JOB_ID", job_id="7", nnodes=2))
    assert "1,024" in derived and "same on every node" in derived
    flag = port_clash_hint(_settings(port_source="--aggregator-port"))
    assert "default (29765)" in flag and "job-derived" not in flag
    flag_in_job = port_clash_hint(_settings(port_source="--aggregator-port", job_id="7"))
    assert "job-derived port" in flag_in_job
    free = port_clash_hint(_settings(port_source="free"))
    assert "picked as a free port" in free and "Run again" in free and "default" not in free


def test_a_stale_slurm_job_id_on_a_laptop_names_cluster_none():
    with pytest.raises(ConfigError) as err:
        resolve({}, {"SLURM_JOB_ID": "12345"}, SLURM)
    msg = str(err.value)
    assert "leftover" in msg and "--cluster=none" in msg and "\n" not in msg
    c = resolve({"cluster": "none"}, {"SLURM_JOB_ID": "12345"}, SLURM)
    assert c.cluster == "none" and c.job_id is None


def test_a_real_salloc_shell_still_says_salloc_and_offers_cluster_none():
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2"}
    with pytest.raises(ConfigError) as err:
        resolve({}, env, SLURM)
    assert "salloc shell on the login host" in str(err.value) and "--cluster=none" in str(err.value)


class _Cfg:
    job_id = "5"
    job_end_time = 1_800_000_000.0


@pytest.mark.parametrize("at,facts,words", [
    (1_800_000_020.0, None, "the job reached its time limit (SLURM_JOB_END_TIME"),
    (1_800_000_000.0 - 60, {"state": "CANCELLED", "end": None, "unlimited": False}, "cancelled (scancel"),
    (1_800_000_000.0 - 60, None, "60 s before the job's time limit"),
    (1_800_000_000.0 - 6000, None, "so not the time limit"),
])
def test_who_sent_the_sigterm_from_the_end_time_or_the_controller(at, facts, words):
    assert words in explain(_Cfg(), signal.SIGTERM, at, ask=lambda job: facts)


def test_without_an_end_time_the_controller_decides_or_it_could_be_either():
    cfg = _Cfg()
    cfg.job_end_time = None
    timeout = {"state": "TIMEOUT", "end": 100.0, "unlimited": False}
    assert "reached its time limit" in explain(cfg, signal.SIGTERM, 100.0, ask=lambda j: timeout)
    scancel = {"state": "COMPLETING", "end": None, "unlimited": True}
    assert "no time limit, so not the time limit: scancel" in explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: scancel)
    either = explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: None)
    assert "could be either" in either and "time limit" in either and "scancel" in either
    assert explain(cfg, signal.SIGINT, 1.0, ask=lambda j: None) is None


def test_a_sigterm_during_a_requeue_says_requeued_and_which_kind():
    """On ``scontrol requeue`` the controller counts the restart at once (JobState=COMPLETING,
    Restarts=1, as the real 22.05 answers while the attempt is stopped): the attempt was requeued,
    whatever its end time; a preemption or a node failure says so where the state tells."""
    cfg = _Cfg()
    cfg.restart_count = 0
    requeued = {"state": "COMPLETING", "end": None, "unlimited": False, "restarts": 1}
    words = explain(cfg, signal.SIGTERM, 1_800_000_000.0 - 480, ask=lambda j: requeued)
    assert words.startswith("the job was requeued (the controller counts restart 1") and "early warning" not in words
    assert "preempted and requeued" in explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: {**requeued, "state": "PREEMPTED"})
    assert "after a node failure" in explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: {**requeued, "state": "NODE_FAIL"})
    cfg.restart_count = 1  # the second attempt, scancelled: its own restart count, not a new requeue
    assert "requeued" not in explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: {**requeued, "state": "CANCELLED"})


def _template(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "template", *args],
                          capture_output=True, text=True, timeout=60)


def test_template_takes_sbatch_short_options_and_names_a_misspelt_one():
    out = _template("-p", "short", "-N", "2", "--no-check", "--print", "train.py")
    assert out.returncode == 0, out.stderr
    assert any(line.split()[:2] == ["partition", "short"] for line in out.stdout.splitlines()), out.stdout
    bad = _template("--prtition", "short", "train.py")
    assert bad.returncode == 2 and "usage: traceml slurm [-h]" not in bad.stderr
    assert "--prtition is not an option of the template. Did you mean --partition" in bad.stderr


def test_a_time_limit_a_year_away_is_slurms_way_of_saying_none():
    """Slurm 22.05 shows a job without a time limit as TimeLimit=365-00:00:00 (and newer Slurm gives it
    a SLURM_JOB_END_TIME a year away): a SIGTERM then is never "525600 min before the time limit"."""
    cfg = _Cfg()
    cfg.job_end_time = None
    year = 365 * 86400.0
    from traceml_slurm.interrupts import NOT_THE_LIMIT
    running = {"state": "RUNNING", "end": None, "unlimited": True}
    assert explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: running) == NOT_THE_LIMIT
    cfg.job_end_time = 1.0 + year
    assert explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: None) == NOT_THE_LIMIT
    cancelled = {"state": "CANCELLED", "end": None, "unlimited": True}
    assert "cancelled (scancel" in explain(cfg, signal.SIGTERM, 1.0, ask=lambda j: cancelled)


def test_the_controllers_365_day_limit_reads_as_unlimited(monkeypatch):
    from traceml_slurm import controller
    from traceml_slurm.interrupts import controller_state

    job = controller.JobFacts("5", "train", "RUNNING", "debug", "node1", 1, 365 * 86400.0, 1000.0,
                              1000.0 + 365 * 86400.0, restarts=0)

    class _Backend:
        def __init__(self, timeout: float) -> None:
            pass

        def job(self, job_id: str) -> controller.JobFacts:
            return job

    monkeypatch.setattr(controller, "ScontrolBackend", _Backend)
    assert controller_state("5") == {"state": "RUNNING", "end": None, "unlimited": True, "restarts": 0,
                                     "start": 1000.0, "reason": None, "scheduled": None}


@pytest.mark.parametrize("state,scheduled", [("RUNNING", 1053.0), ("SIGNALING", 1053.0), ("CONFIGURING", 1053.0),
                                             ("COMPLETING", None), ("CANCELLED", None), ("TIMEOUT", None)])
def test_the_scheduled_end_is_endtime_while_the_job_is_live_whatever_flag_it_shows(state, scheduled):
    """An ``scontrol update EndTime=`` to start + 53 s leaves a 2-minute TimeLimit (Slurm keeps
    whole minutes): EndTime is the end the controller keeps to. On the early warning, Slurm sends
    SIGCONT first and the job reads SIGNALING until the nodes answered: still live, still EndTime
    (CI asked in that window and reported start + limit, 67 s late)."""
    from traceml_slurm import controller
    from traceml_slurm.interrupts import scheduled_end

    job = controller.JobFacts("7", "train", state, "debug", "node1", 1, 120.0, 1000.0, 1053.0, restarts=0)
    assert job.scheduled_end == scheduled
    cfg = _Cfg()
    cfg.job_id, cfg.job_end_time = "7", None
    facts = {"state": state, "end": 1120.0, "unlimited": False, "scheduled": job.scheduled_end}
    assert scheduled_end(cfg, ask=lambda j: facts) == (scheduled or 1120.0)
