"""Node-level faults on the real local Slurm (issue 9, cases 3-5): a node that joins late, a node
that never joins, scancel, and two jobs sharing the same nodes at once with no port forced.

(A node lost mid-run and the step time limit are in test_multinode.py.)
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from e2e import REPO, job_env, summary

EXAMPLE = REPO / "examples" / "ddp_minimal.py"
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")
TOKEN = "export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
KILLWAIT = float(os.environ.get("TRACEML_CLUSTER_KILLWAIT", "5"))


def _launch(tmp_path: Path, body: str) -> Path:
    """A per-node launch script (what srun runs on every node), as in examples/slurm/launch.sh."""
    path = tmp_path / "launch.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def _records(state_file: Path) -> int:
    from traceml_core.rundir import load_checkpoint
    try:
        return int(load_checkpoint(state_file)["state"]["records"])
    except (OSError, ValueError):
        return 0


def _ports(out: str) -> tuple[int, int]:
    m = re.search(r"master node1:(\d+), aggregator node1:(\d+)", out)
    assert m, out[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_a_node_that_joins_late(slurm_cluster, tmp_path):
    """Node 1's launcher starts 20 s late (a slow module load): the run works, and the summary
    says which node joined late and by how much. (Each node joins after its torch import, the
    pre-flight, so the delay seen is 20 s plus the difference of the two nodes' import times,
    which a loaded machine makes up to several seconds either way.)"""
    launch = _launch(tmp_path, f'[ "$SLURM_NODEID" = 1 ] && sleep 20\nexec traceml run {EXAMPLE} --steps 40\n')
    job, state, out = slurm_cluster.run_job(TOKEN + f"srun --kill-on-bad-exit=1 {launch}\n", *TWO_NODES,
                                            timeout=180, env=job_env(tmp_path))
    assert state == "COMPLETED", out
    data = summary(tmp_path)
    node1 = data["topology"]["nodes"][1]
    assert node1["joined"] and node1["late"] and node1["join_delay_s"] >= 12, node1
    assert not data["topology"]["nodes"][0]["late"]
    assert data["run"]["status"] == "completed" and data["telemetry"]["complete"]
    assert data["telemetry"]["records_received"] == 2 * 40
    assert re.search(r"joined late: node 1 \(node2\) after \d+\.\d s", out), out[-3000:]
    assert "node 1 (node2) joined late" in out  # the aggregator's log line


def test_a_node_that_never_joins(slurm_cluster, tmp_path):
    """Node 1 never starts traceml: node 0 gives up after --aggregator-wait, naming node 1, and
    writes the summary; the whole job ends within a bound."""
    launch = _launch(tmp_path, f'[ "$SLURM_NODEID" = 1 ] && exec sleep 300\n'
                               f'exec traceml run {EXAMPLE} --steps 40 --run-name=never\n')
    t0 = time.monotonic()
    job, state, out = slurm_cluster.run_job(TOKEN + f"srun --kill-on-bad-exit=1 {launch}\n", *TWO_NODES,
                                            timeout=90, env=job_env(tmp_path, TRACEML_AGGREGATOR_WAIT="5"))
    elapsed = time.monotonic() - t0
    assert state == "FAILED", out
    # (the 5 s wait, plus node 0's pre-flight torch import and srun's teardown on a loaded machine)
    assert elapsed < 5 + 60, f"the job took {elapsed:.0f} s to end"
    # named with its hostname although it never said hello: node 0 knows it from Slurm's list
    m = re.search(r"\[traceml\] error: node 1 \((node\d)\) never joined within 5 s", out)
    assert m, out[-3000:]
    host = m.group(1)
    data = summary(tmp_path, "never")
    assert data["run"]["status"] == "failed"
    assert f"node 1 ({host}) never joined within 5 s" in data["run"]["reason"]
    topo = data["topology"]
    assert not topo["nodes"][1]["joined"] and topo["nodes_joined"] == 1
    assert topo["nodes"][1]["hostname"] == host != topo["nodes"][0]["hostname"]
    assert {r["status"] for r in data["ranks"] if r["node"] == 1} == {"never_joined"}
    assert {r["host"] for r in data["ranks"] if r["node"] == 1} == {host}
    assert f"1 node(s) never joined: 1 ({host})" in out


def test_scancel_writes_the_summary_before_killwait(slurm_cluster, tmp_path):
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
    assert state == "CANCELLED", out
    path = tmp_path / "cancelled" / "final_summary.json"
    data = json.loads(path.read_text())
    written = path.stat().st_mtime - t_cancel
    print(f"scancel -> final summary written: {written:.2f} s (KillWait {KILLWAIT:.0f} s)")
    assert not data["provisional"], "only the provisional summary was written"
    assert written < KILLWAIT, f"summary written {written:.1f} s after scancel; KillWait is {KILLWAIT} s"
    assert data["run"]["status"] == "interrupted"
    assert data["topology"]["nodes_joined"] == 2 and data["telemetry"]["records_received"] > 0
    # who sent it: the controller says the job has no time limit (22.05), or 24.11 says CANCELLED
    assert re.search(r"interrupted by SIGTERM: (the job has no time limit, so not the time limit: scancel"
                     r"|the job was cancelled \(scancel)", data["run"]["reason"]), data["run"]
    # (the launcher's own log lines after scancel are not in the job's output: srun, which relays
    # the tasks' output, is signalled too; the summary file is what survives)


def test_two_jobs_on_the_same_nodes_at_once(slurm_cluster, tmp_path):
    """Two 2-node jobs share node1 and node2 with no port forced: each gets its own job-derived
    ports and both succeed. A third job forcing the first job's aggregator port fails at once,
    before training, with the port-in-use error."""
    script = TOKEN + f"srun --kill-on-bad-exit=1 traceml run {EXAMPLE} --steps 100\n"
    where = ("-w", "node1,node2")
    logs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for d in logs:
        d.mkdir()
    a = slurm_cluster.submit(script, *TWO_NODES, *where, env=job_env(logs[0]))
    b = slurm_cluster.submit(script, *TWO_NODES, *where, env=job_env(logs[1]))
    out_a = ""
    deadline = time.monotonic() + 60
    while "aggregator node1:" not in out_a:  # job a's aggregator is up: learn its port
        assert time.monotonic() < deadline
        time.sleep(0.2)
        try:
            out_a = slurm_cluster.output(a)
        except (OSError, KeyError):
            pass
    _, agg_a = _ports(out_a)
    c = slurm_cluster.submit(script, *TWO_NODES, *where,
                             env=job_env(logs[2], TRACEML_AGGREGATOR_PORT=str(agg_a)))
    state_c = slurm_cluster.wait(c, timeout=90)
    state_a, state_b = slurm_cluster.wait(a, timeout=120), slurm_cluster.wait(b, timeout=120)
    # all three ran on the same two nodes, a and b at the same time (c failed while a ran: the
    # port it forced was held by a's aggregator)
    infos = {j: slurm_cluster.job_info(j)[0] for j in (a, b, c)}
    assert {i["NodeList"] for i in infos.values()} == {"node[1-2]"}
    assert infos[b]["StartTime"] <= infos[a]["EndTime"] and infos[a]["StartTime"] <= infos[b]["EndTime"]
    out_a, out_b, out_c = (slurm_cluster.output(j) for j in (a, b, c))
    assert state_a == "COMPLETED", out_a
    assert state_b == "COMPLETED", out_b
    ports_a, ports_b = _ports(out_a), _ports(out_b)
    assert not set(ports_a) & set(ports_b), (ports_a, ports_b)
    for d in logs[:2]:
        data = summary(d)
        assert data["run"]["status"] == "completed" and data["telemetry"]["records_received"] == 2 * 100
    # the forced clash: a clear error on node 0 before any training process started
    assert state_c == "FAILED", out_c
    assert (f"port {agg_a} (from env:TRACEML_AGGREGATOR_PORT) is already in use" in out_c), out_c[-2000:]
    assert "ddp_minimal:" not in out_c and "Traceback" not in out_c
    assert not any(logs[2].glob("*/final_summary.json"))


FAULTY = REPO / "tests" / "faults" / "faulty_train.py"
ONE_NODE = ("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")


def _wait_file(path: Path, timeout: float, what: str, cond=lambda p: p.exists()) -> None:
    deadline = time.monotonic() + timeout
    while not cond(path):
        assert time.monotonic() < deadline, f"timed out waiting for {what} ({path})"
        time.sleep(0.2)


def test_two_jobs_with_one_run_name_get_two_directories(slurm_cluster, tmp_path):
    """Issue 27, finding 4: two jobs run at once with the same --run-name and logs directory.
    The one that claims it second writes to shared.<its job id> and says so in one line; then its
    aggregator is SIGKILLed and its launcher restarts it: it goes on from its own checkpoint,
    never the other job's. Each summary counts its own job's steps (the truth: faulty_train's
    progress files)."""
    from e2e import truth

    logs = tmp_path / "logs"
    logs.mkdir()
    steps, jobs, prog = [250, 200], [], []
    for k, n in enumerate(steps):
        prog.append(tmp_path / f"progress-{k}")
        prog[k].mkdir()
        jobs.append(slurm_cluster.submit(
            TOKEN + f"srun --kill-on-bad-exit=1 traceml run --run-name=shared {FAULTY} --steps {n} --step-ms 40\n",
            *ONE_NODE, env=job_env(logs, FAULT_PROGRESS_DIR=str(prog[k]))))
    first = logs / "shared"
    _wait_file(logs, 90, "a second run directory", lambda d: any(d.glob("shared.*")))
    moved = next(logs.glob("shared.*"))
    second = jobs.index(moved.name.split(".", 1)[1])   # the job that claimed second
    a, b = jobs[1 - second], jobs[second]
    # its first checkpoint with step records: then its aggregator is killed
    _wait_file(moved / "aggregate.state", 120, "the moved job's first checkpoint with records",
               lambda p: _records(p) > 0)
    owner = json.loads((moved / ".traceml-owner").read_text())  # aggregator/claim.py
    assert owner["job_id"] == b, owner
    assert "traceml_core.aggregator" in Path(f"/proc/{owner['pid']}/cmdline").read_bytes().decode(errors="replace")
    os.kill(owner["pid"], 9)
    state_b, state_a = slurm_cluster.wait(b, timeout=150), slurm_cluster.wait(a, timeout=150)
    out_a, out_b = slurm_cluster.output(a), slurm_cluster.output(b)
    assert state_a == "COMPLETED", out_a[-3000:]
    assert state_b == "COMPLETED", out_b[-3000:]
    # the clear line at the start of the job that moved; the other never moved
    assert (f"{first} belongs to another run that is still going (job {a}" in out_b
            and f"this run's files are in {moved} instead" in out_b), out_b[-3000:]
    assert "belongs to another run" not in out_a
    sa = json.loads((first / "final_summary.json").read_text())
    sb = json.loads((moved / "final_summary.json").read_text())
    n_a, n_b = steps[1 - second], steps[second]
    assert truth(prog[1 - second]) == {0: n_a} and truth(prog[second]) == {0: n_b}
    assert sa["run"]["job_id"] == a and sa["telemetry"]["complete"], sa["telemetry"]
    assert sa["telemetry"]["records_received"] == n_a and sa["telemetry"]["aggregator_restarts"] == 0
    tb = sb["telemetry"]
    assert sb["run"]["job_id"] == b and tb["aggregator_restarts"] == 1, tb
    # its own steps, some possibly lost with its killed aggregator, none of the other job's
    assert tb["records_received"] + tb["records_lost"] == n_b, tb
    assert 0 < tb["records_received"] <= n_b, tb
    assert any("belongs to another run that is still going" in n for n in sb["notes"]), sb["notes"]
