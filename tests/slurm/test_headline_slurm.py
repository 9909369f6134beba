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


def test_a_hang_on_node_2_gets_an_autopsy_naming_node_2(slurm_cluster, tmp_path):
    """Rank 1, on node 2, deadlocks at step 30; rank 0, on node 1, then waits for it in the
    gradient all-reduce. With --hang-report-after=5 node 0 writes the hang report to the job log
    within the documented bound and the summary names rank 1 on node2 as the rank that never
    arrived, with its stack; --hang-timeout=25 then ends the run (exit 124)."""
    progress = tmp_path / "progress"
    progress.mkdir()
    body = (TOKEN + f"srun --kill-on-bad-exit=1 traceml run --hang-report-after=5 --hang-timeout=25 "
            f"{FAULTY} --steps 100000 --step-ms 10 --fault hang --fault-rank 1 --fault-step 30 --settle 0\n")
    job, state, out = slurm_cluster.run_job(body, *TWO_NODES, timeout=240,
                                            env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    data = summary(tmp_path)
    h = data.get("hang")
    assert h, (data["run"], out[-4000:])
    assert h["culprits"] == [1], h["finding"]
    r1 = next(a for a in h["ranks"] if a["rank"] == 1)
    r0 = next(a for a in h["ranks"] if a["rank"] == 0)
    assert r1["node"] == 1 and r1["host"] == "node2" and r1["state"] == "running", r1
    assert r1["where"].startswith("faulty_train.py:") and r1["stack"], r1
    assert r0["state"] == "collective" and r0["host"] == "node1", r0
    assert "rank 1 (node 1, node2) never arrived" in h["finding"]
    v = data["verdict"]
    assert v["kind"] == "hang" and v["culprit"] == {"rank": 1, "node": 1, "host": "node2"}, v
    assert "hang report:" in out and "rank 1 (node 1, node2)" in out
    assert data["run"]["exit_code"] == 124, data["run"]
    # the bound: hang (rank 1's last step + its fault) -> report in node 0's log
    hung_at = max(float(ln.split()[2]) for ln in (progress / "rank1.txt").read_text().splitlines()
                  if ln.startswith("step"))
    took = h["at"] - hung_at
    print(f"hang on node 2 -> report: {took:.1f} s (--hang-report-after=5)")
    assert took < 5 + 6, took
