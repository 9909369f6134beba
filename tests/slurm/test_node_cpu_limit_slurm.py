"""A node slowed by a cgroup CPU limit, on the real local Slurm cluster (docs/node-health.md).

node3's slurmd (its pid only) is moved into a cgroup of the test's own with a CPU quota (cgroup
v1's ``cpu`` controller: ``cpu.cfs_quota_us`` of ``cpu.cfs_period_us``). The dev cluster's
proctrack/cgroup moves job steps only in the freezer hierarchy (TaskPlugin=task/none), so every
step node3's slurmd starts inherits the quota; the test checks it in ``/proc/<pid>/cgroup`` of
node3's rank. Then, at the same time, a 3-node DDP training job and a ``traceml slurm doctor`` over
the three nodes, both writing one node store:

* (a) the training run's straggler is node3's rank, held back by its cgroup's CPU quota (measured
  by the rank: cpu.stat's throttled time; not excused as other processes' load), and the run's
  node evidence blames node3's compute;
* (b) the doctor's CPU matmul on node3 is below its peers', its own quota throttling it in most
  periods (``cross.compute-speed`` warns and says so);
* after the two jobs (node3 worse than its peers in both: the evidence the rule needs),
  ``traceml slurm nodes --json`` excludes node3 only, its reason naming what was measured.

Afterwards the slurmd goes back to its cgroup and the test's cgroup is removed (also on failure).
Skipped where this machine's cgroup v1 ``cpu`` hierarchy is missing or not writable (cgroup v2
only, not root): the limit cannot be made there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from cluster import CpuLimitUnavailable, cpu_cgroup_of
from e2e import REPO, job_env

#: node3's slurmd and everything it starts share 10 ms of CPU per 100 ms (a tenth of one core; a
#: fifth is no slower than what a peer's rank gets from two cores shared with a dozen other
#: processes, this machine under load)...
PERIOD_US, QUOTA_US = 100_000, 10_000
#: ...except while the training run starts (three imports of torch on node3, about 5 s of CPU: most
#: of a minute of CI at a tenth, and not what is tested): half a core until its steps are recorded
START_QUOTA_US = 50_000
#: ...and weigh as ten processes (cgroup v1 ``cpu.shares``; 1024 is one): the tasks of a cgroup
#: together weigh as one task of the root's, which alone would hold them back on a machine busy with
#: other processes (a lower weight, not a limit, and not seen by the throttling counters). So the
#: quota is what slows node3.
SHARES = 10 * 1024
SLOW = "node3"
SCRIPT = REPO / "tests" / "unit" / "scripts" / "comm_train.py"
#: a short DDP run whose step is mostly the ranks' own compute (a 512-wide layer on batches of
#: 1024), so a rank with a tenth of a core falls behind the others on the loaded machine; 90 steps,
#: so that most of them come after the quota drops to a tenth (when the first checkpoint holds
#: records: in CI, with 45 steps, that was near the end, and the run was judged at half a core)
TRAIN = {"COMM_MODE": "ddp", "COMM_LAYERS": "1", "COMM_WIDTH": "512", "COMM_BATCH": "1024", "COMM_STEPS": "90"}

JOB = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {SCRIPT}
"""


@contextmanager
def cpu_limited(cluster, node: str) -> Iterator[Path]:
    """node's slurmd in a cgroup of the test's own with the CPU quota (Cluster.cpu_limited), or a
    skip where this machine cannot make one."""
    try:
        with cluster.cpu_limited(node, QUOTA_US, PERIOD_US, SHARES) as cg:
            yield cg
    except CpuLimitUnavailable as exc:
        pytest.skip(str(exc))


def _rank_cgroups(cluster, node: str, marker: str, timeout: float) -> set[str]:
    """The cpu cgroups of the processes on ``node`` whose command line has ``marker`` (the task's
    launcher, torchrun's agent, the rank), once the rank (``python -m traceml_core.bootstrap``, which
    the agent's ``--module traceml_core.bootstrap`` is not) is among them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[int, str] = {}
        for pid in cluster.node_pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                if marker in cmd:
                    found[pid] = cmd
            except OSError:
                continue
        if any("\0-m\0traceml_core.bootstrap\0" in cmd for cmd in found.values()):
            return {cpu_cgroup_of(pid) for pid in found}
        time.sleep(0.2)
    raise AssertionError(f"no rank of {marker} on {node} within {timeout} s")


def _wait_for_records(logs: Path, timeout: float) -> None:
    """Until the run's aggregator has step records in its checkpoint (every rank is training)."""
    from test_multinode import _wait_for_records as wait_for_records

    deadline = time.monotonic() + timeout
    while not list(logs.glob("*/aggregate.state")):
        assert time.monotonic() < deadline, f"no aggregate.state under {logs} within {timeout} s"
        time.sleep(0.3)
    wait_for_records(next(logs.glob("*/aggregate.state")), max(1.0, deadline - time.monotonic()))


def test_a_node_slowed_by_a_cgroup_cpu_limit_is_the_straggler_the_doctor_and_the_store_name(
        slurm_cluster, tmp_path):
    from test_doctor_cluster import PY, SRC

    store = tmp_path / "nodes.sqlite"
    train_logs, doc_dir = tmp_path / "train", tmp_path / "doctor"
    doc_dir.mkdir()
    # the doctor's gloo all-reduce (one more import of torch on node3: half a minute at a tenth of a
    # core) is not what is tested; its micro-benchmarks and link probe are
    doctor = "\n".join([
        "#!/bin/bash", f"export PYTHONPATH={SRC}", f"export PATH={Path(PY).parent}:$PATH",
        f"{PY} -m traceml_core.cli slurm doctor --json --timeout 60 --ignore cross.gloo-allreduce > {doc_dir}/report.json 2> {doc_dir}/stderr.txt",
        f"echo $? > {doc_dir}/rc"]) + "\n"
    jobs: list[str] = []
    with cpu_limited(slurm_cluster, SLOW) as cg:
        try:
            t0 = time.monotonic()
            (cg / "cpu.cfs_quota_us").write_text(str(START_QUOTA_US))
            jobs.append(slurm_cluster.submit(JOB, "--nodes=3", "--ntasks-per-node=1", "--gres=gpu:1",
                                             "--cpus-per-task=1",
                                             env=job_env(train_logs, TRACEML_NODE_STORE=str(store), **TRAIN)))
            # node3's rank runs in the limited cgroup: Slurm's proctrack/task plugins did not move it out
            assert _rank_cgroups(slurm_cluster, SLOW, str(SCRIPT), timeout=120) == {"/" + cg.name}
            _wait_for_records(train_logs, timeout=120)
            (cg / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
            states, took = [slurm_cluster.wait(jobs[0], timeout=180)], [round(time.monotonic() - t0)]
            jobs.append(slurm_cluster.submit(doctor, "--nodes=3", "--ntasks-per-node=1", "--time=30", cwd=doc_dir,
                                             env=job_env(doc_dir, TRACEML_NODE_STORE=str(store))))
            states.append(slurm_cluster.wait(jobs[1], timeout=180))
            took.append(round(time.monotonic() - t0))
            throttled = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines())
        except BaseException:
            for j in jobs:   # so node3's steps leave the cgroup before it goes
                slurm_cluster.run("scancel", j, check=False)
            raise
    train = jobs[0]
    print(f"cpu-limit: jobs done after {took} s; {cg.name}: {throttled}")
    assert states == ["COMPLETED", "COMPLETED"], (states, slurm_cluster.output(train)[-3000:],
                                                  (doc_dir / "stderr.txt").read_text()[-2000:])
    assert int(throttled["nr_throttled"]) > 0, throttled

    # (a) the training run: node3's rank is the straggler, held back by its quota
    summary = json.loads(next(train_logs.glob("*/final_summary.json")).read_text())
    verdicts = [summary["verdict"]] + summary["other_verdicts"]
    st = next((v for v in verdicts if v["kind"] == "straggler"), None)
    assert st is not None, [(v["kind"], v["why"]) for v in verdicts]
    assert st["culprit"]["host"] == SLOW and st["culprit"]["rank"] == 2, st
    assert st["evidence"]["quota_wait_ms"] and "its cgroup's CPU quota held it back" in st["why"], st
    print(f"cpu-limit: straggler: {st['why']}")

    # (b) the doctor: node3's CPU matmul below its peers', its own quota throttling it (measured: how
    # far below depends on how loaded the peers' cores are; a fifth of a core is half or less of a
    # peer's at a load under ~5 on two cores)
    report = json.loads((doc_dir / "report.json").read_text())
    speed = next(c for c in report["checks"] if c["id"] == "cross.compute-speed")
    rates = {n: o["data"]["bench_cpu"] for n, o in speed["nodes"].items()}
    print(f"cpu-limit: doctor CPU matmul GFLOP/s: {rates}; node3: {speed['nodes'][SLOW]['observed']}")
    slow = speed["nodes"][SLOW]
    assert slow["status"] == "warn" and slow["data"]["cpu_quota"] == QUOTA_US / PERIOD_US, slow
    assert slow["data"]["cpu_throttled"] >= 0.5 and "its cgroup's CPU quota (a limit of 0.1 CPUs)" in slow["observed"]
    assert all(speed["nodes"][n]["status"] == "pass" and speed["nodes"][n]["data"]["cpu_quota"] is None
               for n in ("node1", "node2")), speed
    assert rates[SLOW] < min(rates["node1"], rates["node2"]), rates

    # the store: node3 worse than its peers in both jobs -> excluded, and only node3
    got = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json"],
                         env=job_env(tmp_path, TRACEML_NODE_STORE=str(store)), capture_output=True, text=True,
                         timeout=60)
    nodes = json.loads(got.stdout)
    assert nodes["exclude"] == [SLOW] and nodes["line"] == f"#SBATCH --exclude={SLOW}", nodes
    by = {n["host"]: n for n in nodes["nodes"]}
    assert (by[SLOW]["jobs"], by[SLOW]["bad_jobs"]) == (2, 2), by[SLOW]
    ev = {e["kind"]: e for e in by[SLOW]["evidence"]}
    assert ev["compute"]["bad"] and ev["compute"]["value"] > ev["compute"]["peers"], ev["compute"]
    assert ev["bench_cpu"]["bad"] and "CPU quota" in ev["bench_cpu"]["note"], ev["bench_cpu"]
    assert "compute (own time per step)" in by[SLOW]["why"] and "CPU matmul" in by[SLOW]["why"], by[SLOW]["why"]
    print(f"cpu-limit: nodes: {by[SLOW]['why']}")
    assert all(not by[h]["exclude"] for h in ("node1", "node2")), by
