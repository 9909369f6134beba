"""The headline on the real local Slurm, two nodes: a failure on node 2 is named as the first
failure (with its host), and the other node's errors are consequences.
"""

from __future__ import annotations

from e2e import REPO, job_env, summary

FAULTY = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"


def test_a_rank_raising_on_node_2_is_the_headline(slurm_cluster, tmp_path):
    progress = tmp_path / "progress"
    progress.mkdir()
    body = (TOKEN + f"srun --kill-on-bad-exit=1 traceml run {FAULTY} --steps 200 --step-ms 10 "
            "--fault raise --fault-rank 1 --fault-step 30\n")
    job, state, out = slurm_cluster.run_job(body, *TWO_NODES, timeout=180,
                                            env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    assert state == "FAILED", out[-3000:]
    data = summary(tmp_path)
    v = data["verdict"]
    assert v["kind"] == "run_failed", (v, out[-3000:])
    assert v["culprit"] == {"rank": 1, "node": 1, "host": "node2"}, v
    ev = v["evidence"]
    assert ev["exception_type"] == "RuntimeError" and ev["step"] == 30 and ev["consequence_ranks"] == [0]
    assert data["run"]["reason"].startswith("rank 1 raised RuntimeError before step 30"), data["run"]
    assert "Verdict: RUN-FAILED (critical): rank 1 (node 1, node2) raised RuntimeError" in out
