"""Input-bound joined with the CPU (issue 25 item 3): what a rank measures of the processes that feed
it (sdk/threads.py: real worker processes, pinned to one CPU), the cause the input-bound verdict
names from it (report/cpubinding.py, through the real ingest and summary code), the line for the
next job script (report/nextjob.py), and the Slurm plugin's CPU request (traceml_slurm/cpus.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest

from aggpeers import columns, make_settings, relayed
from traceml_core.aggregator.adapter import run_data
from traceml_core.aggregator.state import RunState
from traceml_core.report.document import document, read
from traceml_core.report.nextjob import amend
from traceml_core.report.summary import build_summary
from traceml_core.report.verdicts import say
from traceml_core.rundata import LaunchEnd, RankBye
from traceml_slurm.cpus import cpu_request, passes_on

S = 1_000_000_000
SLURM_22 = {"scheduler": "Slurm", "version": "22.05.8", "cpus_per_task": 1,
            "cpus_per_task_source": "Slurm's default: no --cpus-per-task", "srun_cpus_per_task": None,
            "cpus_on_node": 4, "fix": ["#SBATCH --cpus-per-task={n}", "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"],
            "pass_on": ["export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"]}


def fact(cpus: int, workers: int, wrun: float, wwait: float, rank: float = 0.3, request: Optional[dict] = None,
         throttled: float = 0.0) -> dict[str, Any]:
    """A ``cpu_threads`` event's fields: ``cpus`` CPUs, ``workers`` DataLoader workers that were
    on a CPU ``wrun`` and runnable waiting ``wwait`` CPU-seconds per second, over 10 s."""
    return {"threads": 1, "cpus": cpus, "cpuset": [[0, cpus - 1]], "steps": 200, "steps0": 5,
            "wall_ns": 20 * S, "wall0_ns": 10 * S, "wrun_ns": int(wrun * 10 * S), "wrun0_ns": 0,
            "wwait_ns": int(wwait * 10 * S), "wwait0_ns": 0, "pcpu_ns": int(rank * 10 * S) + 5 * S,
            "pcpu0_ns": 5 * S, "thr_ns": int(throttled * 10 * S), "thr0_ns": 0, "workers": workers,
            "omp": "1", "request": request}


def summary(facts: Optional[dict[str, Any]], input_ms: float = 30.0) -> dict[str, Any]:
    """Two ranks on one node waiting ``input_ms`` of a 50 ms step for data, each with ``facts``."""
    st = RunState(make_settings(Path("/nonexistent"), nnodes=1, nproc_per_node=2))
    for rank in range(2):
        rs = st.rank(rank)
        rs.node, rs.host = 0, "node1"
        if facts is not None:
            rs.note_event("cpu_threads", json.dumps(facts), 1.0)
        rs.bye = RankBye("clean", 200, None, 0.0)
        for seq in range(0, 200, 50):
            rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": seq, "n": 50, "dropped": 0,
                                    "cols": columns(50, seq, t0_ns=1_700_000_000 * S, step_ms=50.0,
                                                    input_ms=input_ms, forward_ms=8.0, backward_ms=8.0,
                                                    optimizer_ms=2.0)}))
    st.finish = LaunchEnd(exit_code=0)
    s = json.loads(json.dumps(build_summary(run_data(st))))
    for v in [s["verdict"]] + s["other_verdicts"]:  # the sentences come back from the evidence alone
        assert say(v["kind"], v["evidence"]) == (v["why"], v["next_step"])
    return s


def input_bound(s: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in [s["verdict"]] + s["other_verdicts"] if v["kind"] == "input_bound")


def test_four_busy_workers_on_one_cpu_are_the_binding_cause_with_the_sbatch_fix():
    s = summary(fact(cpus=1, workers=4, wrun=0.7, wwait=3.1, request=SLURM_22))
    v = input_bound(s)
    assert v["evidence"]["cpu"]["cause"] == "cpu_binding"
    assert "4 DataLoader worker(s) and the rank share 1 CPU" in v["why"]
    assert "Slurm gave each task 1 CPU: Slurm's default: no --cpus-per-task" in v["why"]
    assert v["next_step"].endswith("in the next job script: #SBATCH --cpus-per-task=5; "
                                   "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"), v["next_step"]
    doc = read(s)
    amend(doc)
    s = document(doc)
    assert s["next_job"]["lines"] == ["#SBATCH --cpus-per-task=5", "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"]


def test_sleeping_workers_are_not_blamed_on_the_cpu():
    s = summary(fact(cpus=1, workers=4, wrun=0.02, wwait=0.01, request=SLURM_22))
    v = input_bound(s)
    assert v["evidence"]["cpu"]["cause"] == "not_cpu"
    assert "the CPU is not the limit" in v["why"] and "--cpus-per-task" not in v["next_step"]
    doc = read(s)
    amend(doc)
    s = document(doc)
    assert "next_job" not in s


def test_a_request_srun_did_not_pass_on_gets_the_export_line():
    req = dict(SLURM_22, cpus_per_task=8, cpus_per_task_source="--cpus-per-task, SLURM_CPUS_PER_TASK")
    v = input_bound(summary(fact(cpus=1, workers=4, wrun=0.9, wwait=2.5, request=req)))
    assert v["evidence"]["cpu"]["cause"] == "not_inherited"
    assert "the job asks for 8 CPUs per task but each rank may run on 1 CPU" in v["why"]
    assert "srun of Slurm 22.05.8 does not pass --cpus-per-task on" in v["why"]
    assert v["next_step"].endswith("in the next job script: export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK")


def test_without_a_cluster_the_advice_names_the_cpus_and_no_sbatch_line():
    v = input_bound(summary(fact(cpus=2, workers=4, wrun=1.9, wwait=2.0)))
    assert v["evidence"]["cpu"]["cause"] == "cpu_binding" and v["evidence"]["cpu"]["fix_lines"] == []
    assert v["next_step"] == "give each rank 5 CPUs, or use num_workers=1"


def test_busy_workers_with_cpus_left_over_and_no_workers_at_all():
    v = input_bound(summary(fact(cpus=8, workers=2, wrun=1.9, wwait=0.0)))
    assert v["evidence"]["cpu"]["cause"] == "few_workers" and "raise num_workers to 7" in v["next_step"]
    v = input_bound(summary(fact(cpus=8, workers=0, wrun=0.0, wwait=0.0, rank=1.0)))
    assert v["evidence"]["cpu"]["cause"] == "no_workers" and v["next_step"] == "make them in a DataLoader with num_workers=7"
    # no workers, and the rank's fetch waits (a wrapped get_batch that reads or sleeps): not the CPU
    v = input_bound(summary(fact(cpus=8, workers=0, wrun=0.0, wwait=0.0, rank=0.1)))
    assert v["evidence"]["cpu"]["cause"] == "not_cpu" and "no DataLoader workers" in v["why"]
    assert "num_workers=" not in v["next_step"]


def test_a_cpu_quota_is_named_before_the_cores():
    v = input_bound(summary(fact(cpus=4, workers=4, wrun=1.0, wwait=3.0, throttled=0.4, request=SLURM_22)))
    assert v["evidence"]["cpu"]["cause"] == "cpu_quota" and "throttled its CPU 40% of the time" in v["why"]


def test_ranks_that_did_not_say_leave_the_verdict_as_it_was():
    v = input_bound(summary(None))
    assert v["evidence"]["cpu"] is None and "num_workers" in v["next_step"]
    old = {"threads": 1, "cpus": 1, "cpuset": [[0, 0]]}  # an older SDK's event
    assert input_bound(summary(old))["evidence"]["cpu"] is None


PROBE = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys, threading, time
    from traceml_core.sdk.threads import Feeders
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    def busy(stop):
        while not stop.is_set():
            sum(i * i for i in range(1000))
    def sleepy(stop):
        while not stop.is_set():
            time.sleep(0.05)
    feed = Feeders(threading.get_native_id())
    stop = mp.get_context("fork").Event()
    target = busy if sys.argv[1] == "busy" else sleepy
    procs = [mp.get_context("fork").Process(target=target, args=(stop,)) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    first = feed.sample()
    for _ in range(10):
        time.sleep(0.15)
        feed.count()
    last = feed.sample()
    stop.set()
    for p in procs:
        p.join()
    wall = last["wall_ns"] - first["wall_ns"]
    print(json.dumps({"workers": feed.most_workers, "run": (last["wrun_ns"] - first["wrun_ns"]) / wall,
                      "wait": (last["wwait_ns"] - first["wwait_ns"]) / wall}))
""")


@pytest.mark.skipif(not Path("/proc/self/task").exists() or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux /proc and CPU affinity")
@pytest.mark.parametrize("kind", ["busy", "sleepy"])
def test_the_rank_measures_its_workers_on_its_one_cpu(kind):
    """Two real worker processes on one CPU: computing, they are on it or waiting for it all the
    time (2 CPU-seconds per second in all, at most 1 of them on it); sleeping, neither."""
    got = json.loads(subprocess.run([sys.executable, "-c", PROBE, kind], capture_output=True, text=True,
                                    timeout=120, check=True).stdout)
    assert got["workers"] == 2
    if kind == "busy":
        assert got["run"] <= 1.1 and got["run"] + got["wait"] >= 1.5, got
    else:
        assert got["run"] + got["wait"] < 0.3, got


def test_the_slurm_request_says_what_the_task_got_and_the_lines_that_fit_its_version():
    env = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "4", "PATH": ""}
    got = cpu_request(env, version="22.05.8")
    assert got["cpus_per_task"] == 1 and got["cpus_per_task_source"] == "Slurm's default: no --cpus-per-task"
    assert got["fix"] == ["#SBATCH --cpus-per-task={n}", "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"]
    got = cpu_request({**env, "SLURM_CPUS_PER_TASK": "8"}, version="24.11.1")
    assert (got["cpus_per_task"], got["fix"], got["pass_on"]) == (8, ["#SBATCH --cpus-per-task={n}"], [])
    assert cpu_request({**env, "SLURM_CPUS_PER_TASK": "eight"}, version="24.11.1")["cpus_per_task"] == 1
    assert cpu_request({"PATH": ""}, version="24.11.1") is None
    assert [passes_on(v) for v in ("21.08.8", "22.05.8", "23.02.1", "23.11.0", "25.11.7", None)] == \
        [True, False, False, True, True, None]
