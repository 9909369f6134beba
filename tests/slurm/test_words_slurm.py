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
