"""Node health across the user's jobs (traceml_slurm/nodes): the store, the rule, the command.

The store is a real SQLite file; concurrent writers are real processes. The rule is fed what core
says of each run (NodeObservation), as node 0's aggregator hands it over.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceml_core.plugins import NodeObservation, RunEvidence
from traceml_slurm.nodes import next_job, record
from traceml_slurm.nodes.health import judge
from traceml_slurm.nodes.store import NodeStore

HOSTS = ("node1", "node2", "node3")
DAY = 86400.0


def run(job: str, at: float, slow: tuple[str, ...] = (), *, source: str = "run", strong: bool = False,
        hosts: tuple[str, ...] = HOSTS) -> RunEvidence:
    """A 3-node run whose link probe found ``slow`` sending at 0.012 GB/s against 1.5 GB/s."""
    obs = tuple(NodeObservation(h, "link_send", 0.012 if h in slow else 1.5, 1.5, "GB/s", h in slow,
                                strong and h in slow, note="sends slowly" if h in slow else "")
                for h in hosts)
    return RunEvidence(job, f"run-{job}", at, source, hosts, obs)


def health_after(tmp_path: Path, runs: list[RunEvidence]) -> dict:
    path = tmp_path / "nodes.sqlite"
    out = None
    for ev in runs:
        out, notes = record(path, "c", ev)
        assert not notes, notes
    assert out is not None
    return {h.host: h for h in out}


def test_a_node_slow_in_three_jobs_is_excluded_after_the_second_with_the_reason(tmp_path):
    t0 = time.time() - 3 * 3600
    path = tmp_path / "nodes.sqlite"
    excluded_after = []
    for i in range(3):
        health, notes = record(path, "c", run(str(100 + i), t0 + i * 600, slow=("node3",)))
        nj = next_job(health, notes)
        excluded_after.append(nj is not None and nj.lines == ("#SBATCH --exclude=node3",))
    assert excluded_after == [False, True, True]
    h = {x.host: x for x in health}
    assert h["node3"].exclude and h["node3"].score == 0.0 and h["node3"].bad_jobs == 3
    assert h["node3"].reason.startswith("node3: link sending at 0.012 GB/s against 1.5 GB/s in 3 of 3 job(s) since ")
    assert not h["node1"].exclude and h["node1"].score == 1.0 and "clean in its last 3" in h["node1"].why
    assert nj.excluded == ("node3",) and "node3: link sending" in nj.why[0]


def test_one_slow_job_is_not_proof_and_says_what_the_rule_needs(tmp_path):
    t0 = time.time() - 3600
    h = health_after(tmp_path, [run("1", t0), run("2", t0 + 60, slow=("node2",)), run("3", t0 + 120)])
    assert not h["node2"].exclude and h["node2"].bad_jobs == 1 and h["node2"].score == pytest.approx(2 / 3, abs=1e-3)
    assert "not excluded, the rule needs 2 of 3" in h["node2"].why and "load of that job" in h["node2"].why


def test_a_run_and_a_doctor_of_one_job_are_one_sample(tmp_path):
    t0 = time.time() - 3600
    h = health_after(tmp_path, [run("7", t0, slow=("node3",), source="doctor"), run("7", t0 + 30, slow=("node3",))])
    assert h["node3"].jobs == 1 and not h["node3"].exclude


def test_a_summary_written_twice_counts_once(tmp_path):
    t0 = time.time() - 3600
    h = health_after(tmp_path, [run("7", t0, slow=("node3",)), run("7", t0 + 5, slow=("node3",))])
    assert h["node3"].jobs == 1 and not h["node3"].exclude


def test_a_hardware_fault_excludes_at_once(tmp_path):
    h = health_after(tmp_path, [run("1", time.time() - 60, slow=("node1",), strong=True)])
    assert h["node1"].exclude and h["node1"].why.startswith("a hardware fault")


def test_evidence_ages_out_and_a_node_that_recovers_is_no_longer_excluded(tmp_path):
    now = time.time()
    old = [run(str(i), now - 20 * DAY + i, slow=("node3",)) for i in range(3)]
    h = health_after(tmp_path, old)
    assert not h["node3"].exclude and h["node3"].jobs == 0 and "3 older record(s) aged out" in h["node3"].why
    recovering = [run(str(10 + i), now - 3600 + i * 60, slow=("node3",) if i < 2 else ()) for i in range(5)]
    h = health_after(tmp_path / "b", recovering[:2])
    assert h["node3"].exclude
    h = health_after(tmp_path / "c", recovering)
    # 2 of its last 5 is under half: not excluded once the third clean job is in
    assert not h["node3"].exclude and (h["node3"].bad_jobs, h["node3"].jobs) == (2, 5), h["node3"].why


def test_a_corrupt_store_is_moved_aside_with_a_note_and_a_new_one_started(tmp_path):
    path = tmp_path / "nodes.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    path.chmod(0o600)  # the user's own file (another's, or one others may write, is refused: below)
    health, notes = record(path, "c", run("1", time.time(), slow=("node3",)))
    assert len(notes) == 1 and "is not a TraceML node store" in notes[0] and "moved it to" in notes[0], notes
    aside = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    assert {h.host for h in health} == set(HOSTS)
    nj = next_job(health, notes)
    assert nj is not None and nj.lines == () and nj.notes == tuple(notes)
    # reading a corrupt store (traceml slurm nodes) only says so
    path.write_bytes(b"\0" * 4096)
    path.chmod(0o600)
    recs, notes = NodeStore(path).records("c")
    assert recs == [] and "not a TraceML node store" in notes[0] and "the next run that records node evidence moves it aside" in notes[0]


def test_an_unwritable_store_is_a_note(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    health, notes = record(blocker / "sub" / "nodes.sqlite", "c", run("1", time.time()))
    # judged from this run alone (held in memory), the store named as what could not be used
    assert [h.jobs for h in health] == [1, 1, 1] and not any(h.exclude for h in health)
    assert len(notes) == 1 and "is ignored: it cannot be checked (Not a directory)" in notes[0], notes


def _writer(path: str, job: int, n: int) -> None:
    for i in range(n):
        record(Path(path), "c", run(f"{job}-{i}", time.time(), slow=("node3",)))


def test_two_concurrent_jobs_both_land(tmp_path):
    path = tmp_path / "nodes.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), j, 15)) for j in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    recs, notes = NodeStore(path).records("c")
    assert not notes and len(recs) == 30 and all(len(r.observations) == 3 for r in recs)


def test_the_store_is_bounded(tmp_path, monkeypatch):
    from traceml_slurm.nodes import store

    monkeypatch.setattr(store, "MAX_OBSERVATIONS", 30)
    path = tmp_path / "nodes.sqlite"
    for i in range(20):
        record(path, "c", run(str(i), time.time() - 1000 + i))
    recs, _ = NodeStore(path).records("c")
    assert sum(len(r.observations) for r in recs) <= 30 and recs[-1].job_id == "19"
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE records SET at = at - 100 * 86400 WHERE job_id = '19'")
    record(path, "c", run("20", time.time()))
    assert "19" not in {r.job_id for r in NodeStore(path).records("c")[0]}


def test_the_command_lists_hosts_and_ends_in_the_line(tmp_path):
    path = tmp_path / "nodes.sqlite"
    for i in range(3):
        record(path, "c", run(str(i), time.time() - 600 + i, slow=("node2",)))
    env = {**os.environ, "TRACEML_NODE_STORE": str(path)}
    env.pop("SLURM_CLUSTER_NAME", None)
    text = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.strip().splitlines()
    assert lines[-1] == "  #SBATCH --exclude=node2" and any("node2" in ln and "EXCLUDE" in ln for ln in lines)
    js = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json"], env=env,
                        capture_output=True, text=True, timeout=60)
    doc = json.loads(js.stdout)
    assert doc["exclude"] == ["node2"] and doc["line"] == "#SBATCH --exclude=node2"
    assert [n["host"] for n in doc["nodes"]][0] == "node2" and doc["nodes"][0]["score"] == 0.0


def test_hosts_of_other_clusters_stay_apart(tmp_path):
    path = tmp_path / "nodes.sqlite"
    for i in range(2):
        record(path, "a", run(str(i), time.time() - 60 + i, slow=("node3",)))
    health, _ = record(path, "b", run("9", time.time()))
    assert not any(h.exclude for h in health)
    assert [h.host for h in judge(NodeStore(path).records(None)[0]) if h.exclude] == ["node3"]


def test_the_template_writes_the_exclude_line_of_the_bad_hosts(tmp_path):
    path = tmp_path / "nodes.sqlite"
    for i in range(2):
        record(path, "", run(str(i), time.time() - 600 + i, slow=("node2",)))
    env = {**os.environ, "TRACEML_NODE_STORE": str(path)}
    env.pop("SLURM_CLUSTER_NAME", None)

    def template(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "template", "--print", "--no-check",
                               "--nodes", "2", *extra, "train.py"], env=env, capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    out = template("--exclude-bad", "--exclude", "node[7-8]")
    assert "#SBATCH --exclude='node[2,7-8]'" in out or "#SBATCH --exclude=node[2,7-8]" in out, out
    assert "--exclude-bad: node2: link sending at 0.012 GB/s against 1.5 GB/s in 2 of 2 job(s)" in out
    assert "#SBATCH --exclude" not in template()
    record(path, "", run("9", time.time(), hosts=("node1", "node3")))
    env["TRACEML_NODE_STORE"] = str(tmp_path / "empty.sqlite")
    out = template("--exclude-bad")
    assert "#SBATCH --exclude" not in out and "no host is bad enough to exclude (0 host(s)" in out


def _doctor(job: str, slow: str = "node3"):
    """A doctor's report whose link probe (cross.link-bandwidth) found ``slow`` sending slowly."""
    from traceml_slurm.doctor.model import CheckResult, JobInfo, Outcome, Report, Status

    link = CheckResult("cross.link-bandwidth", "link", "cross", {
        h: Outcome(Status.FAIL if h == slow else Status.PASS, "", data={"gbps": 0.012 if h == slow else 1.5,
                                                                       "recv_gbps": 1.4}) for h in HOSTS})
    return Report(JobInfo(job, "j", list(HOSTS), "batch", "node1", "default"), [link], 1.0)


def test_the_doctor_records_its_link_probe_and_ends_in_the_line(tmp_path):
    import io

    from traceml_slurm.doctor.nodehealth import next_job as doctor_next_job
    from traceml_slurm.doctor.render import render_text
    from traceml_slurm.facts import Facts

    env = {"SLURM_JOB_ID": "1", "TRACEML_NODE_STORE": str(tmp_path / "nodes.sqlite"), "SLURM_CLUSTER_NAME": "c"}
    first = doctor_next_job(_doctor("1"), Facts.of(env))
    assert first is None  # slow in one job only: nothing to say yet
    report = _doctor("2")
    report.next_job = doctor_next_job(report, Facts.of({**env, "SLURM_JOB_ID": "2"}))
    assert report.next_job.lines == ("#SBATCH --exclude=node3",)
    out = io.StringIO()
    render_text(report, out, no_color=True)
    assert out.getvalue().rstrip().endswith(
        "Next job script (paste into your sbatch script; traceml slurm nodes says why):\n"
        "  #SBATCH --exclude=node3    # node3: link sending at 0.012 GB/s against 1.5 GB/s in 2 of 2 job(s) since "
        + time.strftime("%b %d")), out.getvalue()
    assert report.to_json()["next_job"]["lines"] == ["#SBATCH --exclude=node3"]
    records, _ = NodeStore(tmp_path / "nodes.sqlite").records("c")
    assert [(r.job_id, r.source) for r in sorted(records, key=lambda r: r.at)] == [("1", "doctor"), ("2", "doctor")]
    assert doctor_next_job(_doctor("3"), Facts.of({"PATH": ""})) is None  # outside a job: nothing


def _doctor_bench(job: str, slow: str = "node3"):
    """A doctor's report whose micro-benchmarks (cross.compute-speed) found ``slow``'s CPU matmul at
    a quarter of its peers' (as crossnode.compute_speed writes it)."""
    from traceml_slurm.doctor.crossnode import compute_speed
    from traceml_slurm.doctor.model import CheckResult, JobInfo, Report

    bench = {h: {"cpu": {"gflops": 10.0 if h == slow else 40.0, "threads": 1}, "gpus": []} for h in HOSTS}
    speed = CheckResult("cross.compute-speed", "speed", "cross", compute_speed(bench))
    return Report(JobInfo(job, "j", list(HOSTS), "batch", "node1", "default"), [speed], 1.0)


def test_the_doctor_records_its_benchmarks_and_a_node_slow_in_two_jobs_is_excluded(tmp_path):
    from traceml_slurm.doctor.nodehealth import next_job as doctor_next_job
    from traceml_slurm.facts import Facts

    env = {"SLURM_JOB_ID": "1", "TRACEML_NODE_STORE": str(tmp_path / "nodes.sqlite")}
    assert doctor_next_job(_doctor_bench("1"), Facts.of(env)) is None   # slow in one job only
    got = doctor_next_job(_doctor_bench("2"), Facts.of({**env, "SLURM_JOB_ID": "2"}))
    assert got.lines == ("#SBATCH --exclude=node3",)
    assert got.why[0].startswith("node3: CPU matmul at 10 GFLOP/s against 40 GFLOP/s in 2 of 2 job(s)"), got.why
    health = {h.host: h for h in record(tmp_path / "nodes.sqlite", "", None)[0]}
    ev = {e.kind: e for e in health["node1"].evidence}
    assert (ev["bench_cpu"].value, ev["bench_cpu"].peers, ev["bench_cpu"].bad) == (40.0, 25.0, False)
    assert (ev["bench_cpu"].source, ev["bench_cpu"].job_id, ev["bench_cpu"].unit) == ("doctor", "2", "GFLOP/s")
    assert not health["node1"].exclude and health["node3"].exclude


def _doctor_gpus(job: str, **fake: dict):
    """A doctor's report whose gpu.health check ran on each node with the fake NVML (``fake[host]``:
    FakeGpu fields of its second GPU; the first is healthy)."""
    from doctor_env import cuda_torch, gpus, make

    from traceml_core.sdk.samplers import FakeGpu, FakeNvml
    from traceml_slurm.doctor import gpu as G
    from traceml_slurm.doctor.model import CheckResult, JobInfo, Report

    outcomes = {h: G.check_health(make(gpus(2, SLURMD_NODENAME=h), torch=cuda_torch(2), nvml=FakeNvml(
        [FakeGpu(uuid=f"GPU-{h}-0"), FakeGpu(uuid=f"GPU-{h}-1", **fake.get(h, {}))]))) for h in HOSTS}
    return Report(JobInfo(job, "j", list(HOSTS), "batch", "node1", "default"),
                  [CheckResult("gpu.health", "GPU health", "node", outcomes)], 1.0)


def test_nvml_health_is_kept_a_slowdown_excludes_when_it_repeats_a_hardware_xid_at_once(tmp_path):
    from traceml_slurm.doctor.nodehealth import next_job as doctor_next_job
    from traceml_slurm.facts import Facts

    store = tmp_path / "nodes.sqlite"
    env = {"SLURM_JOB_ID": "1", "TRACEML_NODE_STORE": str(store)}
    hot = {"node3": {"clock_reasons": 0x40}}  # node3's second GPU in thermal slowdown
    assert doctor_next_job(_doctor_gpus("1", **hot), Facts.of(env)) is None    # once: not enough
    got = doctor_next_job(_doctor_gpus("2", **hot), Facts.of({**env, "SLURM_JOB_ID": "2"}))
    assert got.lines == ("#SBATCH --exclude=node3",), got
    assert got.why[0].startswith("node3: GPU 1 held back (hw_thermal_slowdown) in 2 of 2 job(s)"), got.why
    # job 3: node2's GPU logged XID 79 (fallen off the bus): a hardware fault excludes it at once
    got = doctor_next_job(_doctor_gpus("3", node2={"xids": (79,)}, **hot), Facts.of({**env, "SLURM_JOB_ID": "3"}))
    assert got.lines == ("#SBATCH --exclude=node[2-3]",), got
    cli = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json", "--store", str(store)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "SLURM_CLUSTER_NAME": ""})
    nodes = json.loads(cli.stdout)
    assert sorted(nodes["exclude"]) == ["node2", "node3"] and nodes["line"] == "#SBATCH --exclude=node[2-3]", nodes
    by = {n["host"]: n for n in nodes["nodes"]}
    assert by["node2"]["why"] == "a hardware fault: GPU 1: XID 79" and (by["node2"]["jobs"], by["node2"]["bad_jobs"]) == (3, 1)
    ev = {e["kind"]: e for e in by["node2"]["evidence"]}["gpu_health"]
    assert (ev["bad"], ev["strong"], ev["job"], ev["source"], ev["note"]) == (True, True, "3", "doctor", "GPU 1: XID 79")
    clean = {e["kind"]: e for e in by["node1"]["evidence"]}["gpu_health"]
    assert (clean["bad"], clean["note"]) == (False, "2 GPU(s) healthy") and not by["node1"]["exclude"]
    text = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--store", str(store)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "SLURM_CLUSTER_NAME": ""}).stdout
    assert text.rstrip().endswith("Next job script (paste into your sbatch script):\n  #SBATCH --exclude=node[2-3]"), text


def test_the_reason_names_every_kind_seen_bad_the_most_repeated_first(tmp_path):
    """A node short of CPU: its link probe slow in both jobs (a CPU-bound sender), its compute in
    the run and its CPU matmul in the doctor, one job each. The reason leads with the kind of most
    bad jobs and then names every other kind, with what was measured, so the CPU is not hidden
    behind the link it slows."""
    t0 = time.time() - 3600
    cpu = {"101": NodeObservation("node3", "compute", 124.0, 58.0, "ms", True),
           "102": NodeObservation("node3", "bench_cpu", 10.1, 27.1, "GFLOP/s", True)}
    runs = [RunEvidence(j, f"run-{j}", t0 + i * 600, "run", HOSTS,
                        run(j, 0, slow=("node3",)).observations + (cpu[j],)) for i, j in enumerate(("101", "102"))]
    h = health_after(tmp_path, runs)["node3"]
    assert h.exclude and h.reason.startswith("node3: link sending at 0.012 GB/s against 1.5 GB/s in 2 of 2 job(s) since ")
    assert h.reason.endswith("; also compute (own time per step) at 124 ms against 58 ms in 1 of 2, "
                             "CPU matmul at 10.1 GFLOP/s against 27.1 GFLOP/s in 1 of 2"), h.reason


def slow_rank(job: str, at: float, host: str, rank: int, *, work: str = "") -> RunEvidence:
    """A 3-node run whose straggler, rank ``rank``, ran on ``host`` (compute evidence, placed)."""
    obs = tuple(NodeObservation(h, "compute", 90.0 if h == host else 40.0, 40.0, "ms", h == host,
                                ranks=(rank,) if h == host else (), work=work if h == host else "")
                for h in HOSTS)
    return RunEvidence(job, f"run-{job}", at, "run", HOSTS, obs)


def test_a_slow_rank_that_follows_its_data_excludes_no_host_wherever_it_lands(tmp_path):
    """Rank 1 has more work (its shard) in every job, and lands on a different node each time:
    each host is slow once or twice, always with rank 1 on it: none is excluded, and each says why."""
    path = tmp_path / "nodes.sqlite"
    t0 = time.time() - 3600
    for i, host in enumerate(["node2", "node2", "node3", "node3", "node1", "node1"]):
        health, notes = record(path, "c", slow_rank(str(i), t0 + 60 * i, host, rank=1))
        assert not notes, notes
        assert not [h.host for h in health if h.exclude], [h.why for h in health]
    h = {x.host: x for x in health}
    assert h["node1"].rank_following_jobs == 2 and h["node1"].rank_following == (1,)
    assert "not counted: slow in 2 more job(s) (compute (own time per step)) with only rank 1 on it" in h["node1"].why
    ev = {e.kind: e for e in h["node1"].evidence}
    assert ev["compute"].ranks == (1,) and ev["compute"].counted is False


def test_a_slow_host_is_excluded_when_it_is_slow_with_different_ranks_or_with_work_measured_equal(tmp_path):
    t0 = time.time() - 3600
    moved = tmp_path / "a.sqlite"   # node3 slow with rank 2, then rank 0 on it: the host, not a rank
    record(moved, "c", slow_rank("1", t0, "node3", rank=2))
    health, _ = record(moved, "c", slow_rank("2", t0 + 60, "node3", rank=0))
    assert [x.host for x in health if x.exclude] == ["node3"]
    equal = tmp_path / "b.sqlite"   # the same rank each time, but its work measured equal to the others'
    record(equal, "c", slow_rank("1", t0, "node3", rank=2, work="equal"))
    health, _ = record(equal, "c", slow_rank("2", t0 + 60, "node3", rank=2, work="equal"))
    assert [x.host for x in health if x.exclude] == ["node3"]
    same = tmp_path / "c.sqlite"    # the same rank each time, work not measured: not excluded
    record(same, "c", slow_rank("1", t0, "node3", rank=2))
    health, _ = record(same, "c", slow_rank("2", t0 + 60, "node3", rank=2))
    assert not [x.host for x in health if x.exclude]


def test_a_schema_1_store_is_migrated_in_place(tmp_path):
    path = tmp_path / "nodes.sqlite"
    record(path, "c", run("1", time.time() - 60, slow=("node3",)))
    with sqlite3.connect(path) as conn:   # as TraceML with schema 1 left it
        conn.execute("CREATE TABLE o1 AS SELECT record, host, kind, value, peers, unit, bad, strong, note FROM observations")
        conn.execute("DROP TABLE observations")
        conn.execute("ALTER TABLE o1 RENAME TO observations")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    health, notes = record(path, "c", run("2", time.time(), slow=("node3",)))
    assert not notes and [x.host for x in health if x.exclude] == ["node3"]   # both jobs kept
