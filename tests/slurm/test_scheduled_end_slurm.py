"""When the controller means to end a running job, as the launcher asks it on the early warning of
``#SBATCH --signal``, on the real local Slurm cluster.

The warning is sent as SIGCONT, then the signal asked for; while the SIGCONT is on its way to the
nodes the job's state reads SIGNALING, not RUNNING. A launcher asking in that window was told
StartTime + TimeLimit instead of EndTime: after ``scontrol update EndTime=`` the two differ (the
controller keeps the limit in whole minutes, rounded), and CI's summary put the time limit 67 s
late. Here the window is held open, not waited for: the node's slurmd is stopped, so the SIGCONT
of ``scancel --signal=CONT`` (the same controller path) waits unanswered.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from traceml_slurm.controller import parse_duration
from traceml_slurm.interrupts import controller_state, scheduled_end

NODE = "node3"


def _shown(cluster, job_id: str) -> dict[str, str]:
    return cluster.job_info(job_id)[0]


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def _wait_state(cluster, job_id: str, want: str, bound_s: float) -> dict[str, str]:
    deadline = time.monotonic() + bound_s
    while (rec := _shown(cluster, job_id))["JobState"] != want:
        assert time.monotonic() < deadline, f"job {job_id} is {rec['JobState']}, not {want}, after {bound_s:.0f} s"
        time.sleep(0.2)
    return rec


def test_a_job_reading_signaling_is_still_ended_at_its_endtime(slurm_cluster):
    job = slurm_cluster.submit("#!/bin/bash\nsleep 300\n", "--job-name=sched-end", f"--nodelist={NODE}",
                               "--nodes=1", "--ntasks=1", "--time=5")
    try:
        rec = _wait_state(slurm_cluster, job, "RUNNING", 60)
        start = _epoch(rec["StartTime"])
        # an end 53 s past a whole minute after the start (and 20 s or more away) leaves the
        # TimeLimit rounded to whole minutes: StartTime + TimeLimit is 67 s after it
        end_asked = start + 53
        while end_asked < time.time() + 20:
            end_asked += 60
        slurm_cluster.run("scontrol", "update", f"JobId={job}",
                          "EndTime=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end_asked)))
        rec = _shown(slurm_cluster, job)
        end, limit_end = _epoch(rec["EndTime"]), start + parse_duration(rec["TimeLimit"])
        assert abs(end - int(end_asked)) < 1.0 and abs(limit_end - end) > 10, rec   # two different answers
        config = SimpleNamespace(job_id=job, job_end_time=None)
        assert scheduled_end(config) == end, rec   # RUNNING: EndTime
        seen: list[dict] = []

        def ask(job_id: str):
            seen.append(controller_state(job_id))
            return seen[-1]

        with slurm_cluster.slurmd_stopped(NODE):
            slurm_cluster.run("scancel", "--signal=CONT", job)
            _wait_state(slurm_cluster, job, "SIGNALING", 8)
            got = scheduled_end(config, ask=ask)
        assert seen[0]["state"] == "SIGNALING", seen   # asked while the SIGCONT was on its way
        assert got == end, (got, end, limit_end, seen)
        _wait_state(slurm_cluster, job, "RUNNING", 60)   # the node answered: the job runs on
    finally:
        slurm_cluster.run("scancel", job, check=False)
