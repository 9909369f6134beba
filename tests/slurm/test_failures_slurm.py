"""Failure causality across two nodes of the real local Slurm (issue 31, item 6): rank 1, on node
2, calls one all_reduce the other rank does not (a collective mismatch); gloo aborts it from native
code. Its last stderr lines travel with node 2's worker report to node 0, so the headline names
rank 1 on node2 and quotes gloo's own sentence, not "a segfault"; rank 0 on node1 lost its peer.
(Single-node cases, and the rank that finished early: tests/faults/test_failure_runs.py.)
"""

from __future__ import annotations

from e2e import REPO, job_env, summary

FAULTY = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
GLOO_MISMATCH = "Is there a distributed collective mismatch in your code?"


def test_a_collective_mismatch_on_node_2_is_quoted_in_the_headline(slurm_cluster, tmp_path):
    progress = tmp_path / "progress"
    progress.mkdir()
    # (no --kill-on-bad-exit: node 0 writes the summary however long its rank takes to exit after
    # losing its peer; with it, srun kills node 0 KillWait after node 2 failed, 5 s on this cluster)
    body = (TOKEN + f"srun traceml run {FAULTY} --steps 200 --step-ms 10 "
            "--fault mismatch --fault-rank 1 --fault-step 30\n")
    job, state, out = slurm_cluster.run_job(body, *TWO_NODES, timeout=180,
                                            env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    assert state == "FAILED", out[-3000:]
    data = summary(tmp_path)
    v = data["verdict"]
    assert v["kind"] == "run_failed", (v, out[-3000:])
    assert v["culprit"] == {"rank": 1, "node": 1, "host": "node2"}, v
    ev = v["evidence"]
    assert ev["cause"] == "collective_mismatch" and ev["signal"] == "SIGABRT", ev
    assert ev["library"]["library"] == "gloo" and GLOO_MISMATCH in ev["library"]["text"], ev
    assert ev["consequence_ranks"] == [0], ev
    assert GLOO_MISMATCH in v["why"] and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in v["next_step"], v
    assert v["why"].startswith("rank 1 (node 1, node2) was killed by SIGABRT"), v["why"]
    assert GLOO_MISMATCH in data["run"]["reason"], data["run"]
    assert "Verdict: RUN-FAILED (critical): rank 1 (node 1, node2) was killed by SIGABRT" in out
    # the worker's own output still reached the job's log, unchanged
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in out
    # a mismatch is the script's: node2 gets no evidence against it in the node store
    from traceml_core.report.document import read
    from traceml_core.report.nodeevidence import run_evidence

    assert not [o for o in run_evidence(read(data)).observations if o.kind == "failure"]
