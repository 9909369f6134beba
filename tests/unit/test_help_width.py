"""Every ``--help`` fits an 80-column terminal, as a user opens it (``COLUMNS=80``, a subprocess),
and ``python -m traceml_core`` is the ``traceml`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
HELPS = [["--help"], ["run", "--help"], ["summarize", "--help"], ["report", "--help"], ["compare", "--help"],
         ["slurm", "--help"], ["slurm", "doctor", "--help"], ["slurm", "template", "--help"]]


def run(cmd: list[str], columns: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["COLUMNS"] = str(columns)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("args", HELPS, ids=[" ".join(a) for a in HELPS])
def test_help_fits_80_columns(args):
    p = run([sys.executable, "-m", "traceml_core", *args], 80)
    assert p.returncode == 0, p.stderr
    wide = [line for line in p.stdout.splitlines() if len(line) > 80]
    assert not wide, "\n".join(wide)
    assert len(p.stdout.splitlines()) > 3


def test_python_m_traceml_core_is_the_traceml_command():
    console = BIN / "traceml"
    if not console.exists():
        pytest.skip("no console script installed in this environment")
    for args in (["--version"], ["run", "--help"]):
        mod = run([sys.executable, "-m", "traceml_core", *args], 100)
        cmd = run([str(console), *args], 100)
        assert (mod.returncode, mod.stdout) == (cmd.returncode, cmd.stdout), args
    assert run([sys.executable, "-m", "traceml_core", "--version"], 80).stdout.startswith("traceml ")
