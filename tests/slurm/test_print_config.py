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
