"""Shared pieces of the end-to-end tests: submit a real TraceML job, find its summary."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)


def job_env(logs_dir: Path, **extra: str) -> dict[str, str]:
    """The submitter's environment for a TraceML job (Slurm copies it to every task)."""
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["TRACEML_LOGS_DIR"] = str(logs_dir)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TRACEML_RUN_INFO", None)
    env.update(extra)
    return env


def summary(logs_dir: Path, run_name: Optional[str] = None) -> dict[str, Any]:
    runs = [p for p in logs_dir.iterdir() if (p / "final_summary.json").exists()]
    if run_name is not None:
        runs = [p for p in runs if p.name == run_name]
    assert len(runs) == 1, f"expected one run with a summary in {logs_dir}: {sorted(p.name for p in logs_dir.iterdir())}"
    assert (runs[0] / "final_summary.txt").exists()
    return json.loads((runs[0] / "final_summary.json").read_text())


def hostnames(data: dict[str, Any]) -> list[str]:
    return [n["hostname"] for n in data["topology"]["nodes"]]
