"""`srun traceml run --print-config --json` in a real 2-node job resolves on each node."""

from __future__ import annotations

import json

from e2e import job_env


def test_two_node_job_resolves_on_each_node_and_batch_shell_is_refused(slurm_cluster, tmp_path):
    script = """#!/bin/bash
srun bash -c 'traceml run --print-config --json train.py > "cfg.$SLURM_NODEID.json"'
echo "BATCH-SHELL-RC: $(traceml run --print-config --json train.py >/dev/null 2>batch.err; echo $?)"
cat batch.err
"""
    job, state, out = slurm_cluster.run_job(script, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2",
                                            "--cpus-per-task=1", env=job_env(tmp_path), cwd=tmp_path)
    assert state == "COMPLETED", out
    by_task = {int(p.name.split(".")[1]): json.loads(p.read_text())["config"] for p in tmp_path.glob("cfg.*.json")}
    assert sorted(by_task) == [0, 1], out
    for task, cfg in by_task.items():
        assert cfg["nnodes"] == {"value": 2, "source": "slurm:SLURM_STEP_NUM_NODES"}
        assert cfg["node_rank"] == {"value": task, "source": "slurm:SLURM_NODEID"}
        assert cfg["nproc_per_node"] == {"value": 2, "source": "slurm:SLURM_GPUS_ON_NODE"}
        assert cfg["master_addr"]["value"] == "node1"
        assert cfg["node_name"]["value"] == f"node{task + 1}"
        assert cfg["run_name"]["value"] == by_task[0]["run_name"]["value"]
        assert cfg["job_id"]["value"] == job
    assert "BATCH-SHELL-RC: 2" in out
    assert "batch shell of a 2-node job" in out and "srun --nodes=2 --ntasks-per-node=1" in out


def test_task_layout_warns_when_a_task_sees_fewer_gpus_than_its_local_rank_needs(slurm_cluster, tmp_path):
    """`--gpus-per-task=1`: each task sees one GPU, so `set_device(LOCAL_RANK)` would fail on local
    rank 1; the node's first such rank says so. Control: the same tasks with the node's GPUs."""
    script = """#!/bin/bash
srun --ntasks-per-node=2 --gpus-per-task=1 bash -c 'traceml run --print-config --json train.py > per-task.$SLURM_LOCALID.json'
srun --ntasks-per-node=2 --gres=gpu:2 bash -c 'traceml run --print-config --json train.py > per-node.$SLURM_LOCALID.json'
"""
    job, state, out = slurm_cluster.run_job(script, "--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2",
                                            "--cpus-per-task=1", env=job_env(tmp_path), cwd=tmp_path)
    assert state == "COMPLETED", out
    cfg = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("per-*.json")}
    assert sorted(cfg) == ["per-node.0.json", "per-node.1.json", "per-task.0.json", "per-task.1.json"], out
    assert all(c["config"]["layout"]["value"] == "task" for c in cfg.values())
    said = [w for w in cfg["per-task.1.json"]["warnings"] if "invalid device ordinal" in w]
    assert len(said) == 1 and "local rank 1 (rank 1, node 0) sees 1 GPU (CUDA_VISIBLE_DEVICES=" in said[0], said
    assert "--gpus-per-task" in said[0] and "LOCAL_RANK % torch.cuda.device_count()" in said[0]
    for name in ("per-task.0.json", "per-node.0.json", "per-node.1.json"):
        assert not [w for w in cfg[name]["warnings"] if "invalid device ordinal" in w], (name, cfg[name]["warnings"])
