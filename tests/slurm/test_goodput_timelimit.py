"""The goodput ledger of jobs that meet their time limit on the real local Slurm cluster, with and
without the early warning of ``#SBATCH --signal=USR1@N``, against what the ranks recorded.

Three one-node jobs side by side (tests/slurm/goodput_train.py, checkpoints after steps 40 and 80
only, so that what came after is unsaved unless the warning's handler saves it):

* ``saved``: ``--signal=USR1@50``; the script saves a checkpoint on SIGUSR1 and ends: the
  attempt completes before the limit, and its end says when the warning came, how long before the
  limit, and that a checkpoint was saved after it;
* ``ignored``: ``--signal=USR1@50``; the script has no handler (the launcher keeps USR1 from
  killing the workers): the job runs on to its time limit; its end says the warning came and no
  checkpoint was saved after it, then the SIGTERM at the limit and the training lost since the
  last checkpoint;
* ``nosignal``: no ``--signal``: the SIGTERM at the limit with no early warning, and what was lost.

slurmctld enforces time limits and sends the warning on a 30 s tick (PERIODIC_TIMEOUT), so the
test sets the limits with ``scontrol update EndTime=`` once the jobs step: ``saved`` and
``ignored`` end 40 s later (the warning, 50 s, is due at once: it comes at the next tick), and
when it has come, ``ignored`` and ``nosignal`` are given an end 25 s after it, so their SIGTERM
comes at the tick after: about a minute of wall time in all, whatever the tick's phase.
"""

from __future__ import annotations

import datetime
import json
import re
import time

import pytest
import test_goodput_slurm as gp
from e2e import job_env

ARGS = "--steps 100000 --step-ms 50 --ckpt-every 40 --ckpt-until 80 --ckpt-ms 200 --give-step"
NODE = ("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1", "--time=5")
JOBS = {"saved": (ARGS + " --usr1", ("--signal=USR1@50",)),
        "ignored": (ARGS, ("--signal=USR1@50",)),
        "nosignal": (ARGS, ())}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    out: dict[str, gp.Job] = {}
    for name, (args, sbatch) in JOBS.items():
        d = tmp_path_factory.mktemp(f"goodput-tl-{name}")
        (d / "truth").mkdir()
        env = job_env(d / "logs", GOODPUT_TRUTH=str(d / "truth"))
        out[name] = gp.Job(name, slurm_cluster.submit(gp._script(args), f"--job-name=gp-tl-{name}", *NODE, *sbatch,
                                                      env=env), d)
    try:
        _drive(slurm_cluster, out)
        yield out
    finally:
        for job in out.values():
            slurm_cluster.run("scancel", job.id, check=False)


def _set_end(cluster, job: gp.Job, at: float) -> float:
    """Set the job's end, and return the end the controller then holds (EndTime, to the second;
    its TimeLimit is rounded to whole minutes, so StartTime + TimeLimit may be a minute off: the
    product must read EndTime, tests/slurm/test_scheduled_end_slurm.py)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))
    cluster.run("scontrol", "update", f"JobId={job.id}", f"EndTime={stamp}")
    shown = cluster.run("scontrol", "show", "job", job.id).stdout
    m = re.search(r"\bEndTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", shown)
    assert m, shown
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))


def _usr1_at(job: gp.Job) -> float | None:
    got = [r["t"] for rs in gp.records(job, 0).values() for r in rs if r["k"] == "usr1"]
    return min(got) if got else None


def _drive(cluster, jobs: dict[str, gp.Job]) -> None:
    deadline = time.monotonic() + 150
    while not all(gp.last_step(j, 0) >= 90 for j in jobs.values()):   # past the last periodic checkpoint
        assert time.monotonic() < deadline, {n: cluster.output(j.id)[-2000:] for n, j in jobs.items()}
        time.sleep(0.2)
    now = time.time()
    for name in ("saved", "ignored"):
        jobs[name].end_at_warning = _set_end(cluster, jobs[name], now + 40)   # type: ignore[attr-defined]
    while (t1 := _usr1_at(jobs["saved"])) is None:
        assert time.monotonic() < deadline + 40, cluster.output(jobs["saved"].id)[-3000:]
        time.sleep(0.2)
    for name in ("ignored", "nosignal"):
        jobs[name].end_moved_to = _set_end(cluster, jobs[name], t1 + 25)   # type: ignore[attr-defined]
    for name, want in (("saved", "COMPLETED"), ("ignored", "TIMEOUT"), ("nosignal", "TIMEOUT")):
        state = cluster.wait(jobs[name].id, timeout=120)
        assert state == want, (name, state, cluster.output(jobs[name].id)[-3000:])


def _limit_hit(cluster, job: gp.Job) -> float:
    """When slurmctld timed the job out (its log: "Time limit exhausted for JobId=N")."""
    log = (cluster.dir / "ctld" / "slurmctld.log").read_text(errors="replace")
    m = re.findall(rf"\[([0-9T:.-]+)\] Time limit exhausted for JobId={job.id}\b", log)
    assert m, f"no time limit in the controller's log for job {job.id}"
    return datetime.datetime.fromisoformat(m[-1]).timestamp()


def _unsaved_truth(job: gp.Job) -> float:
    recs = gp.records(job, 0)[0]
    last_step = max(r["end"] for r in recs if r["k"] == "step")
    last_ck = max((r["end"] for r in recs if r["k"] == "ckpt"), default=None)
    return last_step - last_ck if last_ck is not None else 0.0


def _attempt(job: gp.Job) -> tuple[dict, str]:
    data, text = gp.summary_of(job)
    (a,) = data["goodput"]["attempts"]
    gp.check_attempt(job, a, 0)   # every bucket against the rank's truth; the tail included
    print(f"--- {job.name}\n" + text[:1500])
    return a, text


def _advice(job: gp.Job) -> dict | None:
    return gp.summary_of(job)[0]["goodput"]["advice"]


def test_the_warning_handled_saves_and_ends_before_the_limit(jobs):
    job = jobs["saved"]
    a, text = _attempt(job)
    e = a["ending"]
    assert a["ended"] == "completed", a["reason"]
    warned = _usr1_at(job)
    assert e["warning"] == "SIGUSR1" and abs(e["warning_at"] - warned) < 1.0, (e, warned)
    assert abs(e["scheduled_end"] - job.end_at_warning) < 1.0, (e, job.end_at_warning)
    assert abs(e["warning_lead_s"] - (job.end_at_warning - warned)) < 1.0, e
    last_ck = max((r for rs in gp.records(job, 0).values() for r in rs if r["k"] == "ckpt"), key=lambda r: r["end"])
    assert last_ck["start"] >= warned - 0.5 and last_ck["step"] > 80, last_ck   # the handler's save
    assert e["saved_after_warning"] is True and a["progress"]["checkpoint_position"] == last_ck["step"], (e, a)
    assert e["ended_before_limit_s"] and abs(e["ended_before_limit_s"] - (job.end_at_warning - a["end"])) < 1.0
    assert a["progress"]["unsaved_s"] < 0.5, a["progress"]
    assert f"SIGUSR1 (the early warning of `#SBATCH --signal`) came {e['warning_lead_s']:,.1f} s before" in text
    assert "a checkpoint was saved" in text and "s before the limit" in text and "were not saved" not in text
    adv = _advice(job)
    assert adv is None or adv["bucket"] != "unsaved", adv   # the control: nothing was lost


@pytest.mark.parametrize("name", ["ignored", "nosignal"])
def test_the_time_limit_names_the_sigterm_and_the_work_lost(slurm_cluster, jobs, name):
    job = jobs[name]
    a, text = _attempt(job)
    e = a["ending"]
    assert a["ended"] == "time_limit" and "time limit" in a["reason"], a["reason"]
    hit = _limit_hit(slurm_cluster, job)
    assert e["sigterm_at"] is not None and 0 <= e["sigterm_at"] - hit < 5, (e, hit)
    lost = _unsaved_truth(job)
    assert lost > 0.5 and abs(a["progress"]["unsaved_s"] - lost) < 1.0, (a["progress"], lost)
    assert f"the last {a['progress']['unsaved_s']:,.1f} s of training, since the checkpoint after step 79, " in text
    assert "SIGTERM at the time limit" in text
    # the tail: from the last step to the end, the SIGTERM's grace and the summary in it
    assert a["buckets"]["tail"] > 0
    # the advice: the lost training outweighs every bucket (start-up, the tail), with the save that keeps it
    adv = _advice(job)
    assert adv is not None and adv["bucket"] == "unsaved", adv
    assert abs(adv["seconds"] - lost) < 1.0 and "before the time limit, since the checkpoint after step 79" in adv["why"]
    assert "advice: TRAINING NOT SAVED: " in text
    if name == "ignored":
        assert "Slurm sent SIGUSR1" in adv["next_step"] and "add a SIGUSR1 handler that saves" in adv["next_step"], adv
    else:
        assert "`#SBATCH --signal=USR1@600`" in adv["next_step"], adv
    if name == "ignored":
        assert e["warning"] == "SIGUSR1" and e["saved_after_warning"] is False, e
        # the end the controller held when the launcher asked, right after the warning: the test
        # moves it as soon as the saved job's worker has the warning, which on a loaded machine
        # can come first; either is what the controller said then
        ends = (job.end_at_warning, job.end_moved_to)
        assert any(abs(e["scheduled_end"] - end) < 1.0 for end in ends), (e, ends)
        assert abs(e["warning_lead_s"] - (e["scheduled_end"] - e["warning_at"])) < 1.0, e
        assert "no checkpoint was saved after it" in text and "the job ran on to SIGTERM" in text
    else:
        assert e["warning"] is None and e["warning_lead_s"] is None, e
        assert "with no early warning" in text
    json.dumps(e)
