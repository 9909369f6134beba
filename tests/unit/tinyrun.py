"""Run real ``traceml run`` jobs of tests/unit/scripts/tiny_train.py (compare and live-view tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from testports import free_port

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TINY = REPO / "tests" / "unit" / "scripts" / "tiny_train.py"
PYTHON = sys.executable
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRACEML_RUN_INFO", "MASTER_ADDR", "MASTER_PORT",
              "LOCAL_WORLD_SIZE", "GROUP_RANK")


def env_for(**extra: str) -> dict[str, str]:
    """Our src first; no Slurm or rank variables from the outer environment (a test run inside
    an allocation must not turn these into Slurm launches)."""
    env = {k: v for k, v in os.environ.items()
           if k not in _RANK_VARS and not k.startswith(("SLURM_", "TRACEML_", "TINY_", "PET_"))}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def traceml_cmd(logs: Path, name: str, *, mode: str = "summary", nproc: int = 2,
                script: Path = TINY, args: Sequence[str] = ()) -> list[str]:
    return [PYTHON, "-m", "traceml_core.cli", "run", f"--nproc-per-node={nproc}", "--mode", mode,
            "--master-port", str(free_port()), "--aggregator-port", str(free_port()),
            "--logs-dir", str(logs), "--run-name", name, "--cluster", "none", str(script), *args]


def run_tiny(logs: Path, name: str, *, timeout: float = 120, mode: str = "summary", nproc: int = 2,
             **env: str) -> subprocess.CompletedProcess:
    """Run to the end; returns the completed process (stdout/stderr text)."""
    return subprocess.run(traceml_cmd(logs, name, mode=mode, nproc=nproc), env=env_for(**env), text=True,
                          capture_output=True, timeout=timeout, cwd=str(REPO))


def start_tiny(logs: Path, name: str, *, mode: str = "summary", nproc: int = 2,
               stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE, **env: str) -> subprocess.Popen:
    return subprocess.Popen(traceml_cmd(logs, name, mode=mode, nproc=nproc), env=env_for(**env), text=True,
                            stdout=stdout, stderr=stderr, cwd=str(REPO))


def stop(proc: Optional[subprocess.Popen]) -> None:
    """End a launcher we started (by pid) if a test failed half-way."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_frozen(pidfile: Path) -> bool:
    """SIGKILL the rank that froze itself (``TINY_KILL_SIGNAL=STOP``) by the pid it wrote to
    ``TINY_PIDFILE``; False when it never froze or is gone already. A stopped process heeds no
    SIGTERM, so a test that froze a rank ends it this way before stopping the launcher."""
    try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False
    return True
