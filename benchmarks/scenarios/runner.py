"""Run one scenario for real: ``traceml run --nproc-per-node=N train.py ARGS`` (torchrun, gloo
DDP on CPU, the real aggregator), then read its ``final_summary.json``.

Used by ``benchmarks/verdict_matrix.py`` and by the CI subset (tests/verdicts). Run it inside a
network namespace of your own (``scripts/dev-cluster exec``) when others share the machine, so
the runs' loopback ports never meet theirs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .catalog import Outcome, Scenario, outcome_from_summary

REPO = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).resolve().with_name("train.py")
MODES = ("summary", "cli")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


#: the TraceML source the runs use: this checkout's, or another (``verdict_matrix.py --src``:
#: the baseline of an older commit, measured with today's scenarios)
SRC = [REPO / "src"]


def clean_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of a run outside any job: no Slurm or TraceML variables of ours leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = str(SRC[0]) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def launch(sc: Scenario, mode: str, logs: Path, name: str, timeout: float = 600.0,
           python: str = sys.executable) -> tuple[subprocess.CompletedProcess, float]:
    master, agg = free_ports(2)
    cmd = [python, "-m", "traceml_core.cli", "run", f"--nproc-per-node={sc.nproc}",
           f"--logs-dir={logs}", f"--run-name={name}", f"--master-port={master}",
           f"--aggregator-port={agg}", f"--mode={mode}", str(TRAIN), *sc.args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(dict(sc.env)),
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t0


def run_scenario(sc: Scenario, mode: str, logs: Path, run: int = 0, timeout: float = 600.0) -> Outcome:
    """One real run; an outcome with ``error`` set when no summary came out of it."""
    name = f"{sc.name}-{mode}-{run}"
    before = os.getloadavg()[0]
    try:
        p, wall = launch(sc, mode, logs, name, timeout)
    except subprocess.TimeoutExpired:
        return Outcome(sc.name, mode, run, "?", "?", None, None, [], "", "timeout", timeout,
                       (before, os.getloadavg()[0]), error=f"timed out after {timeout:.0f} s")
    load = (before, os.getloadavg()[0])
    path = logs / name / "final_summary.json"
    if not path.is_file():
        return Outcome(sc.name, mode, run, "?", "?", None, None, [], "", "no summary", wall, load,
                       error=f"no summary (exit {p.returncode}): {p.stderr[-600:]}")
    summary = json.loads(path.read_text())
    out = outcome_from_summary(summary, sc.name, mode, run, wall, load)
    if summary["run"]["status"] != "completed":
        out.error = f"run {summary['run']['status']} (exit {p.returncode}): {p.stderr[-600:]}"
    return out
