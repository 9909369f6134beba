"""The coordinator and its agents over real TCP on this machine, with a stand-in for srun that starts
the agents locally (the real srun path is in tests/slurm). Covers what needs no second host: the HMAC
hello, a node that never answers (named), srun failing at once, and the bounded wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
FAKE_SRUN = r"""#!/bin/bash
# stand-in for srun: --nodes=N agents of a job whose nodes are fake1..N, started here
[ -n "$FAKE_SRUN_FAIL" ] && { echo "srun: error: Unable to create step for job 9: Requested nodes are busy" >&2; exit 1; }
n=1; cmd=()
for a in "$@"; do case "$a" in --nodes=*) n=${a#--nodes=};; --*) ;; *) cmd+=("$a");; esac; done
start=${FAKE_SRUN_ONLY:-$n}
for i in $(seq 0 $((start-1))); do
  SLURM_STEP_ID=1 SLURM_STEP_NUM_NODES=$n SLURM_STEP_NODELIST="fake[1-$n]" SLURM_STEP_TASKS_PER_NODE="1(x$n)" \
  SLURM_NODEID=$i SLURMD_NODENAME=fake$((i+1)) "${cmd[@]}" &
done
if [ -n "$FAKE_SRUN_ROGUE" ]; then   # a process that knows the address but not the token
  SLURM_NODEID=2 SLURMD_NODENAME=fake3 TRACEML_DOCTOR_TOKEN=guessed "${cmd[@]}" &
fi
wait
"""
IGNORE = ("gpu,sw.torch,sw.nccl,net,ctl,time,cross.gloo-allreduce,cross.ports-reachable,cross.master-address,cross.aggregator,"
          "cross.link-bandwidth")  # the link probe needs hosts that resolve: tests/slurm


@pytest.fixture()
def job_env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "TRACEML_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin", PYTHONPATH=SRC,
               SLURM_JOB_ID="9", SLURM_JOB_NAME="ddp", SLURM_JOB_NODELIST="fake[1-3]", SLURM_JOB_NUM_NODES="3",
               SLURM_NNODES="3", SLURM_NODEID="0", SLURMD_NODENAME="fake1", SLURM_TASKS_PER_NODE="1(x3)",
               SLURM_SUBMIT_DIR=str(tmp_path), TRACEML_LOGS_DIR=str(tmp_path / "logs"))
    return env


def run(env, *args, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "doctor", "--json", "--ignore", IGNORE,
                        *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=env["SLURM_SUBMIT_DIR"])
    data = json.loads(p.stdout)
    return p, {c["id"]: c for c in data["checks"]}, time.monotonic() - t0


def test_all_agents_answer_and_their_node_checks_arrive(job_env):
    p, checks, _ = run(job_env, "--timeout", "10")
    answers = checks["cross.answers"]
    assert answers["status"] == "pass" and set(answers["nodes"]) == {"fake1", "fake2", "fake3"}
    cfg = checks["slurm.launch-config"]["nodes"]
    assert {n: o["data"]["config"]["node_rank"]["value"] for n, o in cfg.items()} == {"fake1": 0, "fake2": 1, "fake3": 2}
    assert checks["cross.node-ranks"]["status"] == "pass"
    assert checks["cross.logs-shared"]["status"] == "pass"  # one machine: the logs dir is shared for real
    assert checks["cross.versions"]["status"] == "pass"


def test_a_node_that_never_answers_is_named_within_the_timeout(job_env):
    job_env["FAKE_SRUN_ONLY"] = "2"
    p, checks, took = run(job_env, "--timeout", "2")
    answers = checks["cross.answers"]["nodes"]
    assert answers["fake3"]["status"] == "fail" and "no answer within 2 s" in answers["fake3"]["observed"]
    assert answers["fake1"]["status"] == "pass" and p.returncode == 1
    assert checks["cross.gloo-allreduce"]["ignored"] is True
    assert took < 2 + 15, took  # bounded: the 2 s wait plus start-up, never a hang


def test_an_agent_without_the_token_is_refused(job_env):
    job_env["FAKE_SRUN_ONLY"] = "2"
    job_env["FAKE_SRUN_ROGUE"] = "1"
    p, checks, _ = run(job_env, "--timeout", "2")
    answers = checks["cross.answers"]["nodes"]
    assert answers["fake3"]["status"] == "fail"  # the rogue "fake3" was not let in
    assert "fake3" not in checks["slurm.launch-config"]["nodes"]


def test_srun_failing_at_once_ends_the_wait_with_its_error(job_env):
    job_env["FAKE_SRUN_FAIL"] = "1"
    p, checks, took = run(job_env, "--timeout", "30")
    obs = checks["cross.answers"]["nodes"]["fake2"]["observed"]
    assert "Requested nodes are busy" in obs and p.returncode == 1
    assert took < 15, took  # did not sit out the 30 s


# -- the command table: both ends go through it ---------------------------------------------------------

def _agent(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from doctor_env import make, step

    from traceml_slurm.doctor.agent import Agent

    return Agent(make(step(TRACEML_LOGS_DIR=str(tmp_path))), link=None, token="t" * 32)


def test_every_command_is_answered_through_the_table(tmp_path):
    from traceml_slurm.doctor import wire

    agent = _agent(tmp_path)
    for cmd in wire.COMMANDS.values():
        assert not cmd.handler or callable(getattr(agent, cmd.handler, None)), cmd.name
    assert wire.dispatch(agent, {"t": "d.nope"}) == {"t": "d.error", "error": "unknown command 'd.nope'"}
    assert wire.dispatch(agent, {"t": "d.fs-write", "name": "x"})["error"] == "d.fs-write without nonce"
    assert wire.dispatch(agent, wire.command("d.bye")) is None
    with pytest.raises(ValueError, match="d.fs-read needs nonce"):
        wire.command("d.fs-read", name="x")
    written = wire.dispatch(agent, wire.command("d.fs-write", name="n1", nonce=b"abc"))
    assert written["t"] == "d.fs-written" and written["ok"] and (tmp_path / "n1").read_bytes() == b"abc"
    read = wire.dispatch(agent, wire.command("d.fs-read", name="n1", nonce=b"abc", wait=0.0))
    assert read == {"t": "d.fs-read", "found": True, "match": True, "path": str(tmp_path / "n1")}
    assert wire.dispatch(agent, wire.command("d.fs-clean", name="n1")) == {"t": "d.fs-cleaned"}
    assert not (tmp_path / "n1").exists()


def test_cores_self_test_runs_the_real_aggregator_and_relay_on_loopback():
    """traceml_core.selftest, as the doctor's cross.aggregator uses it: node 0's real aggregator, a
    node's real relay and a training process's records; the summary names the rank that sent them."""
    from traceml_core import selftest

    agg, error = selftest.TestAggregator.start(run="selftest-x", token="k" * 32, job="9", bind_host="127.0.0.1",
                                               port=0, nnodes=1, wait_s=60.0)
    assert agg is not None, error
    try:
        sent = selftest.send_test_telemetry("127.0.0.1", agg.port, token="k" * 32, run="selftest-x", job="9", rank=0,
                                            world=1, hostname="nodeA", timeout=30.0)
        assert sent["ok"], sent
        done = agg.finish(selftest.TEST_RECORDS, wait_s=30.0)
    finally:
        agg.close()
    assert done["ok"], done
    assert [(r["rank"], r["steps"]) for r in done["ranks"]] == [(0, selftest.TEST_RECORDS)]
    refused = selftest.send_test_telemetry("127.0.0.1", agg.port, token="k" * 32, run="selftest-x", job="9", rank=0,
                                           world=1, hostname="nodeA", timeout=2.0)
    assert not refused["ok"] and refused["stage"] in ("connect", "hello")  # the aggregator is gone
