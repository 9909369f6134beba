"""Jobs written by `traceml slurm template`, submitted to the real local Slurm (scripts/dev-cluster).

- The checks against the cluster and `--test-only`, with the cluster's real partitions (`short` has
  MaxTime 5 minutes) and typed GPUs (`a100`).
- The time-limit plumbing of a generated job (the one recipe, `--signal=TERM@N`): the step's
  launchers get exactly one plain SIGTERM (not srun's SIGKILL), together, before the limit, and the
  batch shell none. The
  launcher in this test is a small shell script standing in for `traceml run` that records how it
  was started and what it received, so the job script's behaviour is checked on its own.
- The end-to-end runs with the real `traceml run`: a 2-node x 2-worker job ends with a final
  summary on node 0, and a job that reaches its time limit ends with the summary written and
  marked interrupted.

Run inside the cluster's login namespace: `scripts/dev-cluster exec python -m pytest tests/slurm`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
BIN = Path(sys.executable).parent
EXAMPLE = "examples/ddp_minimal.py"


def template(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`traceml slurm template ARGS` as a user runs it, here (where Slurm answers)."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "template", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def summary_path(logs: Path, job_name: str, job_id: str) -> Path:
    return logs / f"{job_name}-{job_id}" / "final_summary.json"


# ---- checks against the cluster ---------------------------------------------------------------------


@pytest.mark.parametrize("args,words", [
    (["--partition", "short", "--time", "10"], ["MaxTime 5:00", "PENDING"]),
    (["--partition", "nope"], ["partition nope does not exist", "debug, short"]),
    (["--gpus-per-node", "2", "--gpu-type", "h100"], ["--gpu-type=h100", "valid there: a100"]),
    (["--gpus-per-node", "5"], ["at most 4"]),
])
def test_template_refuses_a_job_that_does_not_fit(slurm_cluster, tmp_path, args, words):
    proc = template(*args, "train.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.sbatch"))


def test_template_checks_a_fitting_job_and_runs_test_only(slurm_cluster, tmp_path):
    proc = template("--nodes", "2", "--gpus-per-node", "2", "--gpu-type", "a100", "--partition", "short",
                    "--time", "4", "--test-only", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checked against this cluster: partition short exists" in proc.stdout
    assert "--time=4 fits its MaxTime (5:00)" in proc.stdout
    assert re.search(r"sbatch --test-only \(exit 0\): .*Job \d+ to start at .* in partition short", proc.stdout)


# ---- the time-limit plumbing ------------------------------------------------------------------------

PROBE = """#!{python}
# Stands in for `traceml run`: records its start and every SIGTERM; after the first one it "writes
# the summary" for a while (node 0 longer than the others, like the real launcher) and exits 143.
import os, signal, sys, time
log = open(os.path.join(os.environ["PROBE_DIR"], "node%s.log" % os.environ["SLURM_NODEID"]), "a", buffering=1)
log.write("start %f args=%s token=%s unbuffered=%s tasks=%s\\n" % (time.time(), " ".join(sys.argv[1:]),
          os.environ.get("TRACEML_TOKEN"), os.environ.get("PYTHONUNBUFFERED"), os.environ.get("SLURM_STEP_TASKS_PER_NODE")))
terms = []
signal.signal(signal.SIGTERM, lambda *_: (terms.append(time.time()), log.write("TERM %f\\n" % terms[-1])))
while not terms:
    time.sleep(0.05)
busy_until = terms[0] + (3.0 if os.environ["SLURM_NODEID"] == "0" else 0.5)
while time.time() < busy_until:
    time.sleep(0.05)
log.write("exit 143\\n")
sys.exit(143)
"""


@pytest.mark.slow
def test_time_limit_signal_reaches_every_launcher_as_sigterm(slurm_cluster, tmp_path):
    probe_bin = tmp_path / "bin"
    probe_bin.mkdir()
    (probe_bin / "traceml").write_text(PROBE.format(python=sys.executable))
    (probe_bin / "traceml").chmod(0o755)
    # --time=1 with a 10 s margin: slurmctld checks time limits every 30 s and sends the signal at the
    # first check past 60 - 10 - 30 s, so 20-50 s in; the limit itself is enforced at a check past 60 s.
    proc = template("--nodes", "2", "--gpus-per-node", "2", "--time", "1", "--signal-margin", "10",
                    "--setup", f"export PATH={probe_bin}:$PATH", "--env", f"PROBE_DIR={tmp_path}",
                    "--setup", "trap 'echo BATCH-SHELL-GOT-TERM' TERM",
                    "--job-name", "tpl-signal", "train.py", "--epochs", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    started = time.time()
    job = slurm_cluster.submit(str(tmp_path / "tpl-signal.sbatch"), cwd=tmp_path)
    state = slurm_cluster.wait(job, timeout=120)
    out = slurm_cluster.output(job)
    info = slurm_cluster.job_info(job)[0]

    logs = {n: (tmp_path / f"node{n}.log").read_text().splitlines() for n in (0, 1)}
    starts = [next(line for line in logs[n] if line.startswith("start ")) for n in (0, 1)]
    for line in starts:  # what the job hands each node's launcher
        assert "args=run --mode=summary train.py -- --epochs 3 " in line
        assert "unbuffered=1" in line and "tasks=1(x2)" in line
    tokens = {re.search(r"token=(\S*)", line).group(1) for line in starts}
    assert len(tokens) == 1 and re.fullmatch(r"[0-9a-f]{32}", tokens.pop()), "one random token, on every node"

    terms = {n: [float(line.split()[1]) for line in logs[n] if line.startswith("TERM ")] for n in (0, 1)}
    # Both launchers got a plain SIGTERM (srun's SIGKILL could not be handled), together, before the limit.
    assert terms[0] and terms[1], logs
    # before the limit: within 60 s of the job's start as the controller has it (not of the submit,
    # which a loaded controller may start late)
    begun = time.mktime(time.strptime(info["StartTime"], "%Y-%m-%dT%H:%M:%S"))
    assert abs(terms[0][0] - terms[1][0]) < 2 and terms[0][0] - begun < 60 + 1, (terms, begun, started)
    assert len(terms[1]) == 1 and logs[1][-1] == "exit 143", logs[1]
    # Node 0 was still busy when node 1 exited 143: --kill-on-bad-exit then sends it SIGTERM again, and
    # SIGKILL only KillWait (5 s here) later, so its 3 s of summary writing still complete.
    assert len(terms[0]) <= 2 and logs[0][-1] == "exit 143", logs[0]
    assert "#SBATCH --signal=TERM@10" in (tmp_path / "tpl-signal.sbatch").read_text()
    assert "BATCH-SHELL-GOT-TERM" not in out, out  # the signal goes to the step's tasks only
    # The batch shell waited for srun and exits with its status; the job stopped itself before TIMEOUT.
    assert (state, info["ExitCode"]) == ("FAILED", "143:0"), (state, info["ExitCode"], out)


# ---- end to end with the real launcher --------------------------------------------------------------


def _pipeline_job(tmp_path: Path, *extra: str, name: str, steps: int):
    logs = tmp_path / "logs"
    proc = template("--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "2", "-o", str(tmp_path / "job"),
                    "--job-name", name, "--logs-dir", str(logs),
                    "--setup", f"export PATH={BIN}:$PATH", "--env", f"PYTHONPATH={SRC}", "--env", "OMP_NUM_THREADS=1",
                    *extra, EXAMPLE, "--steps", str(steps), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "job" / f"{name}.sbatch", logs


@pytest.mark.slow
def test_generated_two_node_job_ends_with_a_summary_on_node_0(slurm_cluster, tmp_path):
    sbatch, logs = _pipeline_job(tmp_path, "--time", "10", name="tpl-e2e", steps=60)
    job = slurm_cluster.submit(str(sbatch), cwd=ROOT)  # submitted from the repository, like a user
    state = slurm_cluster.wait(job, timeout=180)
    out = slurm_cluster.output(job)
    path = summary_path(logs, "tpl-e2e", job)
    assert state == "COMPLETED", out
    assert path.exists(), out
    summary = json.loads(path.read_text())
    assert summary["topology"]["nnodes"] == 2 and summary["topology"]["world_size"] == 4, summary["topology"]
    assert summary["run"]["status"] == "completed"
    assert (path.parent / "final_summary.txt").exists()


@pytest.mark.slow
def test_generated_job_at_its_time_limit_writes_the_summary_marked_interrupted(slurm_cluster, tmp_path):
    # the signal comes 25-55 s in (see above), 30 s or more before the limit is enforced
    sbatch, logs = _pipeline_job(tmp_path, "--time", "1", "--signal-margin", "5", name="tpl-limit", steps=10**7)
    job = slurm_cluster.submit(str(sbatch), cwd=ROOT)
    state = slurm_cluster.wait(job, timeout=150)
    out = slurm_cluster.output(job)
    path = summary_path(logs, "tpl-limit", job)
    assert state != "COMPLETED", out
    assert path.exists(), out
    summary = json.loads(path.read_text())
    assert summary["run"]["status"] == "interrupted", summary["run"]
    assert summary["topology"]["nnodes"] == 2 and summary["topology"]["world_size"] == 4
    assert "#SBATCH --signal=TERM@5" in sbatch.read_text()
