"""Input that is not a DataLoader, on real runs (`traceml run`, 2 gloo DDP workers): a
nanoGPT-style get_batch() costing 15 ms before each ~2 ms step (examples/get_batch.py).

The headline must say input is not measured (null, never 0.00), read the time between steps as
the input wait and say so, and not call the run compute-bound; wrap_dataloader must turn the same
fetch into a measured input wait; with nothing to fetch there is no input verdict at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "get_batch.py"


def _run(tmp: Path, name: str, *args: str) -> tuple[dict, str]:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    master, agg = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "run", "--nproc-per-node=2",
                        f"--logs-dir={tmp}", f"--run-name={name}", f"--master-port={master}",
                        f"--aggregator-port={agg}", str(EXAMPLE), *args],
                       capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((tmp / name / "final_summary.json").read_text()), p.stdout


def _kinds(s: dict) -> list[str]:
    return [s["verdict"]["kind"]] + [v["kind"] for v in s["other_verdicts"]]


def test_get_batch_input_is_not_measured_and_read_between_steps(tmp_path):
    # 30 ms fetches beside a ~2 ms step: input-bound with margin even when a loaded machine
    # stretches the gloo step several times
    s, out = _run(tmp_path, "gb", "--fetch-ms", "30")
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["evidence"]["source"] == "between_steps", v
    assert v["evidence"]["input_ms"] >= 25.0 and v["evidence"]["input_fraction"] >= 0.5, v
    assert "input is not measured" in v["why"] and "e.g. fetching the next batch" in v["why"]
    assert "compute_bound" not in _kinds(s)
    assert s["across_ranks"]["input"] is None
    assert all(r["phases"]["input"] is None for r in s["ranks"])
    assert "not measured: input" in out
    assert not any(line.split()[:1] == ["input"] for line in out.splitlines()), "no 0.00 input row"


def test_wrap_dataloader_measures_the_same_fetch(tmp_path):
    s, out = _run(tmp_path, "wrapped", "--fetch-ms", "15", "--wrap")
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["evidence"]["source"] == "fetch", v
    assert s["across_ranks"]["input"]["median_ms"] >= 12.0
    assert "not measured: input" not in out


def test_control_without_a_fetch_gets_no_input_verdict(tmp_path):
    s, out = _run(tmp_path, "nofetch", "--fetch-ms", "0")
    assert "input_bound" not in _kinds(s), s["verdict"]
    assert s["across_ranks"]["input"] is None and "not measured: input" in out
