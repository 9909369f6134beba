"""The resolver over REAL environment dumps captured on the local Slurm cluster.

Each dump in tests/fixtures/slurm_env/ is the full environment of a process in one situation
(capture.py regenerates them; tests/slurm/test_env_fixtures.py checks they are still fresh).
The table says what `traceml run` must resolve there, or which refusal it must give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_slurm.environment import SlurmEnvironment

ROOT = Path(__file__).parents[1] / "fixtures" / "slurm_env"
#: one directory of dumps per Slurm generation (22.05, 24.11); every test runs on each
GENERATIONS = sorted(d.name for d in ROOT.iterdir() if d.is_dir() and any(d.glob("*.json")))

# file -> (nnodes, node_rank, nproc_per_node, master_addr) or the refusal text expected
OK = {
    "gres_step_node0": (2, 0, 2, "node1"), "gres_step_node1": (2, 1, 2, "node1"),
    "gpn_step_node0": (2, 0, 2, "node1"), "gpn_step_node1": (2, 1, 2, "node1"),
    "gpntyped_step_node0": (2, 0, 2, "node1"), "gpntyped_step_node1": (2, 1, 2, "node1"),
    "single_batch": (1, 0, 2, "node1"), "single_step": (1, 0, 2, "node1"),
    "wnode2_step": (1, 0, 2, "node2"),
    "nogpu_launcher_step_node0": (2, 0, 1, "node1"), "nogpu_launcher_step_node1": (2, 1, 1, "node1"),
    "salloc_step_node0": (2, 0, 2, "node1"), "salloc_step_node1": (2, 1, 2, "node1"),
    "requeue_step_node0": (2, 0, 2, "node1"), "requeue_step_node1": (2, 1, 2, "node1"),
    "array_task0_step": (1, 0, 1, "node1"), "array_task1_step": (1, 0, 1, "node1"),
    "array_task0_batch": (1, 0, 1, "node1"),
    "het_group1_step": (1, 0, 2, "node2"),
}
REFUSED = {
    "gres_batch": "batch shell of a 2-node job", "gpn_batch": "batch shell", "gpntyped_batch": "batch shell",
    "nogpu_batch": "batch shell", "requeue_batch": "batch shell", "uneven_batch": "batch shell",
    "salloc_shell": "salloc shell", "salloc_interactive_step": "interactive step",
    "uneven_step_node0": "SLURM_STEP_TASKS_PER_NODE=2(x2),1",
    "uneven_step_node2": "different number of tasks on different nodes",
    "het_span_step_node0": "heterogeneous", "het_span_step_node1": "heterogeneous",
}


# one srun task per GPU (2 tasks per node, 2 GPUs per node): file -> (task rank, local rank, node rank)
TASK = {"tasks2_step_node0": (0, 0, 0), "tasks2_step_node1": (2, 0, 1)}


@pytest.fixture(params=GENERATIONS)
def gen(request) -> str:
    return request.param


def load(name: str, gen: str) -> dict:
    env = json.loads((ROOT / gen / f"{name}.json").read_text())
    env.pop("_meta", None)
    return env


def test_every_dump_is_in_the_table(gen):
    names = {p.stem for p in (ROOT / gen).glob("*.json")}
    untested = names - set(OK) - set(REFUSED) - set(TASK) - {"het_batch", "nogpucpt_batch", "nogpucpt_launcher_step_node0",
                                                 "nogpucpt_launcher_step_node1", "uneven_step_node1",
                                                 "array_task1_batch", "salloc_pty_step"}
    assert not untested, f"dumps without an expectation: {sorted(untested)}"


@pytest.mark.parametrize("name", sorted(OK))
def test_resolves(name, gen):
    env = load(name, gen)
    c = resolve({}, env, [SlurmEnvironment])
    assert (c.nnodes, c.node_rank, c.nproc_per_node, c.master_addr) == OK[name]
    assert c.cluster == "slurm" and c.job_id == env["SLURM_JOB_ID"]
    assert c.logs_dir == env["SLURM_SUBMIT_DIR"] + "/logs"
    assert c.aggregator_bind_host == ("0.0.0.0" if c.nnodes > 1 else "127.0.0.1")
    if c.hostnames:  # in a step: every node's name by node rank, this node's included
        assert len(c.hostnames) == c.nnodes and c.hostnames[0] == c.master_addr
        assert c.hostnames[c.node_rank] == env["SLURMD_NODENAME"]


@pytest.mark.parametrize("name", sorted(TASK))
def test_one_task_per_gpu_step_resolves_each_task_as_one_rank(name, gen):
    env = load(name, gen)
    c = resolve({}, env, [SlurmEnvironment])
    assert c.layout == "task" and c.source("layout") == "slurm:SLURM_STEP_TASKS_PER_NODE=2(x2)"
    assert (c.task_rank, c.local_rank, c.node_rank) == TASK[name]
    assert (c.nnodes, c.nproc_per_node, c.world_size, c.master_addr) == (2, 2, 4, "node1")
    assert "each task is one rank" in c.layout_reason
    # the same job in the other layout (one launcher per node) derives the same ports
    other = resolve({}, load("gres_step_node0", gen), [SlurmEnvironment])
    assert c.layout != other.layout and other.layout == "node"


def test_one_task_per_gpu_refuses_tasks_that_do_not_match_the_gpus(gen):
    env = dict(load("tasks2_step_node1", gen), SLURM_GPUS_ON_NODE="4")
    with pytest.raises(ConfigError, match="2 tasks per node .* but the node has 4 GPU"):
        resolve({}, env, [SlurmEnvironment])
    with pytest.raises(ConfigError, match="each of them would start its own torchrun"):
        resolve({"layout": "node"}, load("tasks2_step_node1", gen), [SlurmEnvironment])


def test_steps_list_every_node_by_rank(gen):
    steps = [n for n in OK if "SLURM_STEP_ID" in load(n, gen) and OK[n][0] > 1]
    assert len(steps) >= 4, steps
    for name in steps:
        assert len(resolve({}, load(name, gen), [SlurmEnvironment]).hostnames) == OK[name][0], name


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused(name, gen):
    with pytest.raises(ConfigError) as err:
        resolve({}, load(name, gen), [SlurmEnvironment])
    assert REFUSED[name] in str(err.value)
    assert "srun" in str(err.value)


def test_run_names_identical_across_nodes_unique_per_array_task_and_kept_across_requeues(gen):
    names = {n: resolve({}, load(n, gen), [SlurmEnvironment]).run_name for n in
             ("gres_step_node0", "gres_step_node1", "array_task0_step", "array_task1_step", "requeue_step_node0",
              "requeue_step_node1")}
    assert names["gres_step_node0"] == names["gres_step_node1"]
    assert names["array_task0_step"] != names["array_task1_step"]
    assert names["array_task0_step"].endswith("_0") and names["array_task1_step"].endswith("_1")
    # a requeue is the same run: no restart suffix (the attempts share one run directory)
    assert names["requeue_step_node0"] == names["requeue_step_node1"] and not names["requeue_step_node0"].endswith("-r1")


def test_typed_gpus_per_node_not_parsed(gen):
    env = load("gpntyped_step_node0", gen)
    assert env["SLURM_GPUS_PER_NODE"] == "a100:2"
    c = resolve({}, env, [SlurmEnvironment])
    assert c.source("nproc_per_node") == "slurm:SLURM_GPUS_ON_NODE"


def test_cpu_job_with_exported_worker_count(gen):
    env = dict(load("nogpu_launcher_step_node1", gen), TRACEML_NPROC_PER_NODE="4")
    c = resolve({}, env, [SlurmEnvironment])
    assert c.nproc_per_node == 4 and c.source("nproc_per_node") == "env:TRACEML_NPROC_PER_NODE"


def test_seed_wrong_command_on_real_step_env(gen):
    with pytest.raises(ConfigError, match="per-node expansion gotcha"):
        resolve({"node_rank": "0"}, load("gres_step_node1", gen), [SlurmEnvironment])


def test_both_nodes_of_a_real_job_derive_the_same_ports(gen):
    """Real dumps: every node of a job computes the same job-derived pair; other jobs differ."""
    pairs = {}
    for name in sorted(OK):
        env = load(name, gen)
        c = resolve({}, env, [SlurmEnvironment])
        assert c.source("master_port") == c.source("aggregator_port") == "slurm:SLURM_JOB_ID"
        pairs.setdefault(env["SLURM_JOB_ID"], set()).add((c.master_port, c.aggregator_port))
    assert all(len(p) == 1 for p in pairs.values()), pairs
    flat = [port for p in pairs.values() for pair in p for port in pair]
    assert len(flat) == len(set(flat))  # no two captured jobs share a port


def test_the_launch_lifecycle_gets_the_allocation_start_and_the_requeue_count(gen):
    """The goodput ledger's cluster facts (launcher/lifecycle.py): when the job started (Slurm
    23.02 and later say so; 22.05 does not: not measured) and how often it was requeued (Slurm
    sets SLURM_RESTART_COUNT once it was; unset: never)."""
    fresh, requeued = load("gres_step_node1", gen), load("requeue_step_node1", gen)
    c, r = resolve({}, fresh, [SlurmEnvironment]), resolve({}, requeued, [SlurmEnvironment])
    assert (c.restart_count, r.restart_count) == (0, 1)
    assert r.source("restart_count") == "slurm:SLURM_RESTART_COUNT"
    if "SLURM_JOB_START_TIME" in fresh:
        assert c.job_start_time == float(fresh["SLURM_JOB_START_TIME"]) <= c.job_end_time
        assert c.source("job_start_time") == "slurm:SLURM_JOB_START_TIME"
    else:
        assert gen == "22.05" and c.job_start_time is None
