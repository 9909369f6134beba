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


def _exact(state, out, tmp_path, run, records):
    """The job completed and its summary holds every record, none dropped or malformed."""
    assert state == "COMPLETED", out
    data = summary(tmp_path, run)
    tel = data["telemetry"]
    assert tel["records_received"] == tel["records_expected"] == records and tel["complete"]
    assert tel["relay_dropped"] == 0 and tel["wire"]["malformed"] == 0
    return data, tel


def test_relay_fan_in_and_exact_counts(slurm_cluster, tmp_path):
    job, state, out = slurm_cluster.run_job(SCRIPT, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2",
                                            "--cpus-per-task=1", timeout=150, env=job_env(tmp_path))
    data, tel = _exact(state, out, tmp_path, "relay", 4 * 80)
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


TREE = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {REPO}/examples/ddp_minimal.py --steps 80 --run-name=tree --relay-fan-in 2
"""


def test_a_group_relay_on_a_real_allocation(slurm_cluster, tmp_path):
    """The tree as `traceml run` sets it up (forced small: groups of 2 nodes): node 2 is its
    group's first node, so its launcher serves a group relay on the aggregator's port and its own
    relay reports to it, by the hostname Slurm gives; node 0 sees the group's link, not node
    2's, and the summary is that of direct links."""
    job, state, out = slurm_cluster.run_job(TREE, "--nodes=3", "--ntasks-per-node=1", "--gres=gpu:1",
                                            "--cpus-per-task=1", timeout=180, env=job_env(tmp_path))
    data, tel = _exact(state, out, tmp_path, "tree", 3 * 80)
    # control + nodes 0 and 1 + the group relay of node 2 (not node 2's own relay)
    assert tel["wire"]["connections"] == 4, tel["wire"]
    ranks = data["ranks"]
    assert [(r["rank"], r["status"], r["steps"], r["node"]) for r in ranks] == [
        (i, "clean", 80, i) for i in range(3)]
    assert [r["host"] for r in ranks] == ["node1", "node2", "node3"]
    assert data["topology"]["nodes_joined"] == 3
    assert not any(n["left_early"] for n in data["topology"]["nodes"])
    assert "cannot start the relay of nodes" not in out, out
