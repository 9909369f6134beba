"""Controller facts: scontrol parsing (lines captured from the local Slurm 22.05 cluster) and the
pyslurm backend with a fake pyslurm behind the same interface; the ctl.* and time.* checks on both."""

from __future__ import annotations

import time
import types

import pytest
from doctor_env import batch, make

from traceml_slurm.doctor import controller as K
from traceml_slurm.doctor import walltime as W
from traceml_slurm.doctor.model import Status

JOB_LINE = (
    "JobId=3 JobName=tdr-j3.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=(null) "
    "QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=00:10:00 TimeMin=N/A SubmitTime=2026-12-02T17:01:27 "
    "EligibleTime=2026-12-02T17:01:27 AccrueTime=2026-12-02T17:01:27 StartTime=2026-12-02T17:01:27 "
    "EndTime=2026-12-02T17:11:27 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T17:01:27 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:6535 ReqNodeList=(null) ExcNodeList=(null) NodeList=node[1-2] "
    "BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 "
    "Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* JOB_GRES=gpu:a100:2   Nodes=node[1-2] CPU_IDs=0 Mem=0 "
    "GRES=gpu:a100:1(IDX:0) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/tdr-j3.sh WorkDir=/tmp "
    "StdErr=/tmp/tdr-env-3.out StdIn=/dev/null StdOut=/tmp/tdr-env-3.out Power= TresPerNode=gres:gpu:a100:1 ")
PART_LINE = (
    "PartitionName=short AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=00:05:00 "
    "MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-3] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO "
    "ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=12 TotalNodes=3")


def test_scontrol_job_record_parses_values_with_the_per_node_gres():
    r = K.parse_record(JOB_LINE)
    assert r["JobState"] == "RUNNING" and r["NodeList"] == "node[1-2]" and r["TimeLimit"] == "00:10:00"
    assert r["AllocNode:Sid"] == "localhost:6535" and r["Nodes"] == "node[1-2]"
    assert K.parse_duration("00:10:00") == 600 and K.parse_duration("1-02:00:00") == 93600
    assert K.parse_duration("UNLIMITED") is None and K.parse_duration("30") == 1800
    assert K.parse_timestamp(r["EndTime"]) - K.parse_timestamp(r["StartTime"]) == 600


def test_scontrol_backend_on_captured_output(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\ncase \"$2\" in\n job) echo '" + JOB_LINE + "';;\n partition) echo '" + PART_LINE +
                    "';;\n config) echo 'KillWait                = 5 sec'; echo 'SLURM_VERSION           = 22.05.8';;\n"
                    " *) exit 1;;\nesac\n")
    fake.chmod(0o755)
    b = K.ScontrolBackend(exe=str(fake))
    j = b.job("3")
    assert (j.state, j.partition, j.nodes, j.num_nodes, j.time_limit_s) == ("RUNNING", "debug", "node[1-2]", 2, 600.0)
    assert j.gres_per_node == {"node1": "gpu:a100:1(IDX:0)", "node2": "gpu:a100:1(IDX:0)"}
    p = b.partition("short")
    assert (p.state, p.max_time_s, p.max_nodes) == ("UP", 300.0, None)
    assert b.config().kill_wait_s == 5.0
    with pytest.raises(K.ControllerError):
        b.nodes("node1")


def test_a_hung_controller_is_asked_once(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nexec sleep 5\n")
    fake.chmod(0o755)
    b = K.ScontrolBackend(timeout=0.3, exe=str(fake))
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(K.ControllerError, match="did not answer within"):
            b.config()
    assert time.monotonic() - t0 < 2.0


# -- pyslurm, faked behind the same interface ---------------------------------------------------------

def fake_pyslurm(*, state="RUNNING", node_states=("MIXED", "MIXED"), limit_min=600, end_in=36000.0, gres=(2, 2),
                 kill_wait=30, script="#!/bin/bash\nsrun traceml run train.py\n", part_state="UP"):
    nodes = ["gpu07", "gpu08"]

    class Job:
        def __init__(self, job_id):
            self.id = job_id
            self.name, self.state, self.partition = "ddp", state, "gpu"
            self.allocated_nodes, self.num_nodes, self.batch_host = "gpu[07-08]", 2, "gpu07"
            self.time_limit, self.start_time = limit_min, time.time() - 60
            self.end_time = time.time() + end_in
            self.gres_per_node = {"gpu": max(gres)}

        @staticmethod
        def load(job_id):
            return Job(job_id)

        def get_resource_layout_per_node(self):
            return {n: {"cpu_ids": "0-7", "gres": {"gpu:h100": g}, "memory": 1} for n, g in zip(nodes, gres)}

        def get_batch_script(self):
            return script

    class Node:
        @staticmethod
        def load(name):
            st = dict(zip(nodes, node_states))[name]
            return types.SimpleNamespace(name=name, state=st, reason="bad ECC" if "DRAIN" in st else None,
                                         configured_gres={"gpu:h100": 8})

    class Partition:
        @staticmethod
        def load(name):
            return types.SimpleNamespace(name=name, state=part_state, max_time="UNLIMITED", max_nodes=64)

    cfg = types.SimpleNamespace(Config=types.SimpleNamespace(load=lambda: types.SimpleNamespace(kill_wait=kill_wait)))
    return types.SimpleNamespace(Job=Job, Node=Node, Partition=Partition, slurmctld=cfg, __version__="25.11.2")


def ctx_with(module, **env):
    return make(batch(**env), controller=K.PyslurmBackend(module))


def test_pyslurm_backend_all_well():
    ctx = ctx_with(fake_pyslurm())
    for check in (K.check_job, K.check_nodes, K.check_gres, K.check_partition, W.check_time_left, W.check_signal):
        assert check(ctx).status is Status.PASS, check.__name__
    j = K.check_job(ctx)
    assert "via pyslurm" in j.observed and "time limit 600 min" in j.observed


def test_node_down_fails_and_draining_warns():
    o = K.check_nodes(ctx_with(fake_pyslurm(node_states=("MIXED", "DOWN*"))))
    assert o.status is Status.FAIL and "gpu08 is DOWN*" in o.observed and "--exclude=gpu08" in o.fix
    o = K.check_nodes(ctx_with(fake_pyslurm(node_states=("MIXED+DRAIN", "MIXED"))))
    assert o.status is Status.WARN and "bad ECC" in o.observed


def test_uneven_gpus_between_nodes_fails():
    o = K.check_gres(ctx_with(fake_pyslurm(gres=(2, 1))))
    assert o.status is Status.FAIL and "--gpus-per-node" in o.fix


def test_partition_not_up_warns_and_job_not_running_warns():
    assert K.check_partition(ctx_with(fake_pyslurm(part_state="DRAIN"))).status is Status.WARN
    assert K.check_job(ctx_with(fake_pyslurm(state="COMPLETING"))).status is Status.WARN


def test_time_left():
    assert W.check_time_left(ctx_with(fake_pyslurm(end_in=60))).status is Status.FAIL
    o = W.check_time_left(ctx_with(fake_pyslurm(end_in=300)))
    assert o.status is Status.WARN and "left of 10h00m" in o.observed
    assert W.check_time_left(ctx_with(fake_pyslurm(limit_min=None))).observed == "no time limit"


def test_short_killwait_warns_unless_a_term_signal_comes_early_enough():
    o = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5)))
    assert o.status is Status.WARN and "KillWait=5 s" in o.observed and "#SBATCH --signal=TERM@50" in o.fix
    ok = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5, script="#!/bin/bash\n#SBATCH --signal=TERM@120\nsrun x\n")))
    assert ok.status is Status.PASS and "SIGTERM 120 s before" in ok.observed
    batch_only = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5, script="#SBATCH --signal=B:USR1@120\n")))
    assert batch_only.status is Status.WARN and "batch shell only" in batch_only.observed
    usr1 = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5), SBATCH_SIGNAL="USR1@90"))
    assert usr1.status is Status.WARN and "ignores SIGUSR1" in usr1.observed
    assert W.check_signal(ctx_with(fake_pyslurm(kill_wait=30))).status is Status.PASS


def test_a_generated_job_forwarding_its_batch_signal_passes():
    """`traceml slurm template` jobs use --signal=B:TERM@N and a trap that passes SIGTERM on to the
    steps with scancel: the doctor must not warn on our own template."""
    from pathlib import Path

    golden = Path(__file__).resolve().parents[1] / "golden" / "template"
    jobs = [j for j in sorted(golden.glob("*/*.sbatch")) if "#SBATCH --signal=B:TERM@" in j.read_text()]
    assert len(jobs) >= 5   # every golden job but the one generated with --signal-margin 0
    for job in jobs:
        o = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5, script=job.read_text())))
        assert o.status is Status.PASS, (job, o.observed)
        assert "trap passes SIGTERM on to the steps" in o.observed
    trap_only = "#SBATCH --signal=B:TERM@120\ntrap 'echo bye' TERM\nsrun x &\nwait\n"
    o = W.check_signal(ctx_with(fake_pyslurm(kill_wait=5, script=trap_only)))
    assert o.status is Status.WARN and "batch shell only" in o.observed  # a trap that forwards nothing
    other_sig = "#SBATCH --signal=B:USR1@120\ntrap f TERM\nf() { scancel --signal=TERM $SLURM_JOB_ID; }\n"
    assert W.check_signal(ctx_with(fake_pyslurm(kill_wait=5, script=other_sig))).status is Status.WARN


def test_signal_spec_parsing():
    s = W.parse_signal("B:USR1@60")
    assert (s.name, s.seconds, s.batch_only) == ("USR1", 60, True)
    assert W.parse_signal("15@30").name == "TERM" and W.parse_signal("SIGINT").seconds == 60
    assert W.parse_signal("not a spec!") is None


def test_controller_errors_degrade_to_warn_or_skip():
    class Dead:
        name = "scontrol"

        def job(self, job_id):
            raise K.ControllerError("`scontrol show job` did not answer within 5 s")

    o = K.check_job(make(batch(), controller=Dead()))
    assert o.status is Status.WARN and "did not answer" in o.observed

    class Missing(Dead):
        def job(self, job_id):
            raise K.ControllerError("scontrol is not installed here", missing=True)

    assert W.check_time_left(make(batch(), controller=Missing())).status is Status.SKIP


def test_pyslurm_that_does_not_import_falls_back_to_scontrol(monkeypatch, tmp_path):
    import sys

    bad = tmp_path / "pyslurm"
    bad.mkdir()
    (bad / "__init__.py").write_text("raise RuntimeError('Slurm version mismatch: requires Slurm 25.11, found 22.5')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert K.select_backend().name == "scontrol"
    with pytest.raises(K.ControllerError):
        K.select_backend(prefer="pyslurm")
