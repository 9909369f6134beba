"""Issue 34, findings 3 and 4, on the real local Slurm cluster: the node store is never on the
summary's critical path, and a host a process of the run claims counts only when Slurm gave the
job that node.

* ``scancel`` of a 2-node job while another process holds the user's node store locked
  (``BEGIN EXCLUSIVE``, as a job stuck in a write would): the final summary must be written
  within KillWait. Before the fix the store was read and written inside summary building with a
  5 s wait each, and after ``scancel`` with KillWait 5 there was no final summary at all.
* A 2-node job on node1 and node2 whose second node's launcher says it is ``node3`` (its own UTS
  namespace, ``hostname node3``: what any process of the job that can rename its host does) and
  whose rank there is slow: before the fix its slow compute went into the store against node3, a
  node the job never used (and twice: ``#SBATCH --exclude=node3``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from e2e import REPO, job_env, summary

EXAMPLE = REPO / "examples" / "ddp_minimal.py"
STRAGGLER = REPO / "examples" / "straggler.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
KILLWAIT = float(os.environ.get("TRACEML_CLUSTER_KILLWAIT", "5"))
LOCKER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


def _records(state_file: Path) -> int:
    from traceml_core.rundir import load_checkpoint
    try:
        return int(load_checkpoint(state_file)["state"]["records"])
    except (OSError, ValueError):
        return 0


def _store_with_a_record(path: Path) -> None:
    from traceml_core.plugins import NodeObservation, RunEvidence
    from traceml_slurm.nodes import record

    ev = RunEvidence("1", "before", time.time() - 60, "run", ("node1", "node2"),
                     tuple(NodeObservation(h, "link_send", 1.5, 1.5, "GB/s") for h in ("node1", "node2")))
    assert record(path, "", ev)[1] == []


def test_scancel_writes_the_summary_before_killwait_with_the_node_store_locked(slurm_cluster, tmp_path):
    store = tmp_path / "nodes.sqlite"
    _store_with_a_record(store)
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        script = TOKEN + f"srun traceml run {EXAMPLE} --steps 10000000 --run-name=cancelled\n"
        job = slurm_cluster.submit(script, *TWO_NODES, env=job_env(tmp_path))
        state_file = tmp_path / "cancelled" / "aggregate.state"
        deadline = time.monotonic() + 180   # two torch imports per node first: 30-45 s each under load
        while _records(state_file) < 50:
            assert time.monotonic() < deadline, "telemetry never started flowing"
            time.sleep(0.2)
        t_cancel = time.time()
        slurm_cluster.run("scancel", job)
        state = slurm_cluster.wait(job, timeout=60)
        out = slurm_cluster.output(job)
    finally:
        locker.stdin.close()
        locker.wait(30)
    assert state == "CANCELLED", out
    path = tmp_path / "cancelled" / "final_summary.json"
    data = json.loads(path.read_text())
    written = path.stat().st_mtime - t_cancel
    print(f"scancel with the node store locked -> final summary written: {written:.2f} s (KillWait {KILLWAIT:.0f} s)")
    assert not data["provisional"], "only the provisional summary was written"
    assert written < KILLWAIT, f"summary written {written:.1f} s after scancel; KillWait is {KILLWAIT} s"
    notes = (data.get("next_job") or {}).get("notes") or []
    assert any(f"the node store {store} was busy" in n and "skipped" in n for n in notes), notes
    with sqlite3.connect(store) as conn:   # the lock is gone: the store holds only the record before
        assert [r[0] for r in conn.execute("SELECT run_name FROM records")] == ["before"]


def test_a_host_the_job_was_not_given_is_never_recorded(slurm_cluster, tmp_path):
    launch = tmp_path / "launch.sh"
    launch.write_text("#!/bin/bash\n"
                      f'run="traceml run {STRAGGLER} --steps 60"\n'
                      # node 1's launcher (and its rank) in a UTS namespace of their own, named node3
                      '[ "$SLURM_NODEID" = 1 ] && exec unshare --uts sh -c "hostname node3 && exec $run"\n'
                      "exec $run\n")
    launch.chmod(0o755)
    job, state, out = slurm_cluster.run_job(TOKEN + f"srun --kill-on-bad-exit=1 {launch}\n", *TWO_NODES,
                                            "-w", "node1,node2", timeout=240,
                                            env=job_env(tmp_path, STRAGGLER_RANK="1", STRAGGLER_DELAY_MS="40"))
    assert state == "COMPLETED", out[-3000:]
    data = summary(tmp_path)
    assert [n["hostname"] for n in data["topology"]["nodes"]] == ["node1", "node3"], data["topology"]
    notes = (data.get("next_job") or {}).get("notes") or []
    assert any("'node3' (named by node 1's launcher) is not a node of job " in n and "(node[1-2])" in n
               and "its evidence is not recorded" in n for n in notes), notes
    env = job_env(tmp_path)
    got = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    hosts = {n["host"] for n in json.loads(got.stdout)["nodes"]}
    assert "node3" not in hosts and hosts <= {"node1", "node2"}, got.stdout
