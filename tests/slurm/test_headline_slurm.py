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
    assert took < 5 + 12, took  # threshold + relay and watch windows + collection, loaded machine


def test_torchrun_killed_on_node_2_is_the_first_failure(slurm_cluster, tmp_path):
    """Issue 27, finding 5: torchrun is SIGKILLed on node 2 mid-run (2 nodes x 2 workers). Its
    workers die with it; node 1's ranks then fail in gloo ("Connection reset by peer"). The
    headline names node 2's torchrun, killed by SIGKILL, as the first failure with its exit
    (the node launcher's 137), and the other ranks' errors as consequences."""
    import os
    import signal
    import time
    from pathlib import Path

    from traceml_core.rundir import load_checkpoint

    progress = tmp_path / "progress"
    progress.mkdir()
    # (plain srun: node 1's launcher is not SIGTERMed by srun when node 2's task fails, so its
    # summary is not written against Slurm's KillWait; --kill-on-bad-exit reads the same way, see
    # test_multinode.py::test_node_lost_mid_run_is_named_and_summary_written)
    body = (TOKEN + f"srun traceml run --run-name=tk {FAULTY} --steps 100000 --step-ms 10\n")
    job = slurm_cluster.submit(body, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2", "--cpus-per-task=1",
                               env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    state_file = tmp_path / "tk" / "aggregate.state"
    deadline = time.monotonic() + 180   # two torch imports per node first: 30-45 s each under load
    while True:  # mid-run: every rank has stepped
        try:
            ranks = load_checkpoint(state_file)["state"]["ranks"]
        except (OSError, ValueError):
            ranks = []
        if len(ranks) == 4 and all(r["received"] > 20 for r in ranks):
            break
        assert time.monotonic() < deadline, "training never got under way"
        time.sleep(0.2)
    agents = [pid for pid in slurm_cluster.node_pids("node2")
              if b"traceml_core.launcher.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(agents) == 1, agents
    os.kill(agents[0], signal.SIGKILL)
    state = slurm_cluster.wait(job, timeout=120)
    out = slurm_cluster.output(job)
    assert state == "FAILED", out[-3000:]
    data = summary(tmp_path, "tk")
    v = data["verdict"]
    assert v["kind"] == "run_failed", (v, out[-3000:])
    assert v["culprit"]["node"] == 1 and v["culprit"]["host"] == "node2", v
    assert v["why"].startswith("node 1 (node2): torchrun was killed by SIGKILL"), v["why"]
    assert "exit code 137" in v["why"], v["why"]
    assert data["run"]["reason"].startswith("node 1's torchrun was killed by SIGKILL"), data["run"]
    assert sorted(v["evidence"]["consequence_ranks"]) == [0, 1, 2, 3], v["evidence"]
    assert "Verdict: RUN-FAILED (critical): node 1 (node2): torchrun was killed by SIGKILL" in out


def test_a_stopped_rank_is_named_and_its_stall_timed_not_a_straggler(slurm_cluster, tmp_path):
    """Issue 27, finding 6: rank 3 (node 2) is SIGSTOPped mid-run until the hang report is in the
    log, then continued. The report names rank 3, stopped, as the rank the others wait for (its
    stack cannot be read: a stopped process runs no signal handler; ranks 0-2's were), the stall's
    length is reported when it resolves (the log and the summary), and the pause is not called a
    straggler."""
    import os
    import signal
    import time

    progress = tmp_path / "progress"
    progress.mkdir()
    body = (TOKEN + f"srun traceml run --run-name=stop --hang-report-after=5 {FAULTY} --steps 300 "
            "--step-ms 10\n")
    job = slurm_cluster.submit(body, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2", "--cpus-per-task=1",
                               env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    rank3 = progress / "rank3.txt"
    deadline = time.monotonic() + 120
    while not (rank3.exists() and rank3.read_text().count("\nstep ") >= 100):
        assert time.monotonic() < deadline, "rank 3 never got under way"
        time.sleep(0.2)
    pid = int(rank3.read_text().split()[1])
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    try:
        deadline = time.monotonic() + 60
        while "hang report:" not in slurm_cluster.output(job):
            assert time.monotonic() < deadline, slurm_cluster.output(job)[-3000:]
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    stopped_s = time.time() - t_stop
    state = slurm_cluster.wait(job, timeout=180)
    out = slurm_cluster.output(job)
    assert state == "COMPLETED", out[-3000:]
    data = summary(tmp_path, "stop")
    h = data["hang"]
    assert h["culprits"] == [3] and h["resumed"], h["finding"]
    assert h["finding"].startswith("rank 3 (node 1, node2) never arrived at the collective the others wait in"), h["finding"]
    assert "its process is stopped" in h["finding"]
    by = {a["rank"]: a for a in h["ranks"]}
    assert by[3]["state"] == "stopped" and [by[r]["state"] for r in (0, 1, 2)] == ["collective"] * 3, by
    # the stall's length: from the last records before it to the first after, near the stop's
    print(f"rank 3 stopped {stopped_s:.1f} s; stall reported {h['stall_s']} s")
    # (seen at node 0 through the relays' and the watch's 1 s windows, and the resumed gloo step on a
    # loaded machine: about the stop, not the threshold and not the whole run)
    assert h["stall_s"] is not None and stopped_s - 3 < h["stall_s"] < stopped_s + 10, (h["stall_s"], stopped_s)
    verdicts = [data["verdict"]] + data["other_verdicts"]
    stall = next(v for v in verdicts if v["kind"] == "hang")
    assert stall["severity"] == "warning" and stall["why"].startswith(f"training stalled for {h['stall_s']:.0f} s")
    assert stall["culprit"]["rank"] == 3
    assert "straggler" not in [v["kind"] for v in verdicts], verdicts
    assert "the stall is over: step records arrive again" in out


def test_all_ranks_stuck_in_one_collective_are_named_so_by_their_state(slurm_cluster, tmp_path):
    """Issue 32: the ranks' own traffic between the two nodes is dropped while their relays still
    reach node 0 (a fabric that fails under the collective library, not under TraceML): both ranks
    wait in the gradient all-reduce and neither makes progress. With default settings the hang is
    named by the ranks' state as all ranks stuck in one collective, with their nodes, well before
    the time backstop (60 s)."""
    import time

    progress = tmp_path / "progress"
    progress.mkdir()
    port = 29931
    body = (TOKEN + f"srun traceml run --run-name=stuck --aggregator-port={port} {FAULTY} "
            "--steps 100000 --step-ms 10\n")
    job = slurm_cluster.submit(body, *TWO_NODES, env=job_env(tmp_path, FAULT_PROGRESS_DIR=str(progress)))
    ip1 = slurm_cluster.node_ip("node1")
    rules = (f"table inet tmlstuck {{\n chain o {{ type filter hook output priority 0; ip daddr {ip1} "
             f"tcp dport != {port} drop; }}\n chain i {{ type filter hook input priority 0; ip saddr {ip1} "
             f"tcp sport != {port} drop; }}\n}}\n")
    try:
        rank1 = progress / "rank1.txt"
        deadline = time.monotonic() + 180
        while not (rank1.exists() and rank1.read_text().count("\nstep ") >= 40):
            assert time.monotonic() < deadline and slurm_cluster.state(job) in ("PENDING", "RUNNING"), \
                slurm_cluster.output(job)[-3000:]
            time.sleep(0.2)
        slurm_cluster.run(str(slurm_cluster.dir / "bin" / "in-ns"), slurm_cluster.node_netns("node2"), "node2",
                          "nft", "-f", "-", input=rules)
        cut = time.time()
        deadline = time.monotonic() + 90
        while "hang report:" not in slurm_cluster.output(job):
            assert time.monotonic() < deadline, slurm_cluster.output(job)[-3000:]
            time.sleep(0.2)
        took = time.time() - cut
    finally:
        slurm_cluster.on_node("node2", "nft", "delete", "table", "inet", "tmlstuck", check=False)
        slurm_cluster.run("scancel", job, check=False)
    slurm_cluster.wait(job, timeout=180)
    print(f"all ranks stuck -> report in the log: {took:.1f} s")
    line = next(ln for ln in slurm_cluster.output(job).splitlines() if "hang report:" in ln)
    assert "decided by the ranks' state" in line and "all ranks are stuck in the gradient all-reduce" in line, line
    assert took < 55, took
    h = summary(tmp_path, "stuck")["hang"]
    assert h["rule"] == {"kind": "state", "name": "all_stuck", "because": h["rule"]["because"]}, h["rule"]
    by = {a["rank"]: a for a in h["ranks"]}
    assert by[0]["host"] == "node1" and by[1]["host"] == "node2" and all(a["state"] == "collective" for a in by.values())
