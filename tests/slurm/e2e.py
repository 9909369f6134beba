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
    # each test's node evidence apart: one test's slow node must not be excluded in the next
    env["TRACEML_NODE_STORE"] = str(logs_dir / "nodes.sqlite")
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


# ---- loss accounting against the truth (tests/faults/faulty_train.py's progress files) -------------

def check_lifecycles(data: dict[str, Any]) -> None:
    """Every node's launch lifecycle reached the summary (launcher/lifecycle.py): its phases in
    order, its first step inside training, the cluster's facts (allocation start: Slurm 23.02 and
    later; 22.05 does not say) before anything of ours, and no requeue."""
    import datetime

    def t(iso: str) -> float:
        return datetime.datetime.fromisoformat(iso).timestamp()

    for node in data["topology"]["nodes"]:
        lc = node["lifecycle"]
        assert lc is not None and list(lc["phases"]) == ["preflight", "telemetry_up", "training", "finishing"], node
        at = [t(v) for v in lc["phases"].values()]
        assert at == sorted(at), lc
        assert at[2] <= t(lc["first_step"]) <= at[3], lc
        assert lc["restarts"] == 0, lc
        if lc["allocation_start"] is not None:
            assert t(lc["allocation_start"]) <= at[0] + 1.0, lc   # Slurm's clock has whole seconds


def truth(progress: Path) -> dict[int, int]:
    """Steps each rank really completed (the ``step`` lines faulty_train.py writes), by rank."""
    out = {}
    for f in progress.glob("rank*.txt"):
        out[int(f.stem[4:])] = sum(1 for ln in f.read_text().splitlines() if ln.startswith("step "))
    return out


def check_against_truth(data: dict[str, Any], real: dict[int, int], text: str) -> dict[str, Any]:
    """The summary's loss figures against what training really did; ``text``: final_summary.txt."""
    tel = data["telemetry"]
    exact = True
    for r in data["ranks"]:
        t = r["telemetry"]
        did = real.get(r["rank"], 0)
        if t["expected"] is None:
            assert t["unsent_max"] is None
            exact = exact and did == 0
            continue
        assert t["received"] + t["lost"] == t["expected"], t
        assert t["received"] <= did + 1 and t["expected"] <= did + 1, (r["rank"], t, did)
        if t["unsent_max"] == 0:   # said goodbye: exact
            assert t["expected"] >= did, (r["rank"], t, did)
        elif t["unsent_max"] is not None:  # the bound it states holds
            assert did - t["expected"] <= t["unsent_max"], (r["rank"], t, did)
        exact = exact and t["expected"] >= did and t["lost"] == 0
    if not exact:
        assert not tel["complete"], (tel, real)
    assert ("none lost" in text) == tel["complete"], (tel, text)
    if not tel["complete"] and tel["ranks_without_goodbye"]:
        bound = tel["records_unsent_max"]
        assert "incomplete" in text and (bound is None or f"at most about {bound:,} more" in text), text
    return tel
