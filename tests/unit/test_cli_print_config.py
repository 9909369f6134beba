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
    assert data["config"]["master_port"] == {"value": 29500, "source": "default"}


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
