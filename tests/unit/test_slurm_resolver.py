"""The Slurm resolver over environment mappings: each situation of the resolver issue.

Synthetic cases live here; real dumps captured on the local cluster are exercised by
test_slurm_env_dumps.py.
"""

from __future__ import annotations

import pytest

from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_slurm.environment import SlurmEnvironment, sanitise_run_name
from traceml_slurm.hostlists import expand_nodelist, expand_tasks_per_node

SLURM = [SlurmEnvironment]
JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "ddp", "SLURM_SUBMIT_DIR": "/home/u/p",
       "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def step(**kw):
    env = dict(JOB, SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="2", SLURM_STEP_NODELIST="gpu[07-08]",
               SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_NODEID="0", SLURMD_NODENAME="gpu07",
               SLURM_GPUS_ON_NODE="4", SLURM_JOB_GPUS="0,1,2,3")
    env.update({k: v for k, v in kw.items() if v is not None})
    for k in [k for k, v in kw.items() if v is None]:
        env.pop(k, None)
    return env


def r(env, **cli):
    return resolve(cli, env, SLURM)


def test_step_on_each_node():
    for nodeid in (0, 1):
        c = r(step(SLURM_NODEID=str(nodeid), SLURMD_NODENAME=f"gpu0{7 + nodeid}"))
        assert (c.nnodes, c.node_rank, c.nproc_per_node, c.master_addr) == (2, nodeid, 4, "gpu07")
        assert c.aggregator_bind_host == "0.0.0.0" and c.aggregator_host == "gpu07"
        assert c.run_name == "ddp-4242" and c.logs_dir == "/home/u/p/logs" and c.job_id == "4242"


def test_node_rank_is_nodeid_not_procid():
    c = r(step(SLURM_NODEID="1", SLURM_PROCID="7"))
    assert c.node_rank == 1 and c.source("node_rank") == "slurm:SLURM_NODEID"


def test_step_values_beat_job_values():
    c = r(step(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu08", SLURM_STEP_TASKS_PER_NODE="1"))
    assert (c.nnodes, c.master_addr, c.aggregator_bind_host) == (1, "gpu08", "127.0.0.1")


def test_multinode_batch_shell_refused_with_srun_line():
    env = dict(JOB, SLURM_NODEID="0", SLURM_PROCID="0", SLURMD_NODENAME="gpu07", SLURM_GPUS_ON_NODE="4")
    with pytest.raises(ConfigError) as err:
        r(env)
    assert "batch shell" in str(err.value) and "srun --nodes=2 --ntasks-per-node=1 traceml run" in str(err.value)


def test_single_node_batch_shell_allowed():
    env = dict(JOB, SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_JOB_NODELIST="gpu07", SLURM_NODEID="0",
               SLURMD_NODENAME="gpu07", SLURM_GPUS_ON_NODE="2")
    c = r(env)
    assert (c.nnodes, c.node_rank, c.nproc_per_node, c.master_addr) == (1, 0, 2, "gpu07")


def test_explicit_flags_in_batch_shell_downgrade_refusal_to_warning():
    env = dict(JOB, SLURM_NODEID="0", SLURMD_NODENAME="gpu07", SLURM_GPUS_ON_NODE="4")
    c = r(env, nnodes="2", node_rank="0", master_addr="gpu07")
    assert c.nnodes == 2 and any("batch shell" in w for w in c.warnings)


def test_salloc_shell_refused():
    with pytest.raises(ConfigError) as err:
        r(dict(JOB))
    assert "salloc shell" in str(err.value) and "srun --nodes=2 --ntasks-per-node=1" in str(err.value)


def test_interactive_step_of_multinode_allocation_refused():
    env = step(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu07", SLURM_STEP_TASKS_PER_NODE="1",
               SLURM_PTY_PORT="40000")
    with pytest.raises(ConfigError) as err:
        r(env)
    assert "interactive step" in str(err.value) and "srun --overlap --nodes=2" in str(err.value)


def test_one_task_per_gpu_each_task_is_one_rank():
    c = r(step(SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_STEP_NUM_TASKS="8", SLURM_NODEID="1",
               SLURMD_NODENAME="gpu08", SLURM_PROCID="6", SLURM_LOCALID="2"))
    assert (c.layout, c.task_rank, c.local_rank, c.node_rank, c.nproc_per_node, c.world_size) == \
        ("task", 6, 2, 1, 4, 8)
    assert c.master_addr == "gpu07" and c.source("layout") == "slurm:SLURM_STEP_TASKS_PER_NODE=4(x2)"
    assert "no torchrun" in c.layout_reason
    node = r(step())
    assert node.layout == "node" and node.task_rank is None and "torchrun" in node.layout_reason


@pytest.mark.parametrize("env,says", [
    (dict(SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_PROCID="0", SLURM_LOCALID="0"),
     ["2 tasks per node", "4 GPU(s)", "--ntasks-per-node=4", "--ntasks-per-node=1"]),
    (dict(SLURM_STEP_TASKS_PER_NODE="1,2", SLURM_PROCID="0", SLURM_LOCALID="0"),
     ["different number of tasks on different nodes", "--ntasks-per-node=1"]),
    (dict(SLURM_STEP_TASKS_PER_NODE="4(x2)"), ["SLURM_PROCID", "rank is unknown"]),
    (dict(SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_STEP_NUM_TASKS="6", SLURM_PROCID="0", SLURM_LOCALID="0"),
     ["makes 8 ranks, but the step has 6 tasks", "--ntasks-per-node=4"]),
])
def test_what_is_really_wrong_with_several_tasks_per_node_is_refused(env, says):
    with pytest.raises(ConfigError) as err:
        r(step(**env))
    for text in says:
        assert text in str(err.value)


def test_gpus_per_node_with_type_is_never_parsed():
    c = r(step(SLURM_GPUS_PER_NODE="a100:4", SLURM_GPUS_ON_NODE="4"))
    assert c.nproc_per_node == 4 and c.source("nproc_per_node") == "slurm:SLURM_GPUS_ON_NODE"


def test_old_slurm_counts_step_gpus_not_job_gpus():
    c = r(step(SLURM_GPUS_ON_NODE=None, SLURM_STEP_GPUS="2,3", SLURM_JOB_GPUS="0,1,2,3", SLURM_GPUS="8"))
    assert c.nproc_per_node == 2 and c.source("nproc_per_node") == "slurm:SLURM_STEP_GPUS(count)"


def test_no_gpu_batch_shell_uses_tasks_per_node_step_uses_one_with_fix():
    env = dict(JOB, SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_JOB_NODELIST="gpu07", SLURM_NODEID="0",
               SLURMD_NODENAME="gpu07", SLURM_NTASKS_PER_NODE="4")
    c = r(env)
    assert c.nproc_per_node == 4 and any("no GPU" in w for w in c.warnings)
    c = r(step(SLURM_GPUS_ON_NODE=None, SLURM_JOB_GPUS=None, SLURM_NTASKS_PER_NODE="1"))
    assert c.nproc_per_node == 1 and any("--nproc-per-node=N" in w for w in c.warnings)
    c = r(step(SLURM_GPUS_ON_NODE=None, SLURM_JOB_GPUS=None), nproc_per_node="4")
    assert c.nproc_per_node == 4


@pytest.mark.parametrize("given", [{"cli": {"nproc_per_node": "1"}}, {"env": {"TRACEML_NPROC_PER_NODE": "2"}}])
def test_no_gpu_warning_when_the_worker_count_is_given(given):
    """A generated CPU job passes --nproc-per-node: nothing was guessed, so nothing to warn about
    (every node printed six lines of it). Batch shell and step alike."""
    shell = dict(JOB, SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_JOB_NODELIST="gpu07", SLURM_NODEID="0",
                 SLURMD_NODENAME="gpu07", SLURM_NTASKS_PER_NODE="4")
    for env in (shell, step(SLURM_GPUS_ON_NODE=None, SLURM_JOB_GPUS=None, SLURM_NTASKS_PER_NODE="1")):
        c = resolve(given.get("cli", {}), {**env, **given.get("env", {})}, SLURM)
        assert not [w for w in c.warnings if "GPU" in w], c.warnings


@pytest.mark.parametrize("nodelist,first,count", [
    ("gpu[07-08]", "gpu07", 2), ("rack1-n[01-02],rack2-n[01-02]", "rack1-n01", 4), ("a[3,1-2]", "a3", 3),
    ("login,compute", "login", 2), (" gpu[1-2] \n", "gpu1", 2), ("node[001-002]", "node001", 2),
    # Slurm's parser separates hosts by whitespace as by commas (scontrol show hostnames agrees)
    ("alpha beta gamma", "alpha", 3), ("node[1-2] node3", "node1", 3), ("a\tb", "a", 2),
])
def test_master_is_first_host_of_step_nodelist(nodelist, first, count):
    c = r(step(SLURM_STEP_NODELIST=nodelist, SLURM_STEP_NUM_NODES=str(count),
               SLURM_STEP_TASKS_PER_NODE=f"1(x{count})"))
    assert c.master_addr == first and len(c.hostnames) == count


@pytest.mark.parametrize("nodelist", ["node[1-3]", "node1", "alpha beta gamma"])
def test_a_step_whose_node_list_does_not_match_its_node_count_is_refused(nodelist):
    with pytest.raises(ConfigError) as err:
        r(step(SLURM_STEP_NODELIST=nodelist))   # the step has 2 nodes
    msg = str(err.value)
    assert f"SLURM_STEP_NODELIST={nodelist!r}" in msg and "this step has 2 node(s)" in msg and "\n" not in msg
    # the user who gives every launch value themselves may go on (a warning then)
    c = r(step(SLURM_STEP_NODELIST=nodelist), nnodes="2", node_rank="0", master_addr="node1")
    assert any("SLURM_STEP_NODELIST" in w for w in c.warnings)


def test_whitespace_inside_brackets_and_huge_lists_are_refused_not_expanded():
    with pytest.raises(ConfigError, match="whitespace inside"):
        expand_nodelist("node[1-2, 3]", "X")
    with pytest.raises(ConfigError, match="more hosts than TraceML supports"):
        expand_nodelist("node[1-99999999]", "X")
    with pytest.raises(ConfigError, match="more than 65,536 nodes"):
        expand_tasks_per_node("1(x99999999999999)", "X")
    with pytest.raises(ConfigError, match="SLURM_STEP_TASKS_PER_NODE"):
        r(step(SLURM_STEP_TASKS_PER_NODE="1(x99999999999999)"))


def test_hostlist_helpers():
    assert expand_nodelist("a[1-2],b[3,5-6]", "X") == ["a1", "a2", "b3", "b5", "b6"]
    assert expand_nodelist("n1,n1,n2", "X") == ["n1", "n2"]
    assert expand_tasks_per_node("2(x3),1", "X") == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match="X='2\\(x'"):
        expand_tasks_per_node("2(x", "X")


@pytest.mark.parametrize("stale", ["127.0.0.1", "localhost", "login01"])
def test_stale_master_addr_is_ignored_with_warning(stale):
    c = r(step(MASTER_ADDR=stale))
    assert c.master_addr == "gpu07" and any(f"MASTER_ADDR={stale}" in w for w in c.warnings)


def test_array_tasks_get_unique_run_names_and_a_requeue_keeps_its_run():
    c = r(step(SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="3"))
    assert c.run_name == "ddp-4240_3"
    # a requeued job is the same run (its attempts share one directory and one goodput ledger)
    c = r(step(SLURM_RESTART_COUNT="2", SLURM_JOB_NAME="my job!/x"))
    assert c.run_name == "my_job_x-4242"
    assert sanitise_run_name("../..") == "job"


def test_het_step_refused_only_when_spanning_components():
    het = dict(SLURM_HET_SIZE="2", SLURM_JOB_NODELIST_HET_GROUP_0="gpu07", SLURM_JOB_NODELIST_HET_GROUP_1="gpu08")
    with pytest.raises(ConfigError, match="heterogeneous"):
        r(step(**het))
    c = r(step(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu08", SLURM_STEP_TASKS_PER_NODE="1", **het))
    assert c.master_addr == "gpu08"


@pytest.mark.parametrize("var,value", [
    ("SLURM_NNODES", "two"), ("SLURM_STEP_NUM_NODES", "0"), ("SLURM_NODEID", "-1"), ("SLURM_NODEID", "5"),
    ("SLURM_STEP_NODELIST", "gpu[07-"), ("SLURM_STEP_TASKS_PER_NODE", "x"), ("SLURM_GPUS_ON_NODE", "four"),
])
def test_malformed_values_name_the_variable(var, value):
    with pytest.raises(ConfigError) as err:
        r(step(**{var: value}))
    assert var in str(err.value) and "\n" not in str(err.value)


def test_empty_nodelist_is_an_error():
    with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST is empty"):
        r(step(SLURM_STEP_NODELIST=" "))


def test_seed_wrong_command_refused_on_other_nodes():
    with pytest.raises(ConfigError) as err:
        r(step(SLURM_NODEID="1"), node_rank="0")
    assert "per-node expansion gotcha" in str(err.value)
    assert r(step(SLURM_NODEID="0"), node_rank="0").node_rank == 0


def test_explicit_nnodes_contradicting_step_refused():
    with pytest.raises(ConfigError, match="spans 2 nodes"):
        r(step(), nnodes="3")


# ---- job-derived ports ------------------------------------------------------------------------

def test_ports_derived_from_the_job_id_agree_across_nodes():
    c0, c1 = r(step(SLURM_NODEID="0")), r(step(SLURM_NODEID="1", SLURMD_NODENAME="gpu08"))
    assert (c0.master_port, c0.aggregator_port) == (c1.master_port, c1.aggregator_port)
    assert c0.source("master_port") == c0.source("aggregator_port") == "slurm:SLURM_JOB_ID"
    assert c0.master_port != c0.aggregator_port
    # above Linux's default ephemeral range (32768-60999): no outgoing connection holds them
    assert 60999 < c0.master_port <= 65535 and 60999 < c0.aggregator_port <= 65535


def test_jobs_sharing_a_node_get_different_ports():
    """Jobs that run at the same time have nearby ids; none of the ports they use may coincide,
    including the dashboard's default (the aggregator port + 1)."""
    seen: dict[int, str] = {}
    for job in range(4242, 4242 + 300):
        c = r(step(SLURM_JOB_ID=str(job)))
        for port in (c.master_port, c.aggregator_port, c.aggregator_port + 1):
            assert port not in seen, f"job {job} and job {seen[port]} share port {port}"
            seen[port] = str(job)


def test_explicit_ports_beat_the_derived_ones():
    c = r(step(TRACEML_AGGREGATOR_PORT="29765"), master_port="29500")
    assert (c.master_port, c.source("master_port")) == (29500, "cli")
    assert (c.aggregator_port, c.source("aggregator_port")) == (29765, "env:TRACEML_AGGREGATOR_PORT")
    d = r(step(), aggregator_port="30001")  # one pinned, the other still derived
    assert d.source("master_port") == "slurm:SLURM_JOB_ID" and d.aggregator_port == 30001


def test_outside_slurm_the_defaults_stay():
    c = resolve({}, {}, SLURM)
    assert (c.master_port, c.aggregator_port) == (29500, 29765)
    assert c.source("master_port") == c.source("aggregator_port") == "default"


def test_stale_master_port_in_the_environment_is_named():
    c = r(step(MASTER_PORT="12345"))
    assert c.source("master_port") == "slurm:SLURM_JOB_ID"
    assert any("MASTER_PORT=12345" in w and "--master-port" in w for w in c.warnings)


def test_non_numeric_job_id_is_refused_naming_it():
    with pytest.raises(ConfigError) as err:
        r(step(SLURM_JOB_ID="abc"))
    assert "SLURM_JOB_ID='abc'" in str(err.value) and "\n" not in str(err.value)


# --- OMP_NUM_THREADS: the task's CPUs over its workers ---------------------------------------------
def test_omp_threads_are_the_task_cpus_over_the_workers_with_their_source():
    c = r(step(SLURM_CPUS_PER_TASK="16"))       # 4 GPUs: 4 workers
    assert (c.task_cpus, c.source("task_cpus")) == (16, "slurm:SLURM_CPUS_PER_TASK")
    assert (c.omp_threads, c.source("omp_threads")) == ("4", "derived:task_cpus/nproc_per_node")
    # no --cpus-per-task: the job's CPUs on the node, shared by its one launcher task
    c = r(step(SLURM_CPUS_ON_NODE="6"), nproc_per_node="4")
    assert (c.task_cpus, c.omp_threads) == (6, "1")
    # never below 1
    c = r(step(SLURM_CPUS_PER_TASK="2"))
    assert c.omp_threads == "1"


def test_the_users_omp_num_threads_always_wins():
    c = r(step(SLURM_CPUS_PER_TASK="16", OMP_NUM_THREADS="7"))
    assert (c.omp_threads, c.source("omp_threads")) == ("7", "env:OMP_NUM_THREADS")


def test_task_layout_gives_each_task_its_own_cpus():
    env = step(SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_NTASKS="8", SLURM_PROCID="5", SLURM_LOCALID="1",
               SLURM_NODEID="1", SLURMD_NODENAME="gpu08", SLURM_CPUS_PER_TASK="8")
    c = r(env)
    assert c.layout == "task" and (c.omp_threads, c.source("omp_threads")) == ("8", "derived:task_cpus")


def test_outside_slurm_nothing_is_set():
    c = resolve({}, {}, SLURM)
    assert c.omp_threads is None and c.task_cpus is None
