"""The fault table of loss accounting, on the real local Slurm cluster, against the truth.

Two nodes x one gloo DDP worker (tests/faults/faulty_train.py), every rank writing down each step
it completes in a shared directory: the truth. One fault per job: SIGKILL a rank, node 2's
launcher, node 0's aggregator, node 2's torchrun; scancel. (The time limit is the job of
tests/slurm/test_multinode.py::test_time_limit_writes_interrupted_summary, checked with
:func:`check_against_truth` too.) For every summary:

* a rank that said goodbye is counted exactly (``expected`` = its true step count);
* one that did not is within the bound the summary states (``unsent_max``), or says it has none;
* ``received + lost == expected`` per rank;
* ``complete`` is false whenever anything is missing, and "none lost" is printed only then.

The five jobs run side by side on node1+node2 (4 CPUs and 4 GPUs each; every job takes one of
each per node), so the table costs about one job's time; the faults find their processes by the
job id in the environment. Every job is scancelled at the end, whatever happened.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from e2e import REPO, check_against_truth, job_env, summary, truth

TRAIN = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1", "-w", "node1,node2")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
FAULTS = ("rank", "launcher", "aggregator", "torchrun", "scancel")


def pid_of(progress: Path, rank: int) -> int:
    for ln in (progress / f"rank{rank}.txt").read_text().splitlines():
        if ln.startswith("pid "):
            return int(ln.split()[1])
    raise AssertionError(f"rank {rank} wrote no pid")


def steps_done(progress: Path, rank: int) -> int:
    try:
        return truth(progress).get(rank, 0)
    except OSError:
        return 0


def of_job(cluster, node: str, job: str, needle: bytes) -> list[int]:
    """Pids on ``node`` of job ``job`` (SLURM_JOB_ID in their environment) whose command line
    holds ``needle``."""
    slurmd = int((cluster.dir / node / "slurmd.pid").read_text())
    mark = f"SLURM_JOB_ID={job}\0".encode()
    found = []
    for pid in cluster.node_pids(node):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if pid != slurmd and needle in cmd and (b"\0" + mark in env or env.startswith(mark)):
            found.append(pid)
    return found


@dataclass
class Job:
    fault: str
    id: str
    logs: Path
    progress: Path
    data: Optional[dict[str, Any]] = None
    text: str = ""
    real: Optional[dict[int, int]] = None
    error: str = ""


def _submit(cluster, root: Path, fault: str) -> Job:
    logs, progress = root / fault, root / fault / "progress"
    progress.mkdir(parents=True)
    steps = 600 if fault == "aggregator" else 100_000
    # no --kill-on-bad-exit: a node whose task died does not make srun SIGTERM node 0, which then
    # ends the run because its rank's peer is gone, and writes its summary without a KillWait race
    # (the scancel row is that race; tests/slurm/test_faults_slurm.py times it)
    script = (f"#!/bin/bash\n{TOKEN}srun traceml run {TRAIN} --steps {steps} "
              f"--step-ms 25 --run-name=f-{fault}\n")
    job = cluster.submit(script, *TWO_NODES, env=job_env(logs, FAULT_PROGRESS_DIR=str(progress)))
    return Job(fault, job, logs, progress)


def _wait_steps(job: Job, rank: int, n: int, deadline: float) -> None:
    while steps_done(job.progress, rank) < n:
        assert time.monotonic() < deadline, f"{job.fault}: rank {rank} did not reach step {n}"
        time.sleep(0.1)


def _inject(cluster, job: Job) -> None:
    fault = job.fault
    if fault == "rank":
        os.kill(pid_of(job.progress, 1), signal.SIGKILL)
        return
    if fault == "scancel":
        cluster.run("scancel", job.id)
        return
    node, needle = {"launcher": ("node2", b"traceml run"),
                    "aggregator": ("node1", b"traceml_core.aggregator"),
                    # torchrun runs as `python -m traceml_core.launcher.agent` (launcher/agent.py)
                    "torchrun": ("node2", b"traceml_core.launcher.agent")}[fault]
    pids = of_job(cluster, node, job.id, needle)
    if fault == "launcher":  # the launcher itself, not its torchrun or ranks
        pids = [p for p in pids if b"torch" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert pids, f"no {fault} process of job {job.id} on {node}"
    for p in pids if fault == "launcher" else pids[:1]:
        os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="module")
def fault_table(slurm_cluster, tmp_path_factory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("faults")
    jobs: dict[str, Job] = {}
    try:
        for fault in FAULTS:
            jobs[fault] = _submit(slurm_cluster, root, fault)
        deadline = time.monotonic() + 300  # five jobs start side by side on a loaded machine
        for job in jobs.values():
            try:
                _wait_steps(job, 1, 60, deadline)
                _inject(slurm_cluster, job)
            except AssertionError as exc:
                job.error = str(exc)
        for job in jobs.values():
            slurm_cluster.wait(job.id, timeout=150)
            try:
                job.data = summary(job.logs, f"f-{job.fault}")
                job.text = (job.logs / f"f-{job.fault}" / "final_summary.txt").read_text()
            except (AssertionError, OSError) as exc:
                job.error = job.error or f"no summary: {exc}"
            job.real = truth(job.progress)
        return jobs
    finally:  # a failed step must not leave a 100,000-step job on the cluster
        for job in jobs.values():
            slurm_cluster.run("scancel", job.id, check=False)


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_is_counted_or_bounded(fault_table, fault):
    job = fault_table[fault]
    assert not job.error, job.error
    tel = check_against_truth(job.data, job.real, job.text)
    print(f"{fault}: truth {job.real}, received {tel['records_received']}, lost {tel['records_lost']}, "
          f"unsent_max {tel['records_unsent_max']}, complete {tel['complete']}")
    if fault == "aggregator":  # restarted from its checkpoint: every rank counted exactly
        assert tel["aggregator_restarts"] == 1 and job.data["run"]["status"] == "completed"
        assert all(r["telemetry"]["expected"] == job.real[r["rank"]] for r in job.data["ranks"])
    else:
        assert not tel["complete"]  # some rank ended without a goodbye
