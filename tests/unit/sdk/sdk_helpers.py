"""Helpers shared by the rank-side tests (imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from testports import free_port  # noqa: F401 - the sdk tests import it from here

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src"
PYTHON = sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child Python processes: our src first, no inherited rank variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRACEML_RUN_INFO", "MASTER_ADDR",
                        "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_info_env(port: int, *, token: str = "test-token", run: str = "test-run",
                 connect_wait: float = 3.0) -> str:
    from traceml_core.runinfo import RunInfo

    return RunInfo(
        run_name=run, job_id=None, nnodes=1, node_rank=0, nproc_per_node=2,
        aggregator_host="127.0.0.1", aggregator_port=port, token=token,
        connect_wait=connect_wait, mode="summary", logs_dir="./logs",
    ).to_env()


def tiny_mlp() -> Any:
    import torch.nn as nn

    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


class Stopwatch:
    def __enter__(self) -> "Stopwatch":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = time.perf_counter() - self.t0


def launch_ranks(port: int, script: str, args: list[str], *, world: int = 2,
                 token: str = "test-token", run: str = "test-run", **extra_env: str):
    """Run ``examples/<script>`` (or ``script`` itself when it is a path) as ``world`` DDP ranks
    (gloo), each with the environment torchrun and ``traceml run`` would give it; returns
    [(exit code, stdout, stderr)]; asserts success."""
    master = free_port()
    procs = []
    for rank in range(world):
        env = subprocess_env(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master),
            TRACEML_RUN_INFO=run_info_env(port, token=token, run=run), **extra_env,
        )
        path = Path(script) if os.sep in script else REPO / "examples" / script
        procs.append(subprocess.Popen([PYTHON, str(path), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for code, _out, err in outs:
        assert code == 0, err[-3000:]
    return outs
