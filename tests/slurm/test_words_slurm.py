"""The words of a multi-node failure on the real local Slurm: a rank SIGKILLed on node 2 makes the
run "failed" with that rank "crashed" (by SIGKILL) and named as the culprit, as on one node; the
rank on node 1 that lost its peer is a consequence. (Issue 15: it was "interrupted" / "vanished".)
"""

from __future__ import annotations

from e2e import REPO, job_env, summary

FAULTY = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"


def test_a_rank_sigkilled_on_node_2_is_crashed_and_the_culprit(slurm_cluster, tmp_path):
    progress = tmp_path / "progress"
    progress.mkdir()
    body = (TOKEN + f"srun --kill-on-bad-exit=1 traceml run {FAULTY} --steps 400 --step-ms 10 "
            "--fault kill --fault-rank 1 --fault-step 30\n")
    job, state, out = slurm_cluster.run_job(body, *TWO_NODES, timeout=180,
                                            env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    assert state == "FAILED", out[-3000:]
    data = summary(tmp_path)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert data["run"]["status"] == "failed", (data["run"], out[-3000:])
    assert ranks[1]["status"] == "crashed", (ranks[1], out[-3000:])
    v = data["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"] == {"rank": 1, "node": 1, "host": "node2"}, v
    assert "SIGKILL" in data["run"]["reason"], data["run"]
    assert ranks[0]["status"] != "crashed"


def test_doctor_local_in_an_salloc_shell_names_the_jobs_gpu_request(slurm_cluster, tmp_path):
    """`salloc --gres=gpu:2` then `traceml slurm doctor --local` on the login host: the GPU check
    does not claim the job asked for no GPUs; it names the request (from the controller) and says
    this host is not a node of the job."""
    import json
    import os
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "SLURM_JOB", "SLURM_STEP"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    p = slurm_cluster.run("salloc", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2", sys.executable, "-m",
                          "traceml_core.cli", "slurm", "doctor", "--local", "--json", env=env, cwd=tmp_path,
                          check=False, timeout=120)
    report = json.loads(p.stdout)
    assert report["job"]["context"] == "salloc shell", report["job"]
    gpu = next(c for c in report["checks"] if c["id"] == "gpu.count")
    observed = json.dumps(gpu)
    assert "asked for none" not in observed, observed
    assert "not a node of job" in observed and "gpu:2" in observed, observed
