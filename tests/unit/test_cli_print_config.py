"""`traceml run --print-config` as a user runs it: a subprocess, no torch, clean errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TRACEML = [sys.executable, "-m", "traceml_core.cli"]


def run(*args: str, env_extra: dict | None = None, clear_slurm: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not (clear_slurm and k.startswith(("SLURM_", "TRACEML_")))}
    env.update(env_extra or {})
    return subprocess.run(TRACEML + list(args), capture_output=True, text=True, env=env, timeout=60)


def test_json_is_the_only_stdout_and_has_sources():
    p = run("run", "--print-config", "--json", "--nproc-per-node=3", "train.py",
            env_extra={"TRACEML_LOGS_DIR": "/scratch/x"})
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert set(data) == {"schema_version", "config", "warnings", "layout_reason", "command"}
    assert data["config"]["layout"] == {"value": "node", "source": "default"}
    assert data["command"][1:3] == ["-m", "torch.distributed.run"]
    assert data["config"]["nproc_per_node"] == {"value": 3, "source": "cli"}
    assert data["config"]["logs_dir"] == {"value": "/scratch/x", "source": "env:TRACEML_LOGS_DIR"}
    # one node, no cluster, no port given: free ports (each run its own), never the fixed defaults
    ports = data["config"]["master_port"], data["config"]["aggregator_port"]
    assert [p["source"] for p in ports] == ["free", "free"], ports
    assert ports[0]["value"] != ports[1]["value"] and 29500 not in [p["value"] for p in ports]


@pytest.mark.parametrize("args,env,expect", [
    # several nodes outside a cluster: every node must agree on the ports without talking
    (["--nnodes=2", "--master-addr=10.0.0.1"], {}, [(29500, "default"), (29765, "default")]),
    # given ports are kept (flag or variable); only the other one is picked
    (["--master-port=41000"], {"TRACEML_AGGREGATOR_PORT": "41001"}, [(41000, "cli"), (41001, "env:TRACEML_AGGREGATOR_PORT")]),
    (["--aggregator-port=41001"], {}, [(None, "free"), (41001, "cli")]),
    # inside Slurm the ports come from the job id, as before
    ([], {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1",
          "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1"},
     [(61440 + 4 * 7, "slurm:SLURM_JOB_ID"), (61440 + 4 * 7 + 1, "slurm:SLURM_JOB_ID")]),
])
def test_ports_free_only_for_one_node_outside_a_cluster(args, env, expect):
    p = run("run", "--print-config", "--json", *args, "train.py", env_extra=env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    got = [(data["config"][k]["value"], data["config"][k]["source"]) for k in ("master_port", "aggregator_port")]
    for (value, source), (want_value, want_source) in zip(got, expect):
        assert source == want_source and (want_value is None or value == want_value), got
    free = [v for v, s in got if s == "free"]
    assert all(1024 <= v < 65536 and v != 41001 for v in free), got


def test_table_says_the_ports_are_free_and_how_to_pin_them():
    p = run("run", "--print-config", "train.py")
    assert p.returncode == 0, p.stderr
    assert "note: free ports for this run: master " in p.stdout
    assert "pin with --master-port/--aggregator-port" in p.stdout


def test_table_shows_sources_and_torchrun_command():
    p = run("run", "--print-config", "train.py", "--epochs", "3")
    assert p.returncode == 0, p.stderr
    assert "nproc_per_node" in p.stdout and "default" in p.stdout
    assert "torch.distributed.run" in p.stdout and "train.py --epochs 3" in p.stdout


def test_print_config_and_help_never_import_torch():
    code = ("import sys; from traceml_core.cli import main; import io, contextlib\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['run', '--print-config', '--json', 'x.py'])\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "print(bad)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("args,env,needle", [
    (["--nnodes=two"], {}, "--nnodes='two'"),
    ([], {"SLURM_JOB_ID": "5", "SLURM_NNODES": "x", "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1"}, "SLURM_NNODES='x'"),
    ([], {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "0",
          "SLURMD_NODENAME": "n1"}, "batch shell"),
])
def test_config_errors_exit_2_with_message_and_no_traceback(args, env, needle):
    p = run("run", "--print-config", "--json", *args, "train.py", env_extra=env)
    assert p.returncode == 2
    assert p.stdout == ""
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.startswith("traceml: error: ")
