"""Precedence and validation of the launch config, independent of any cluster."""

from __future__ import annotations

import pytest

from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_slurm.environment import SlurmEnvironment

SLURM = [SlurmEnvironment]
STEP = {
    "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_GPUS_ON_NODE": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_SUBMIT_DIR": "/home/u/proj", "SLURMD_NODENAME": "node2",
}


def test_defaults_single_node_without_cluster():
    c = resolve({}, {}, SLURM, script="/x/my train.py")
    assert (c.nnodes, c.node_rank, c.nproc_per_node, c.master_port, c.aggregator_port) == (1, 0, 1, 29500, 29765)
    assert c.aggregator_bind_host == "127.0.0.1" and c.source("aggregator_bind_host") == "derived:nnodes"
    assert c.aggregator_host == c.master_addr and c.source("aggregator_host") == "derived:master_addr"
    assert c.run_name.startswith("my_train-") and c.source("run_name") == "default"
    assert c.cluster == "none" and c.logs_dir == "./logs"


def test_flag_beats_env_beats_slurm_beats_default():
    env = dict(STEP, TRACEML_LOGS_DIR="/scratch/logs", TRACEML_MASTER_PORT="29600", TRACEML_RUN_NAME="from-env")
    c = resolve({"run_name": "from-cli"}, env, SLURM)
    assert (c.run_name, c.source("run_name")) == ("from-cli", "cli")
    assert (c.logs_dir, c.source("logs_dir")) == ("/scratch/logs", "env:TRACEML_LOGS_DIR")
    assert (c.master_port, c.source("master_port")) == (29600, "env:TRACEML_MASTER_PORT")
    assert (c.nproc_per_node, c.source("nproc_per_node")) == (2, "slurm:SLURM_GPUS_ON_NODE")
    # under Slurm the ports nobody set come from the job id (traceml_slurm.environment.job_ports)
    assert c.source("aggregator_port") == "slurm:SLURM_JOB_ID" and c.aggregator_port != 29765
    assert c.cluster == "slurm" and c.source("cluster") == "detected:slurm"


def test_cluster_none_ignores_slurm():
    c = resolve({"cluster": "none"}, STEP, SLURM)
    assert c.nnodes == 1 and c.cluster == "none" and c.job_id is None


@pytest.mark.parametrize("cli,env,needle", [
    ({"nnodes": "two"}, {}, "--nnodes='two'"),
    ({}, {"TRACEML_MASTER_PORT": "70000"}, "TRACEML_MASTER_PORT='70000'"),
    ({"mode": "fancy"}, {}, "must be one of summary, cli, dashboard"),
    ({"run_name": "a/b"}, {}, "--run-name='a/b'"),
    ({"nnodes": "2", "node_rank": "2", "master_addr": "10.0.0.1"}, {}, "node rank 2"),
    ({"nnodes": "2", "master_addr": "127.0.0.1"}, {}, "loopback"),
    ({"nnodes": "2", "master_addr": "n1", "mode": "cli"}, {}, "--mode=cli"),
    ({"master_port": "29765"}, {}, "both 29765"),
    ({"aggregator_bind_host": "eth0"}, {}, "--aggregator-bind-host='eth0'"),
    ({"cluster": "pbs"}, {}, "names no installed cluster environment"),
])
def test_bad_values_name_the_flag_or_variable(cli, env, needle):
    with pytest.raises(ConfigError) as err:
        resolve(cli, env, SLURM)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_json_shape():
    data = resolve({}, STEP, SLURM).to_json()
    assert set(data) == {"schema_version", "config", "warnings"} and data["schema_version"] == 1
    assert data["config"]["nnodes"] == {"value": 2, "source": "slurm:SLURM_STEP_NUM_NODES"}
    assert all(set(v) == {"value", "source"} for v in data["config"].values())
