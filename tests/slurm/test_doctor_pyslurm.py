"""The doctor through the REAL pyslurm 25.11.2 and through scontrol, on a real Slurm 25.11 allocation:
the same facts from both backends; and the recorded pyslurm answers the unit tests replay are still
what the real pyslurm returns.

Only a 25.11 cluster has pyslurm (``TRACEML_CLUSTER_SLURM=25.11 scripts/dev-cluster up`` makes a
Python 3.13 with it, ``TRACEML_CLUSTER_PY313``: no pyslurm exists for 22.05 or 24.11's Python here);
elsewhere these tests skip. The 25.11 Python has no torch, so the torch checks are ignored, and the
dev cluster's GPUs are /dev/null clones, so the GPU checks are too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = REPO / "tests" / "fixtures" / "pyslurm"
#: what the 25.11 Python cannot check here (no torch in it; the GPUs are placeholders)
IGNORE = "gpu,sw.torch,sw.nccl,cross.gloo-allreduce,cross.nccl-bandwidth"
BACKEND_CHECKS = ("ctl.job", "ctl.nodes", "ctl.gres", "ctl.partition", "time.left", "time.signal")


@pytest.fixture()
def py313(slurm_cluster) -> str:
    py = os.environ.get("TRACEML_CLUSTER_PY313")
    if not py:
        pytest.skip("pyslurm runs only on the Slurm 25.11 cluster (TRACEML_CLUSTER_SLURM=25.11 scripts/dev-cluster up)")
    return py


def run_both(cluster, py: str, *sbatch: str, args: str = "", scheduler: Optional[str] = None) -> Optional[dict[str, dict]]:
    """One batch job; in its shell the doctor runs with --controller=pyslurm, then =scontrol. With
    ``scheduler``, a job some other scheduler started ends at once and None is returned."""
    work = Path(tempfile.mkdtemp(prefix="doc-pyslurm-", dir=cluster.jobs_dir))
    lines = ["#!/bin/bash", "#SBATCH --signal=TERM@60", f"export PATH={Path(py).parent}:$PATH", f"cd {work}"]
    if scheduler:
        lines.append(f"scontrol show job $SLURM_JOB_ID | grep -qE 'Scheduler={scheduler}( |$)' || exit 3")
    for backend in ("pyslurm", "scontrol"):
        lines += [f"traceml slurm doctor --json --controller={backend} --ignore {IGNORE} {args} "
                  f"> {work}/{backend}.json 2> {work}/{backend}.err; echo $? > {work}/{backend}.rc"]
    job, state, out = cluster.run_job("\n".join(lines) + "\n", *sbatch, timeout=120, cwd=work)
    if scheduler and state == "FAILED" and not (work / "pyslurm.rc").exists():
        return None
    assert state == "COMPLETED", (state, out)
    got = {}
    for backend in ("pyslurm", "scontrol"):
        report = json.loads((work / f"{backend}.json").read_text())
        report["rc"] = int((work / f"{backend}.rc").read_text())
        report["stderr"] = (work / f"{backend}.err").read_text()
        got[backend] = report
    return got


def by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def same_facts(got: dict[str, dict], ids=BACKEND_CHECKS) -> None:
    """Every controller check says the same through both backends (but the backend's own name, and
    the seconds left, which pass between the two runs)."""
    a, b = by_id(got["pyslurm"]), by_id(got["scontrol"])
    for cid in ids:
        for name, outcome in a[cid]["nodes"].items():
            other = b[cid]["nodes"][name]
            assert outcome["status"] == other["status"], (cid, outcome, other)
            if cid == "time.left":
                continue
            assert outcome["observed"].replace("via pyslurm", "via X") == other["observed"].replace("via scontrol", "via X"), cid
            data = {k: v for k, v in outcome["data"].items() if k != "backend"}
            assert data == {k: v for k, v in other["data"].items() if k != "backend"}, cid


def test_doctor_through_pyslurm_and_scontrol_gives_the_same_facts(slurm_cluster, py313):
    got = run_both(slurm_cluster, py313, "-N2", "--time=10", "--gres=gpu:2")
    for backend, report in got.items():
        assert report["rc"] == 0 and report["summary"]["failed"] == 0, (backend, report["stderr"], report["summary"])
        assert f"(via {backend})" in by_id(report)["ctl.job"]["nodes"][next(iter(by_id(report)["ctl.job"]["nodes"]))]["observed"]
    same_facts(got)
    ctl = by_id(got["pyslurm"])
    gres = next(iter(ctl["ctl.gres"]["nodes"].values()))
    assert gres["data"]["gpus"] == {"node1": 2, "node2": 2}  # pyslurm's GRES dicts, counted
    signal = next(iter(ctl["time.signal"]["nodes"].values()))
    assert signal["data"]["kill_wait_s"] == 5.0 and signal["status"] == "pass"


def test_a_backfilled_job_without_time_limit_has_none_through_both(slurm_cluster, py313):
    """No --time in a MaxTime=INFINITE partition: started by the backfill scheduler (the job becomes
    eligible a second after submission; the backfill scheduler runs every second and mostly starts it),
    the job has a 365-day limit in scontrol and pyslurm alike."""
    for _ in range(8):
        got = run_both(slurm_cluster, py313, "-N2", "-p", "debug", "--begin=now+1", scheduler="Backfill",
                       args="--local --ignore slurm,gpu,sw,net,fs")
        if got is not None:
            break
    else:
        pytest.fail("the backfill scheduler never started the job (8 tries)")
    job = by_id(got["scontrol"])["ctl.job"]
    job_id = re.search(r"job (\d+)", next(iter(job["nodes"].values()))["observed"]).group(1)
    assert "TimeLimit=365-00:00:00" in slurm_cluster.run("scontrol", "show", "job", job_id).stdout
    for backend, report in got.items():
        left = next(iter(by_id(report)["time.left"]["nodes"].values()))
        assert left["observed"] == "no time limit", (backend, left)
    same_facts(got)


def test_the_recorded_pyslurm_answers_are_still_the_real_ones(slurm_cluster, py313, tmp_path):
    """Re-record one situation and compare it with the committed recording the unit tests replay:
    the same attributes with the same types, and the same values where they are not ids or times."""
    spec = importlib.util.spec_from_file_location("pyslurm_record", RECORDINGS / "record.py")
    record = importlib.util.module_from_spec(spec)
    sys.modules["pyslurm_record"] = record
    spec.loader.exec_module(record)
    gen = record.generation(slurm_cluster)
    committed_path = RECORDINGS / gen / "gres2.json"
    assert committed_path.exists(), f"no recording for Slurm {gen}: run tests/fixtures/pyslurm/record.py"
    raw = slurm_cluster.jobs_dir / f"pyslurm-fresh-{os.getpid()}.json"
    record.run_job(slurm_cluster, "gres2", str(raw))
    fresh, committed = json.loads(raw.read_text()), json.loads(committed_path.read_text())

    # set or unset by who submits, not by Slurm's answer: the sbatch caller's session id is None
    # (0) when the submitter has no session, as under CI's runner
    by_submitter = {"submit_session_id"}

    def shape(obj: dict) -> dict:
        return {"type": obj["type"], "methods": obj["methods"],
                "attrs": {k: ("int|None" if k in by_submitter and v["type"] in ("int", "NoneType") else v["type"])
                          for k, v in obj["attrs"].items()}}

    def names(obj: dict) -> tuple:
        return obj["type"], obj["methods"], sorted(obj["attrs"])

    assert shape(fresh["job"]) == shape(committed["job"])
    assert shape(fresh["config"]) == shape(committed["config"])
    for group in ("nodes", "partitions"):
        assert {k: names(v) for k, v in fresh[group].items()} == {k: names(v) for k, v in committed[group].items()}
    # the job's nodes with their types too (another node's, e.g. reason_user, depend on its history)
    for node in ("node1", "node2"):
        assert shape(fresh["nodes"][node]) == shape(committed["nodes"][node]), node
    stable = ("time_limit", "partition", "allocated_nodes", "num_nodes", "state", "batch_host")
    assert {k: fresh["job"]["attrs"][k] for k in stable} == {k: committed["job"]["attrs"][k] for k in stable}
    assert fresh["job"]["calls"]["get_resource_layout_per_node"] == committed["job"]["calls"]["get_resource_layout_per_node"]
    for key in ("kill_wait_time", "version"):
        assert fresh["config"]["attrs"][key] == committed["config"]["attrs"][key]
