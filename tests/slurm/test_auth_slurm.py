"""Authentication on the real local Slurm cluster, zero-config (no TRACEML_TOKEN anywhere).

1. A 2-node job without TRACEML_TOKEN works, and during it another machine (the login namespace,
   not node 0's launcher) attacks node 0's aggregator: a token computed from the public facts the
   previous version derived it from (job id, user, master, run name, node count, port: all in
   ``squeue``) is refused; so is a ``control`` hello signed with the run's real token (only node 0's
   launcher holds the control key), and a ``finish`` sent on an authenticated node link is ignored:
   the run completes with every record counted.
2. The two nodes do not share a home directory (each launcher has another HOME, so another
   per-user secret): training is untouched, node 1's launcher says its token was not accepted and
   names TRACEML_TOKEN, and the summary says node 1 never joined and the telemetry is incomplete.
"""

from __future__ import annotations

import hashlib
import re
import socket
import time
from pathlib import Path

from e2e import REPO, job_env, summary
from traceml_core.launcher.token import job_token, user_secret
from traceml_core.wire.auth import AGGREGATOR, AUTH_FAILED, make_hello
from traceml_core.wire.protocol import FrameBuffer, encode

TRAIN = REPO / "tests" / "faults" / "faulty_train.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
STEPS = 300


def _answer(host: str, port: int, frames: list[bytes], timeout: float = 5.0) -> list[dict]:
    """Send ``frames`` on one connection; what the server answered before closing (or timing out)."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(b"".join(frames))
    buf, got = FrameBuffer(), []
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            got.extend(buf.feed(data))
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return got


def _wait_output(cluster, job: str, pattern: str, timeout: float = 90) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = re.search(pattern, cluster.output(job))
            if m:
                return m
        except (OSError, KeyError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{pattern!r} never appeared in job {job}'s output")


def test_zero_config_job_refuses_public_fact_tokens_and_foreign_control(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = (f"#!/bin/bash\nsrun --kill-on-bad-exit=1 traceml run {TRAIN} --steps {STEPS} "
              f"--step-ms 40 --run-name=authz\n")
    job = slurm_cluster.submit(script, *TWO_NODES, env=job_env(tmp_path, HOME=str(home)))
    m = _wait_output(slurm_cluster, job, r"aggregator (node\d):(\d+)")
    master, port = m.group(1), int(m.group(2))
    _wait_output(slurm_cluster, job, r"node 1 \(node\d\) joined")
    ip = slurm_cluster.node_ip(master)

    # 1. the token as the previous version derived it, from facts any cluster user can read
    public = "\0".join(["traceml-v1", job, "root", master, "authz", "2", str(port)])
    guessed = hashlib.sha256(public.encode()).hexdigest()[:32]
    got = _answer(ip, port, [encode(make_hello(guessed, aud=AGGREGATOR, run="authz", job=job, node=1,
                                               rank=-1, kind="node", host="intruder"))])
    assert got and got[0]["t"] == "refused" and got[0]["reason"] == AUTH_FAILED, got

    # 2. the run's real token (what any process of the run holds) cannot open a control link
    real = job_token(user_secret(home / ".traceml" / "secret"), job_id=job, run_name="authz",
                     master_addr=master, aggregator_port=port, nnodes=2)
    got = _answer(ip, port, [encode(make_hello(real, aud=AGGREGATOR, run="authz", job=job, node=0,
                                               rank=-1, kind="control", host="intruder")),
                             encode({"t": "finish", "exit_code": 0, "id": 1})])
    assert got and got[0]["t"] == "refused" and got[0]["reason"] == AUTH_FAILED, got

    # 3. ... and a finish on a node link it can open is not a node's frame: ignored
    got = _answer(ip, port, [encode(make_hello(real, aud=AGGREGATOR, run="authz", job=job, node=1,
                                               rank=-1, kind="node", host="intruder")),
                             encode({"t": "finish", "exit_code": 0, "id": 1})], timeout=2.0)
    assert got and got[0]["t"] == "welcome" and [f["t"] for f in got[1:]] in ([], ["end"]), got

    state = slurm_cluster.wait(job, timeout=180)
    out = slurm_cluster.output(job)
    assert state == "COMPLETED", out[-3000:]
    data = summary(tmp_path, "authz")
    tel = data["telemetry"]
    assert data["run"]["status"] == "completed", data["run"]
    assert tel["records_received"] == 2 * STEPS and tel["complete"], tel
    assert tel["wire"]["refused"] == 2 and tel["wire"]["ignored_frames"] >= 1, tel["wire"]
    assert re.search(r"traceml-aggregator: refused connection from [\d.]+:\d+: authentication failed", out)
    assert "TRACEML_TOKEN is not set" not in out  # no warning: zero-config is secure now
    secret = home / ".traceml" / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600


def test_nodes_without_a_shared_home_get_an_error_naming_traceml_token(slurm_cluster, tmp_path):
    launch = tmp_path / "launch.sh"
    launch.write_text(f"#!/bin/bash\nexport HOME={tmp_path}/home-$SLURM_NODEID\nmkdir -p $HOME\n"
                      f"exec traceml run {TRAIN} --steps 80 --step-ms 20 --run-name=split\n")
    launch.chmod(0o755)
    job, state, out = slurm_cluster.run_job(f"#!/bin/bash\nsrun --kill-on-bad-exit=1 {launch}\n",
                                            *TWO_NODES, timeout=180, env=job_env(tmp_path))
    assert state == "COMPLETED", out[-3000:]  # training itself is untouched
    m = re.search(r"error: node 0's aggregator does not accept this node's token.*", out)
    assert m, out[-3000:]
    line = m.group(0)
    assert "TRACEML_TOKEN" in line and "home directory is not shared" in line
    assert str(Path(tmp_path) / "home-1" / ".traceml" / "secret") in line
    data = summary(tmp_path, "split")
    nodes = data["topology"]["nodes"]
    assert nodes[0]["joined"] and not nodes[1]["joined"]
    assert not data["telemetry"]["complete"]
    assert data["telemetry"]["wire"]["refused"] >= 1
