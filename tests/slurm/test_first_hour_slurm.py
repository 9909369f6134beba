"""A new user's first generated CPU job on the real local Slurm: quiet and with its threads set.

`traceml slurm template --gpus-per-node 0 --workers-per-node 2 --cpus-per-task 4` writes a job whose
`traceml run` line passes `--nproc-per-node=2`; submitted as a user would (from the repository,
`sbatch`), the job's output has neither the "no GPU is allocated" warning (the worker count was
given: nothing was guessed) nor torchrun's "Setting OMP_NUM_THREADS ... to be 1" banner (the
launcher set OMP_NUM_THREADS to the task's 4 CPUs over its 2 workers, which the ranks report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_a_generated_cpu_job_is_quiet_and_sets_the_workers_threads(slurm_cluster, tmp_path):
    logs = tmp_path / "logs"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    gen = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "template", "--nodes", "1",
                          "--gpus-per-node", "0", "--workers-per-node", "2", "--cpus-per-task", "4",
                          "--time", "10", "--job-name", "cpu-first", "--logs-dir", str(logs), "-o", str(tmp_path / "job"),
                          "--setup", f"export PATH={BIN}:$PATH", "--env", f"PYTHONPATH={SRC}",
                          "examples/ddp_minimal.py", "--steps", "30"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0, gen.stderr
    sbatch = tmp_path / "job" / "cpu-first.sbatch"
    assert "--nproc-per-node=2" in sbatch.read_text()
    job = slurm_cluster.submit(str(sbatch), cwd=ROOT)
    state = slurm_cluster.wait(job, timeout=180)
    out = slurm_cluster.output(job)
    assert state == "COMPLETED", out
    assert "no GPU is allocated" not in out, out
    assert not [ln for ln in out.splitlines() if "GPU" in ln and "warning" in ln.lower()], out
    assert "Setting OMP_NUM_THREADS" not in out, out
    summary = json.loads((logs / f"cpu-first-{job}" / "final_summary.json").read_text())
    assert summary["context"]["omp"] == ["2"], summary["context"]
