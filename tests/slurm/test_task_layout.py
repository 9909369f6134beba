"""End to end on the real local Slurm: the one-task-per-GPU layout (`srun --ntasks-per-node=G
traceml run train.py`, Lightning's and submitit's), zero flags. Each srun task is one rank (no
torchrun); rank 0 owns the aggregator, local rank 0 of each node the node's relay.

Real sbatch/srun, torch gloo DDP on CPU, TCP across network namespaces; GPUs are fake devices.
"""

from __future__ import annotations

import pytest

from e2e import REPO, check_lifecycles, hostnames, job_env, summary

SCRIPTS = REPO / "tests" / "zerocode" / "scripts"
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2", "--cpus-per-task=1")


def _job(script: str) -> str:
    """What a user writes: no flags, no token (each task derives the job's token from the
    per-user secret, as the node layout's launchers do)."""
    return f"""#!/bin/bash
srun --kill-on-bad-exit=1 traceml run {script}
"""


def _assert_four_ranks_on_two_nodes(data: dict, steps: int, source: str) -> None:
    assert data["run"]["status"] == "completed", data["run"]
    topo = data["topology"]
    assert (topo["nnodes"], topo["nproc_per_node"], topo["world_size"], topo["nodes_joined"]) == (2, 2, 4, 2)
    assert hostnames(data) == ["node1", "node2"]
    ranks = data["ranks"]
    assert [r["status"] for r in ranks] == ["clean"] * 4
    assert [(r["node"], r["host"], r["local_rank"]) for r in ranks] == \
        [(0, "node1", 0), (0, "node1", 1), (1, "node2", 0), (1, "node2", 1)]
    assert [r["steps"] for r in ranks] == [steps] * 4
    assert data["steps"]["source"] == source
    assert data["verdict"]["kind"] not in ("no_steps", "run_failed") and data["verdict"]["why"]


def test_one_task_per_gpu_lightning_with_zero_flags(slurm_cluster, tmp_path):
    """One job (CI minutes) for the layout's promises: 4 srun tasks on 2 nodes are 4 ranks with
    no torchrun, Lightning's steps from its hooks, one summary naming both nodes, printed once,
    and the link probe between the nodes measured as in the node layout."""
    pytest.importorskip("lightning")
    env = job_env(tmp_path, ZC_STEPS="25", ZC_NODES="2", ZC_DEVICES="2", PYTHONWARNINGS="ignore")
    env.pop("TRACEML_TOKEN", None)
    job, state, out = slurm_cluster.run_job(_job(f"{SCRIPTS}/lightning_ddp.py"), *TWO_BY_TWO, timeout=240,
                                            env=env)
    assert state == "COMPLETED", out
    data = summary(tmp_path)
    assert data["run"]["status"] == "completed", out
    _assert_four_ranks_on_two_nodes(data, 25, "lightning")
    assert "lightning: optimizer steps 25" in out
    assert data["run"]["name"].endswith(f"-{job}")
    assert "TraceML summary" in out and "4 clean" in out
    assert out.count("TraceML summary") == 1, "one summary, printed by rank 0's task"
    assert "torch.distributed.run" not in out
    # the link probe ran between the nodes' local rank 0 tasks, both directions measured
    probe = data["communication"]["probe"]
    assert probe is not None and probe["error"] is None, probe
    measured = {(p["src"], p["dst"]) for p in probe["pairs"] if p["error"] is None and p["nbytes"] > 0}
    assert measured == {(0, 1), (1, 0)}, probe["pairs"]
    assert probe["slow_link"] is None and probe["slow_node"] is None, probe
    # rank 0's task and node 2's first task reported their launch lifecycle
    check_lifecycles(data)


def test_tasks_that_do_not_match_the_gpus_are_refused(slurm_cluster, tmp_path):
    job, state, out = slurm_cluster.run_job(_job(f"{SCRIPTS}/plain_ddp.py"), "--nodes=1", "--ntasks-per-node=2",
                                            "--gres=gpu:3", "--cpus-per-task=1", timeout=90,
                                            env=job_env(tmp_path))
    assert state != "COMPLETED"
    assert "2 tasks per node" in out and "3 GPU(s)" in out and "--ntasks-per-node=3" in out
    assert "Traceback" not in out


def test_a_rank_raising_in_the_task_layout_is_the_headline_and_the_run_failed(slurm_cluster, tmp_path):
    """Rank 3 (node 2's second task) raises at step 30; srun --kill-on-bad-exit then SIGTERMs the
    other tasks. Rank 0's task knows only its own worker (stopped by that SIGTERM), yet the run
    failed, not "interrupted": rank 3's own exception came first, and the others are its
    consequences (the Lightning job above is the control: completed, nobody failed)."""
    faulty = REPO / "tests" / "faults" / "faulty_train.py"
    job, state, out = slurm_cluster.run_job(
        _job(f"{faulty} --steps 400 --step-ms 10 --fault raise --fault-rank 3 --fault-step 30"),
        *TWO_BY_TWO, timeout=180, env=job_env(tmp_path))
    assert state != "COMPLETED", out[-3000:]
    data = summary(tmp_path)
    assert data["run"]["status"] == "failed", data["run"]
    v = data["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"] == {"rank": 3, "node": 1, "host": "node2"}, v
    assert v["evidence"]["exception_type"] == "RuntimeError" and v["evidence"]["consequence_ranks"] == [0, 1, 2], v
    assert "SIGINT" not in v["why"] and "KeyboardInterrupt" not in v["why"], v["why"]
    assert "- failed, exit" in out and "Verdict: RUN-FAILED (critical): rank 3 (node 1, node2) raised RuntimeError" in out
