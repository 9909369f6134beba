"""The fault table of loss accounting, on the real local Slurm cluster, against the truth.

Two nodes x one gloo DDP worker (tests/faults/faulty_train.py), every rank writing down each step
it completes in a shared directory: the truth. Then one fault per job: SIGKILL a rank, node 2's
launcher, node 0's aggregator, node 2's torchrun; scancel; the time limit. For every summary:

* a rank that said goodbye is counted exactly (``expected`` = its true step count);
* one that did not is within the bound the summary states (``unsent_max``), or says it has none;
* ``received + lost == expected`` per rank;
* ``complete`` is false whenever anything is missing, and "none lost" is printed only then.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from e2e import REPO, job_env, summary

TRAIN = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"


def truth(progress: Path) -> dict[int, int]:
    out = {}
    for f in progress.glob("rank*.txt"):
        out[int(f.stem[4:])] = sum(1 for ln in f.read_text().splitlines() if ln.startswith("step "))
    return out


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


def on_node(cluster, node: str, needle: bytes) -> list[int]:
    slurmd = int((cluster.dir / node / "slurmd.pid").read_text())
    found = []
    for pid in cluster.node_pids(node):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if pid != slurmd and needle in cmd:
            found.append(pid)
    return found


def check_against_truth(data: dict, real: dict[int, int], out: str) -> dict:
    tel = data["telemetry"]
    exact = True
    for r in data["ranks"]:
        t = r["telemetry"]
        did = real.get(r["rank"], 0)
        if t["expected"] is None:
            assert t["unsent_max"] is None
            exact = exact and did == 0
            continue
        assert t["received"] + t["lost"] == t["expected"], t
        assert t["received"] <= did + 1 and t["expected"] <= did + 1, (r["rank"], t, did)
        if t["unsent_max"] == 0:   # said goodbye: exact
            assert t["expected"] >= did, (r["rank"], t, did)
        elif t["unsent_max"] is not None:  # the bound it states holds
            assert did - t["expected"] <= t["unsent_max"], (r["rank"], t, did)
        exact = exact and t["expected"] >= did and t["lost"] == 0
    if not exact:
        assert not tel["complete"], (tel, real)
    assert ("none lost" in out) == tel["complete"], (tel, out[-1500:])
    return tel


def _job(cluster, tmp_path, steps: int, name: str, extra: str = "", sbatch=()):
    progress = tmp_path / "progress"
    progress.mkdir()
    script = (f"#!/bin/bash\n{TOKEN}srun --kill-on-bad-exit=1 traceml run {TRAIN} --steps {steps} "
              f"--step-ms 25 --run-name={name} {extra}\n")
    job = cluster.submit(script, *TWO_NODES, *sbatch, env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    return job, progress


def _wait_steps(progress: Path, rank: int, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while steps_done(progress, rank) < n:
        assert time.monotonic() < deadline, f"rank {rank} did not reach step {n}"
        time.sleep(0.1)


@pytest.mark.parametrize("fault", ["rank", "launcher", "aggregator", "torchrun", "scancel"])
def test_every_fault_is_counted_or_bounded(slurm_cluster, tmp_path, fault):
    job, progress = _job(slurm_cluster, tmp_path, 100000 if fault != "aggregator" else 600, f"f-{fault}")
    _wait_steps(progress, 1, 60)
    if fault == "rank":
        os.kill(pid_of(progress, 1), signal.SIGKILL)
    elif fault == "launcher":
        pids = [p for p in on_node(slurm_cluster, "node2", b"traceml run")
                if b"torch" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert pids, "no launcher on node2"
        for p in pids:
            os.kill(p, signal.SIGKILL)
    elif fault == "aggregator":
        pids = on_node(slurm_cluster, "node1", b"traceml_core.aggregator")
        assert pids, "no aggregator on node1"
        os.kill(pids[0], signal.SIGKILL)
    elif fault == "torchrun":
        pids = on_node(slurm_cluster, "node2", b"torch.distributed.run")
        assert pids, "no torchrun on node2"
        os.kill(pids[0], signal.SIGKILL)
    else:
        slurm_cluster.run("scancel", job)
    slurm_cluster.wait(job, timeout=150)
    out = slurm_cluster.output(job)
    data = summary(tmp_path, f"f-{fault}")
    real = truth(progress)
    tel = check_against_truth(data, real, out)
    print(f"{fault}: truth {real}, received {tel['records_received']}, lost {tel['records_lost']}, "
          f"unsent_max {tel['records_unsent_max']}, complete {tel['complete']}")
    if fault == "aggregator":  # restarted from its checkpoint: every rank counted exactly
        assert tel["aggregator_restarts"] == 1 and data["run"]["status"] == "completed"
        assert all(r["telemetry"]["expected"] == real[r["rank"]] for r in data["ranks"])
    else:
        assert not tel["complete"]  # some rank ended without a goodbye


def test_time_limit_is_counted_or_bounded(slurm_cluster, tmp_path):
    job, progress = _job(slurm_cluster, tmp_path, 10_000_000, "f-limit", sbatch=("--time=1",))
    state = slurm_cluster.wait(job, timeout=200)
    assert state == "TIMEOUT"
    out = slurm_cluster.output(job)
    data = summary(tmp_path, "f-limit")
    tel = check_against_truth(data, truth(progress), out)
    assert data["run"]["status"] == "interrupted"
    assert re.search(r"Telemetry: [\d,]+ step records received", out)
    assert not tel["complete"] or tel["records_unsent_max"] == 0
