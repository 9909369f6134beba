"""The dev cluster behaves like the multi-node GPU cluster the product is built for.

If one of these fails, every other cluster test would fail in a confusing way; these say what is
broken in the cluster itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from cluster import ClusterError

import pytest


def test_two_node_job_runs_one_task_per_node_with_gpus(slurm_cluster):
    job, state, out = slurm_cluster.run_job(
        "srun bash -c 'echo \"$SLURM_NODEID $(hostname) $(hostname -I) $SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES\"'\n",
        "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2")
    assert state == "COMPLETED", out
    lines = sorted(line.split() for line in out.splitlines() if line.strip())
    ips = [slurm_cluster.node_ip(n) for n in ("node1", "node2")]
    assert lines == [["0", "node1", ips[0], "2", "0,1"], ["1", "node2", ips[1], "2", "0,1"]]


def test_tcp_between_nodes_with_the_test_venv(slurm_cluster, tmp_path):
    """Node 1 listens, node 0 connects by host name: what a rendezvous or the aggregator needs.

    Runs under this test's own interpreter, so it also proves the venv is usable inside job steps.
    """
    prog = tmp_path / "tcp.py"
    prog.write_text(textwrap.dedent("""
        import os, socket, time
        port = 20000 + int(os.environ["SLURM_JOB_ID"]) % 10000
        peer = os.environ["PEER"]
        if os.environ["SLURM_NODEID"] == "1":
            with socket.create_server(("0.0.0.0", port)) as srv:
                srv.settimeout(20)
                conn, addr = srv.accept()
                conn.sendall(f"hello from {socket.gethostname()} to {addr[0]}".encode())
                conn.close()
        else:
            deadline = time.monotonic() + 20
            while True:
                try:
                    conn = socket.create_connection((peer, port), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            print(conn.recv(100).decode(), flush=True)
    """))
    _, state, out = slurm_cluster.run_job(
        f"PEER=node2 srun {sys.executable} {prog}\n", "--nodes=2", "--ntasks-per-node=1")
    assert state == "COMPLETED", out
    assert out.strip() == f"hello from node2 to {slurm_cluster.node_ip('node1')}"


def test_processes_a_step_leaves_behind_are_killed(slurm_cluster):
    """proctrack/cgroup: even a setsid'd child (as torch elastic starts its workers) dies with its step."""
    step = subprocess.Popen(["srun", "-N1", "-w", "node3", "bash", "-c", "setsid sleep 300 & echo $!; sleep 2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        pid = int(step.stdout.readline())
        assert pid in slurm_cluster.node_pids("node3")  # it did start, on node3
        assert step.wait(timeout=30) == 0
    finally:
        if step.poll() is None:
            step.kill()
    deadline = time.monotonic() + 5
    while pid in slurm_cluster.node_pids("node3") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid not in slurm_cluster.node_pids("node3")


def test_short_partition_refuses_a_long_time_limit(slurm_cluster):
    with pytest.raises(ClusterError, match="time limit"):
        slurm_cluster.submit("true\n", "--partition=short", "--time=10")
    job, state, _ = slurm_cluster.run_job("true\n", "--partition=short", "--time=1")
    assert state == "COMPLETED"


def test_on_node_runs_in_that_nodes_namespace(slurm_cluster):
    out = slurm_cluster.on_node("node2", "sh", "-c", "hostname; hostname -I").stdout.split()
    assert out == ["node2", slurm_cluster.node_ip("node2")]
