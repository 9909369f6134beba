"""Slurm context checks over environment mappings: where we run, task layout, launch config, stale vars."""

from __future__ import annotations

from doctor_env import batch, make, step

from traceml_slurm.doctor import context as C
from traceml_slurm.doctor.model import Status
from traceml_slurm.doctor.node import Options


def test_outside_any_allocation_fails_with_the_salloc_line():
    o = C.check_context(make({"PATH": "/usr/bin"}))
    assert o.status is Status.FAIL and "not inside a Slurm allocation" in o.observed
    assert "salloc" in o.fix and "traceml slurm doctor" in o.fix


def test_each_context_is_named():
    assert "batch shell of job 42 (2 nodes)" in C.check_context(make(batch())).observed
    assert "srun step 42.0" in C.check_context(make(step())).observed
    salloc = {k: v for k, v in batch().items() if k not in ("SLURM_NODEID", "SLURMD_NODENAME", "SLURM_PROCID",
                                                           "SLURM_LOCALID")}
    assert C.check_context(make(salloc)).status is Status.PASS
    local = C.check_context(make(salloc, options=Options(local=True)))
    assert local.status is Status.WARN and "--local" in local.observed and "srun --overlap" in local.fix
    inter = C.check_context(make(step(SLURM_STEP_ID="interactive", SLURM_STEP_NUM_NODES="1")))
    assert "interactive step" in inter.observed


def test_malformed_slurm_variable_is_a_failed_check_not_a_crash():
    o = C.check_context(make(step(SLURM_NNODES="two")))
    assert o.status is Status.FAIL and "SLURM_NNODES" in o.observed


def test_one_task_per_gpu_is_a_layout_and_uneven_tasks_fail():
    o = C.check_tasks_per_node(make(step(SLURM_STEP_TASKS_PER_NODE="4(x2)")))
    assert o.status is Status.PASS and "one-task-per-GPU layout" in o.observed and o.data["layout"] == "task"
    o = C.check_tasks_per_node(make(batch(SLURM_TASKS_PER_NODE="4(x2)")))
    assert o.status is Status.PASS and "--ntasks-per-node=1" in o.observed
    o = C.check_tasks_per_node(make(step(SLURM_STEP_TASKS_PER_NODE="2,1")))
    assert o.status is Status.FAIL and "different number of tasks" in o.observed
    assert C.check_tasks_per_node(make(batch())).status is Status.PASS


def test_launch_config_resolves_in_a_step_with_sources():
    o = C.check_launch_config(make(step(SLURM_NODEID="1", SLURMD_NODENAME="gpu08")))
    cfg = o.data["config"]
    assert cfg["node_rank"] == {"value": 1, "source": "slurm:SLURM_NODEID"}
    port = cfg["master_port"]
    assert port["source"] == "slurm:SLURM_JOB_ID"  # job-derived under Slurm
    assert cfg["master_addr"]["value"] == "gpu07" and f"master=gpu07:{port['value']}" in o.observed
    assert o.status is Status.WARN  # no GPU allocated: the resolver's warning is passed on
    assert "no GPU is allocated" in o.observed


def test_launch_config_from_a_multinode_batch_shell_shows_node0s_step():
    o = C.check_launch_config(make(batch(SLURM_GPUS_ON_NODE="4")))
    assert o.status is Status.PASS and o.data["emulated"] is True
    assert "as node 0's `srun` step would resolve it" in o.observed and "nproc_per_node=4" in o.observed


def test_launch_config_refusal_is_a_failed_check_with_the_resolvers_message():
    o = C.check_launch_config(make(step(TRACEML_NODE_RANK="0", SLURM_NODEID="1", SLURM_GPUS_ON_NODE="2")))
    assert o.status is Status.FAIL and "per-node expansion gotcha" in o.observed


def test_stale_launcher_variables_are_named():
    o = C.check_stale_env(make(step(MASTER_ADDR="127.0.0.1", WORLD_SIZE="8")))
    assert o.status is Status.WARN and "MASTER_ADDR=127.0.0.1" in o.observed and "unset MASTER_ADDR WORLD_SIZE" in o.fix
    assert C.check_stale_env(make(step())).status is Status.PASS
