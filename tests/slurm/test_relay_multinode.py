"""The per-node relay on the real local Slurm: node 0's fan-in is the number of nodes.

A 2-node x 2-worker job: exact record counts and rank identities, and node 0's aggregator accepts
one connection per node plus its launcher's control connection; the ranks never reach it.
"""

from __future__ import annotations

from e2e import REPO, job_env, summary

SCRIPT = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {REPO}/examples/ddp_minimal.py --steps 80 --run-name=relay
"""


def test_relay_fan_in_and_exact_counts(slurm_cluster, tmp_path):
    job, state, out = slurm_cluster.run_job(SCRIPT, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2",
                                            "--cpus-per-task=1", timeout=150, env=job_env(tmp_path))
    assert state == "COMPLETED", out
    data = summary(tmp_path, "relay")
    tel = data["telemetry"]
    assert tel["records_received"] == tel["records_expected"] == 4 * 80 and tel["complete"]
    assert tel["relay_dropped"] == 0 and tel["wire"]["malformed"] == 0
    # control + one link per node
    assert tel["wire"]["connections"] == 3, tel["wire"]
    ranks = data["ranks"]
    assert [(r["rank"], r["status"], r["steps"]) for r in ranks] == [(i, "clean", 80) for i in range(4)]
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2", "node2"]
    assert [r["node"] for r in ranks] == [0, 0, 1, 1]
    assert data["topology"]["nodes_joined"] == 2
    # a clean run: every rank exact (no reconnect counted), "none lost", and no log line that
    # claims a loss or a lost connection (the false alarm at the end of clean runs, issue 17)
    assert all(r["telemetry"]["reconnects"] == 0 and r["telemetry"]["unsent_max"] == 0 for r in ranks), ranks
    assert tel["ranks_without_goodbye"] == 0 and "none lost" in out
    for claim in ("lost the connection", "reconnecting", "could not forward", "could not deliver"):
        assert claim not in out, out
