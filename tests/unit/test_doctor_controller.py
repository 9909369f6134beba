"""Controller facts: scontrol parsing (lines captured from the local Slurm 22.05 cluster) and the
pyslurm backend on the real pyslurm 25.11.2's recorded answers (pyslurm_replay); the ctl.* and time.*
checks on both."""

from __future__ import annotations

import time
import warnings

import pyslurm_replay as R
import pytest
from doctor_env import batch, make

from traceml_slurm import controller as C
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
    r = C.parse_record(JOB_LINE)
    assert r["JobState"] == "RUNNING" and r["NodeList"] == "node[1-2]" and r["TimeLimit"] == "00:10:00"
    assert r["AllocNode:Sid"] == "localhost:6535" and r["Nodes"] == "node[1-2]"
    assert C.parse_duration("00:10:00") == 600 and C.parse_duration("1-02:00:00") == 93600
    assert C.parse_duration("UNLIMITED") is None and C.parse_duration("30") == 1800
    assert C.parse_timestamp(r["EndTime"]) - C.parse_timestamp(r["StartTime"]) == 600


def test_scontrol_backend_on_captured_output(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\ncase \"$2\" in\n job) echo '" + JOB_LINE + "';;\n partition) echo '" + PART_LINE +
                    "';;\n config) echo 'KillWait                = 5 sec'; echo 'SLURM_VERSION           = 22.05.8';;\n"
                    " *) exit 1;;\nesac\n")
    fake.chmod(0o755)
    b = C.ScontrolBackend(exe=str(fake))
    j = b.job("3")
    assert (j.state, j.partition, j.nodes, j.num_nodes, j.time_limit_s) == ("RUNNING", "debug", "node[1-2]", 2, 600.0)
    assert j.restarts == 0  # the requeue count the interrupt words compare with SLURM_RESTART_COUNT
    assert j.gres_per_node == {"node1": "gpu:a100:1(IDX:0)", "node2": "gpu:a100:1(IDX:0)"}
    p = b.partition("short")
    assert (p.state, p.max_time_s, p.max_nodes) == ("UP", 300.0, None)
    assert b.config().kill_wait_s == 5.0
    with pytest.raises(C.ControllerError):
        b.nodes("node1")


def test_a_hung_controller_is_asked_once(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nexec sleep 5\n")
    fake.chmod(0o755)
    b = C.ScontrolBackend(timeout=0.3, exe=str(fake))
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(C.ControllerError, match="did not answer within"):
            b.config()
    assert time.monotonic() - t0 < 2.0


# -- pyslurm: the real one's answers, replayed (tests/fixtures/pyslurm, recorded on Slurm 25.11) ------

def ctx_with(module, situation="gres2", *, clock=None, **env):
    """The doctor in the recorded job's batch shell, asking the replayed pyslurm; the clock a minute
    after the job started unless given."""
    start = R.load(situation)["job"]["attrs"]["start_time"]["value"]
    return make(R.job_env(situation, **env), controller=C.PyslurmBackend(module),
                clock=clock or (lambda: start + 60.0))


def long_job(situation="gres2", **job):
    """The recorded job with a 600-minute limit (the recording has 10): far from its end."""
    start = R.load(situation)["job"]["attrs"]["start_time"]["value"]
    return R.replay(situation, job={"time_limit": 600, "end_time": start + 36000, **job})


def test_pyslurm_backend_reads_the_real_pyslurm_as_scontrol_words_it():
    b = C.PyslurmBackend(R.replay("gres2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # Job.gres_per_node is deprecated: never read
        j = b.job(R.job_env()["SLURM_JOB_ID"])
    assert j.gres_per_node == {"node1": "gpu:a100:2(IDX:0-1)", "node2": "gpu:a100:2(IDX:0-1)"}
    assert {h: C.gpu_count(g) for h, g in j.gres_per_node.items()} == {"node1": 2, "node2": 2}
    assert (j.state, j.partition, j.nodes, j.num_nodes, j.time_limit_s) == ("RUNNING", "debug", "node[1-2]", 2, 600.0)
    assert j.end_time - j.start_time == 600.0 and j.tres_per_node is None
    cfg = b.config()
    assert (cfg.kill_wait_s, cfg.version) == (5.0, "25.11.7")  # the controller's version, not pyslurm's 25.11.2
    debug = b.partition("debug")
    assert (debug.state, debug.max_time_s, debug.max_nodes) == ("UP", None, None)  # "UNLIMITED" twice
    short = C.PyslurmBackend(R.replay("gres2", states="states")).partition("short")
    assert (short.state, short.max_time_s, short.max_nodes) == ("DRAIN", 300.0, 2)
    assert [(n.name, n.state, n.gres) for n in b.nodes("node[1-2]")] == [("node1", "MIXED", "gpu:a100:4"),
                                                                        ("node2", "MIXED", "gpu:a100:4")]
    assert b.batch_script(R.job_env()["SLURM_JOB_ID"]).startswith("#!/bin/bash\n#SBATCH --signal=TERM@60\n")


def test_the_replay_is_the_real_pyslurm_not_a_guess():
    m = R.replay("gres2")
    with pytest.raises(AttributeError, match="kill_wait"):
        m.slurmctld.Config.load().kill_wait  # what the hand-made fake had; the real one does not
    with pytest.raises(AssertionError, match="never returned a str"):
        R.replay("gres2", job={"time_limit": "600"})
    with pytest.raises(R.RPCError):
        m.Job.load(99999)


def test_pyslurm_backend_all_well():
    ctx = ctx_with(long_job())
    for check in (K.check_job, K.check_nodes, K.check_gres, K.check_partition, W.check_time_left, W.check_signal):
        assert check(ctx).status is Status.PASS, check.__name__
    j = K.check_job(ctx)
    assert "via pyslurm" in j.observed and "time limit 600 min" in j.observed


def test_a_job_without_time_limit_has_none_whichever_scheduler_started_it():
    """The backfill scheduler writes 365 days (525,600 min) for a job without --time in a
    MaxTime=INFINITE partition; the main scheduler writes INFINITE. Both are "no time limit"."""
    for situation in ("nolimit-main", "nolimit-backfill"):
        ctx = ctx_with(R.replay(situation), situation)
        assert W.check_time_left(ctx).observed == "no time limit", situation
        assert "no time limit" in K.check_job(ctx).observed, situation
        assert W.check_signal(ctx).status is Status.PASS, situation
    assert R.load("nolimit-backfill")["job"]["attrs"]["time_limit"]["value"] == 525600  # what was recorded


def test_node_down_fails_and_draining_warns():
    o = K.check_nodes(ctx_with(R.replay("gres2", states="states")))
    assert o.status is Status.FAIL and "node1 is DOWN (record down)" in o.observed and "--exclude=node1" in o.fix
    drain_only = R.replay("gres2", states="states", nodes={"node1": {"state": "MIXED", "reason": None}})
    o = K.check_nodes(ctx_with(drain_only))
    assert o.status is Status.WARN and "node2 is IDLE+DRAIN (record drain)" in o.observed


def test_uneven_gpus_between_nodes_fails():
    o = K.check_gres(ctx_with(R.replay("uneven-gpus"), "uneven-gpus"))
    assert o.status is Status.FAIL and "--gpus-per-node" in o.fix
    assert o.data["gpus"] == {"node1": 2, "node2": 1}


def test_a_job_without_gres_says_so_through_both_backends():
    o = K.check_gres(ctx_with(R.replay("short-nogres"), "short-nogres"))
    assert o.status is Status.PASS and o.observed == "no GRES allocated (job TresPerNode=none)"


def test_partition_not_up_warns_and_job_not_running_warns():
    o = K.check_partition(ctx_with(R.replay("short-nogres", states="states"), "short-nogres"))
    assert o.status is Status.WARN and "short: DRAIN, MaxTime 5 min, MaxNodes 2" in o.observed
    assert K.check_job(ctx_with(R.replay("gres2", job={"state": "COMPLETING"}))).status is Status.WARN


def test_time_left():
    end = R.load("gres2")["job"]["attrs"]["end_time"]["value"]
    assert W.check_time_left(ctx_with(R.replay("gres2"), clock=lambda: end - 60)).status is Status.FAIL
    o = W.check_time_left(ctx_with(long_job(), clock=lambda: end - 600 + 36000 - 300))
    assert o.status is Status.WARN and "left of 10h00m" in o.observed


def test_short_killwait_warns_unless_a_term_signal_comes_early_enough():
    nosig = R.replay("short-nogres")
    o = W.check_signal(ctx_with(nosig, "short-nogres"))
    assert o.status is Status.WARN and "KillWait=5 s" in o.observed and "`#SBATCH --signal=TERM@120`" in o.fix
    ok = W.check_signal(ctx_with(R.replay("short-nogres", batch_script="#!/bin/bash\n#SBATCH --signal=TERM@120\nsrun x\n"),
                                 "short-nogres"))
    assert ok.status is Status.PASS and "SIGTERM 120 s before" in ok.observed
    batch_only = W.check_signal(ctx_with(R.replay("short-nogres", batch_script="#SBATCH --signal=B:USR1@120\n"),
                                         "short-nogres"))
    assert batch_only.status is Status.WARN and "batch shell only" in batch_only.observed
    usr1 = W.check_signal(ctx_with(nosig, "short-nogres", SBATCH_SIGNAL="USR1@90"))
    assert usr1.status is Status.WARN and "passes SIGUSR1 on to the training script" in usr1.observed
    assert "does not stop for it" in usr1.observed
    assert W.check_signal(ctx_with(R.replay("short-nogres", config={"kill_wait_time": 30}), "short-nogres")
                          ).status is Status.PASS


def test_a_generated_job_passes_and_so_does_the_older_forwarding_trap():
    """`traceml slurm template` jobs carry the one time-limit recipe (--signal=TERM@N): the doctor
    must not warn on our own template. Jobs generated before it signalled the batch shell
    (--signal=B:TERM@N) and passed SIGTERM on to the steps with scancel from a trap: still fine."""
    from pathlib import Path

    golden = Path(__file__).resolve().parents[1] / "golden" / "template"
    jobs = [j for j in sorted(golden.glob("*/*.sbatch")) if "#SBATCH --signal=TERM@" in j.read_text()]
    assert len(jobs) >= 5   # every golden job but the one generated with --signal-margin 0

    def signal_check(script):
        return W.check_signal(ctx_with(R.replay("short-nogres", batch_script=script), "short-nogres"))

    for job in jobs:
        o = signal_check(job.read_text())
        assert o.status is Status.PASS and "every step gets SIGTERM" in o.observed, (job, o.observed)
    older = ("#SBATCH --signal=B:TERM@120\nf() { scancel --signal=TERM \"$SLURM_JOB_ID\"; }\ntrap f TERM\n"
             "srun x &\nwait\n")
    o = signal_check(older)
    assert o.status is Status.PASS and "trap passes SIGTERM on to the steps" in o.observed
    trap_only = "#SBATCH --signal=B:TERM@120\ntrap 'echo bye' TERM\nsrun x &\nwait\n"
    o = signal_check(trap_only)
    assert o.status is Status.WARN and "batch shell only" in o.observed  # a trap that forwards nothing
    other_sig = "#SBATCH --signal=B:USR1@120\ntrap f TERM\nf() { scancel --signal=TERM $SLURM_JOB_ID; }\n"
    assert signal_check(other_sig).status is Status.WARN


def test_signal_spec_parsing():
    s = W.parse_signal("B:USR1@60")
    assert (s.name, s.seconds, s.batch_only) == ("USR1", 60, True)
    assert W.parse_signal("15@30").name == "TERM" and W.parse_signal("SIGINT").seconds == 60
    assert W.parse_signal("not a spec!") is None


def test_controller_errors_degrade_to_warn_or_skip():
    class Dead:
        name = "scontrol"

        def job(self, job_id):
            raise C.ControllerError("`scontrol show job` did not answer within 5 s")

    o = K.check_job(make(batch(), controller=Dead()))
    assert o.status is Status.WARN and "did not answer" in o.observed

    class Missing(Dead):
        def job(self, job_id):
            raise C.ControllerError("scontrol is not installed here", missing=True)

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
    assert C.select_backend().name == "scontrol"
    with pytest.raises(C.ControllerError):
        C.select_backend(prefer="pyslurm")
