"""The aggregator benchmarks still run (tiny sizes; the figures themselves are not asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ingest_benchmark_runs_without_loss():
    out = _run("aggregator_ingest.py", "--ranks", "3", "--seconds", "1", "--records", "5")
    row = [line.split() for line in out.splitlines() if line.split()[:1] == ["3"]]
    assert row, out
    ranks, sent, lost = row[0][:3]
    assert int(sent.replace(",", "")) > 0 and lost == "0", out
    assert "ceiling" in out and "!!" not in out


def test_memory_benchmark_runs():
    out = _run("aggregator_memory.py", "--ranks", "2", "--steps", "2000", "--batch", "100",
               "--summary-ranks", "16")
    assert "final summary for 16 ranks" in out


def test_live_snapshot_benchmark_runs():
    out = _run("live_snapshot.py", "--ranks", "2", "--requests", "5", "--warmup-s", "0.5")
    kinds = [line.split()[0] for line in out.splitlines()[2:]]
    assert kinds == ["plain", "series", "verdict"], out
