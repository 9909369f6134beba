"""The goodput ledger on the real local Slurm cluster, against what the ranks recorded themselves.

Three jobs run side by side (2 + 1 + 1 nodes of the 3; each test then waits for its own):

* ``requeue``: 2 nodes, ``--requeue``, a checkpoint (``torch.save``) every 20 steps,
  ``trace_step(model, step=global_step)``; requeued with ``scontrol requeue`` once it is past step
  30 (of 90: room for a loaded controller), it resumes from its last checkpoint and finishes step
  89 in its second attempt;
* ``clean``: the control, 1 node, one attempt that completes: no redone work, no false advice;
* ``fail``: 1 node, 2 ranks; rank 1 raises at step 25, the job fails and the test requeues it: the
  second attempt resumes from the checkpoint at step 20 (no ``step=``: the redone work is inferred
  from the checkpoint the workers timed).

For each: every split of the ledger sums exactly to 100%; every bucket matches the ranks' own
truth (tests/slurm/goodput_train.py) within 2% of the allocation or 1 s per slot, the checkpoint
saves the workers timed with no code of the script's included; the redone steps are exact; the
advice names the largest avoidable bucket, which is the largest in the truth too. (A ledger whose
workers report no saves: tests/unit/test_goodput_ledger.py.)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
from e2e import REPO, job_env

TRAIN = REPO / "tests" / "slurm" / "goodput_train.py"
STEPS_GROUP = ("productive", "input", "comm", "straggler", "no_phase")
COMPARED = ("startup", "steps", "checkpoint", "between", "redone", "tail", "after_failure")
NODE = ("--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1")


@dataclass
class Job:
    name: str
    id: str
    dir: Path

    @property
    def truth(self) -> Path:
        return self.dir / "truth"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"


def _script(args: str) -> str:
    return f"""#!/bin/bash
echo "$(date +%s.%N) $(scontrol show job -o $SLURM_JOB_ID | grep -o 'StartTime=[^ ]*')" >> "$GOODPUT_TRUTH/alloc-a${{SLURM_RESTART_COUNT:-0}}.txt"
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {TRAIN} -- --ckpt-dir "$GOODPUT_TRUTH/../ckpt" {args}
echo "$(date +%s.%N)" >> "$GOODPUT_TRUTH/end-a${{SLURM_RESTART_COUNT:-0}}.txt"
"""


JOBS = {
    "requeue": ("--steps 90 --step-ms 100 --ckpt-every 20 --ckpt-ms 400 --give-step",
                ("--nodes=2", *NODE, "--requeue")),
    "clean": ("--steps 40 --step-ms 100 --ckpt-every 20 --ckpt-ms 300 --give-step", ("--nodes=1", *NODE)),
    "fail": ("--steps 40 --step-ms 100 --ckpt-every 10 --ckpt-ms 200 --fail-rank 1 --fail-step 25",
             ("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:2", "--cpus-per-task=2", "--requeue")),
}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    """Submit both jobs at once (they run side by side); cancel what is left at the end."""
    out: dict[str, Job] = {}
    for name, (args, sbatch) in JOBS.items():
        d = tmp_path_factory.mktemp(f"goodput-{name}")
        (d / "truth").mkdir()
        # the requeued job also exports to MLflow (its file store in the run directory): its
        # two attempts must be ONE MLflow run, read back with MLflow's own client
        extra = {"TRACEML_EXPORT": "mlflow"} if name == "requeue" else {}
        env = job_env(d / "logs", GOODPUT_TRUTH=str(d / "truth"), **extra)
        out[name] = Job(name, slurm_cluster.submit(_script(args), f"--job-name=gp-{name}", *sbatch, env=env), d)
    yield out
    for job in out.values():
        slurm_cluster.run("scancel", job.id, check=False)


# --- the ranks' truth ----------------------------------------------------------------------------
def records(job: Job, attempt: int) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for path in sorted(job.truth.glob(f"rank*-a{attempt}.jsonl")):
        out[int(path.name[4:].split("-")[0])] = [json.loads(ln) for ln in path.read_text().splitlines() if ln]
    return out


def truth_of(recs: list[dict[str, Any]], A0: float, A1: float, failed_at: Optional[float], *,
             saves_seen: bool, redone_seen: bool) -> dict[str, float]:
    """One rank's buckets from its own records (see goodput_train.py), in seconds. Where the
    ledger cannot see saves (``saves_seen`` false) their time is between-step work (or the tail,
    after the last step); where it cannot place the redone steps, they are steps."""
    steps = [r for r in recs if r["k"] == "step"]
    cks = [(r["start"], r["end"]) for r in recs if r["k"] == "ckpt"] if saves_seen else []
    out = dict.fromkeys(COMPARED, 0.0)
    if not steps:
        F = failed_at if failed_at is not None else A1
        out["startup"], out["after_failure"] = F - A0, A1 - F
        return out
    f, l = steps[0]["start"], steps[-1]["end"]
    redo = [s for s in steps if s["redo"]] if redone_seen else []
    w_end = redo[-1]["end"] if redo else f
    ck_window = sum(e - s for s, e in cks if e <= w_end)
    ck_S = sum(e - s for s, e in cks if e <= l)
    out["startup"] = f - A0
    out["redone"] = (w_end - f) - ck_window
    out["steps"] = sum(s["end"] - s["start"] for s in steps if s not in redo)
    out["checkpoint"] = sum(e - s for s, e in cks)
    out["between"] = (l - w_end) - out["steps"] - (ck_S - ck_window)
    end = A1
    if failed_at is not None:
        end = max(failed_at, l)
        out["after_failure"] = A1 - end
    out["tail"] = end - l - (out["checkpoint"] - ck_S)
    return out


def ledger_of(split: dict[str, Any]) -> dict[str, float]:
    b = split["buckets"]
    out = {k: b.get(k) or 0.0 for k in COMPARED if k != "steps"}
    out["steps"] = sum(b.get(k) or 0.0 for k in STEPS_GROUP)
    return out


def sums_exactly(split: dict[str, Any]) -> None:
    total = sum(v for v in split["buckets"].values() if v is not None)
    assert round(total, 3) == split["total_s"], split


def check_attempt(job: Job, a: dict[str, Any], index: int, failed_at: Optional[float] = None) -> dict[str, float]:
    """Every node's buckets against its ranks' truth; returns the attempt's truth by bucket."""
    sums_exactly(a)
    assert round(sum(n["total_s"] for n in a["nodes"]), 3) == a["total_s"]
    seen = {"saves_seen": a["buckets"]["checkpoint"] is not None, "redone_seen": a["buckets"]["redone"] is not None}
    recs = records(job, index)
    nproc = a["slots"] // len(a["nodes"])
    whole = dict.fromkeys(COMPARED, 0.0)
    for n in a["nodes"]:
        sums_exactly(n)
        truth = dict.fromkeys(COMPARED, 0.0)
        for rank in range(n["node"] * nproc, (n["node"] + 1) * nproc):
            for k, v in truth_of(recs.get(rank, []), a["start"], a["end"], failed_at, **seen).items():
                truth[k] += v
        got = ledger_of(n)
        tol = max(0.02 * n["total_s"], 1.0 * n["slots"])
        bad = {k: (round(got[k], 2), round(truth[k], 2)) for k in COMPARED if abs(got[k] - truth[k]) > tol}
        print(f"{job.name} attempt {index} node {n['node']}: ledger/truth "
              + ", ".join(f"{k} {got[k]:.2f}/{truth[k]:.2f}" for k in COMPARED) + f" (tolerance {tol:.2f})")
        assert not bad, (f"{job.name} attempt {index} node {n['node']}: ledger vs truth (tolerance {tol:.2f} s): "
                         f"{bad}\nledger: {n}")
        for k in COMPARED:
            whole[k] += truth[k]
    return whole


def check_advice(g: dict[str, Any], truths: list[dict[str, float]]) -> None:
    """The advice names the ledger's largest avoidable bucket, and that one is (within the
    tolerance) the largest avoidable one in the ranks' truth too."""
    adv = g["advice"]
    total = g["total"]["buckets"]
    avoidable = {k: v for k, v in total.items() if v and k not in ("productive", "no_phase")}
    if adv is None:
        assert not avoidable or max(avoidable.values()) < 0.05 * g["total"]["total_s"], g
        return
    assert adv["bucket"] == max(avoidable, key=avoidable.get), (adv, total)
    truth = {k: sum(t.get(k, 0.0) for t in truths) for k in COMPARED if k != "steps"}
    tol = max(0.02 * g["total"]["total_s"], 1.0 * max(a["slots"] for a in g["attempts"]))
    if adv["bucket"] in truth:
        assert truth[adv["bucket"]] >= max(truth.values()) - 2 * tol, (adv["bucket"], truth)
    assert f"{adv['seconds']:,.1f}" in adv["why"] or "step(s)" in adv["why"], adv


def summary_of(job: Job) -> tuple[dict[str, Any], str]:
    runs = [p for p in job.logs.iterdir() if (p / "final_summary.json").exists()]
    assert len(runs) == 1, sorted(p.name for p in job.logs.iterdir())
    return (json.loads((runs[0] / "final_summary.json").read_text()),
            (runs[0] / "final_summary.txt").read_text())


def started_at(job: Job, attempt: int) -> float:
    """The allocation's start as the controller gave it to the batch script (whole seconds)."""
    line = (job.truth / f"alloc-a{attempt}.txt").read_text().split()
    return time.mktime(time.strptime(line[1].split("=", 1)[1], "%Y-%m-%dT%H:%M:%S"))


def requeue_when(cluster, job: Job, ready, timeout: float = 150.0) -> None:
    """``scontrol requeue`` once ``ready()``, then lift the 120 s BeginTime Slurm holds it for."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{job.name}: not ready to requeue: {cluster.output(job.id)[-3000:]}"
        time.sleep(0.2)
    cluster.run("scontrol", "requeue", job.id)
    while True:
        rec = cluster.job_info(job.id)[0]
        if rec["JobState"] == "PENDING" and int(rec.get("Restarts", "0")) >= 1:
            cluster.run("scontrol", "update", f"JobId={job.id}", "StartTime=now")
            return
        assert time.monotonic() < deadline, f"{job.name} was not requeued: {rec.get('JobState')}"
        time.sleep(0.2)


def last_step(job: Job, attempt: int) -> int:
    steps = [r["g"] for recs in records(job, attempt).values() for r in recs if r["k"] == "step"]
    return max(steps, default=-1)


def saves_measured(a: dict[str, Any], job: Job, attempt: int) -> None:
    """The workers timed every save the ranks made (torch.save, with no code of the script's)."""
    saves = max(sum(1 for r in recs if r["k"] == "ckpt") for recs in records(job, attempt).values())
    assert a["buckets"]["checkpoint"] is not None and "checkpoint" not in a["not_measured"], a
    assert a["progress"]["checkpoints"] == saves, (a["progress"], saves)


# --- the tests ---------------------------------------------------------------------------------
def test_requeued_two_node_job_is_one_run_with_one_ledger(slurm_cluster, jobs, tmp_path):
    job = jobs["requeue"]
    requeue_when(slurm_cluster, job, lambda: last_step(job, 0) >= 30)
    state = slurm_cluster.wait(job.id, timeout=240)
    out = slurm_cluster.output(job.id)
    assert state == "COMPLETED", out[-3000:]
    data, text = summary_of(job)
    g = data["goodput"]
    assert [a["restart_count"] for a in g["attempts"]] == [0, 1], g["attempts"]
    a0, a1 = g["attempts"]
    assert a0["ended"] == "requeued" and "requeue" in a0["reason"], a0["reason"]
    if not a0["rebuilt"]:   # its own summary, written on the requeue's SIGTERM, names it
        assert "the job was requeued" in a0["reason"], a0["reason"]
    assert a1["ended"] == "completed" and data["run"]["status"] == "completed"
    assert a0["job_id"] == a1["job_id"] == job.id
    for a, i in ((a0, 0), (a1, 1)):  # the allocation's start: the controller's StartTime
        assert abs(a["start"] - started_at(job, i)) <= 1.0, (a["start"], started_at(job, i))
    ended = float((job.truth / "end-a1.txt").read_text().split()[0])
    assert a1["end"] <= ended + 0.5 and ended - a1["end"] < 10, (a1["end"], ended)
    assert a1["queued_before_s"] is not None and 0 <= a1["queued_before_s"] < 60
    # the saves were timed and the script gave its global step: attempt 1 began at the last
    # checkpoint of attempt 0 and redid, exactly, the steps after it that attempt 0 had done
    recs1 = records(job, 1)
    redo_truth = max(sum(1 for r in recs if r["k"] == "step" and r["redo"]) for recs in recs1.values())
    resumed_at = min(r["g"] for recs in recs1.values() for r in recs if r["k"] == "step")
    for a, i in ((a0, 0), (a1, 1)):
        saves_measured(a, job, i)
    p0, p1 = a0["progress"], a1["progress"]
    # exact, but for the steps attempt 0's ranks made in the instant before they were killed
    # (their last records unsent, no goodbye): then the ledger gives the bound and says so
    reached = last_step(job, 0) + 1
    assert p0["checkpoint_position"] == resumed_at, p0
    assert p0["end_position"] <= reached <= (p0["end_position_max"] or p0["end_position"]), (p0, reached)
    assert p1["exact"] and p1["first_position"] == resumed_at, p1
    assert p1["redone_steps"] <= redo_truth <= (p1["redone_steps_max"] or p1["redone_steps"]), (p1, redo_truth)
    assert redo_truth >= 1 and (p1["redone_steps_max"] is None) == ("redone" not in a1["notes"]), a1["notes"]
    assert a1["buckets"]["redone"] > 0 and a0["buckets"]["redone"] == 0
    truths = [check_attempt(job, a0, 0), check_attempt(job, a1, 1)]
    sums_exactly(g["total"])
    assert round(a0["total_s"] + a1["total_s"], 3) == g["total"]["total_s"]
    check_advice(g, truths)
    # one run directory: the first attempt's files under attempt-0/, the ledger heads the text
    run_dir = job.logs / data["run"]["name"]
    if a0["rebuilt"]:   # node 0 was killed (KillWait) before it wrote the summary: its checkpoint
        assert (run_dir / "attempt-0" / "aggregate.state").exists()
    else:
        first = json.loads((run_dir / "attempt-0" / "final_summary.json").read_text())
        assert first["goodput"]["attempts"][-1]["run_id"] == a0["run_id"]
    assert text.startswith("Goodput of run over 2 attempts (1 requeue(s))"), text[:400]
    assert "attempt 1 (job" in text and "redone after a requeue" in text
    # the charts and exports of attempt 1 are drawn at the global steps the ledger uses
    assert data["timeline"]["step_offset"] == p1["first_position"] == resumed_at, data["timeline"]["step_offset"]
    # one MLflow run across the requeue, read back with MLflow's client from the run's file store
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (mrun,) = client.search_runs([client.get_experiment_by_name("traceml").experiment_id])
    assert mrun.data.tags["traceml.attempt"] == "1" and mrun.data.tags["traceml.attempt.0.job_id"] == job.id
    steps = sorted(m.step for m in client.get_metric_history(mrun.info.run_id, "rank_0000/step_ms"))
    assert steps and steps[0] < resumed_at and steps[-1] >= 89, steps   # both attempts, global steps
    print(text[:3000])
    _html(run_dir / "final_summary.html", tmp_path, attempts=2, nodes=4)


def _html(path: Path, tmp_path: Path, *, attempts: int, nodes: int) -> None:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from chromium import Chromium, chromium_path

    if chromium_path() is None:
        return  # the page's bars are checked where a browser exists (CI has one)
    c = Chromium(tmp_path / "chrome", width=1400, height=1000, offline=True)
    try:
        c.open(path.resolve().as_uri())
        assert c.wait_for("document.body.dataset.rendered", timeout=60) == "1"
        got = c.eval("""(() => ({attempts: document.querySelectorAll("tr[data-row=attempt]").length,
            nodes: document.querySelectorAll("tr[data-row=node]").length,
            bars: [...document.querySelectorAll("tr[data-row] .bar")].map(b => b.querySelectorAll("span[data-bucket]").length),
            text: document.body.innerText}))()""")
        assert got["attempts"] == attempts and got["nodes"] == nodes, got
        assert all(n >= 2 for n in got["bars"]), got["bars"]   # every bar is stacked
        assert "Where the allocation went" in got["text"]
    finally:
        c.close()


def test_a_clean_single_attempt_is_the_control(slurm_cluster, jobs):
    job = jobs["clean"]
    state = slurm_cluster.wait(job.id, timeout=240)
    assert state == "COMPLETED", slurm_cluster.output(job.id)[-3000:]
    data, text = summary_of(job)
    g = data["goodput"]
    (a,) = g["attempts"]
    assert a["ended"] == "completed" and a["progress"]["redone_steps"] == 0
    saves_measured(a, job, 0)
    assert a["buckets"]["checkpoint"] > 0
    truth = check_attempt(job, a, 0)
    b = a["buckets"]
    assert b["redone"] == 0 and b["after_failure"] == 0 and b["hang"] == 0
    check_advice(g, [truth])
    assert g["advice"] is None or g["advice"]["bucket"] not in ("redone", "after_failure", "hang")
    assert not text.startswith("Goodput of run over"), text[:200]   # one attempt: no ledger heading
    assert "Goodput: 1 rank(s)" in text and "not saved" not in text


def test_a_failed_job_requeued_resumes_and_its_redone_work_is_inferred(slurm_cluster, jobs):
    job = jobs["fail"]
    requeue_when(slurm_cluster, job, lambda: slurm_cluster.state(job.id) in ("FAILED", "COMPLETED"))
    state = slurm_cluster.wait(job.id, timeout=240)
    assert state == "COMPLETED", slurm_cluster.output(job.id)[-3000:]
    data, text = summary_of(job)
    g = data["goodput"]
    a0, a1 = g["attempts"]
    assert a0["ended"] in ("requeued", "failed") and "rank 1" in a0["reason"], a0
    fail_t = min(r["t"] for rs in records(job, 0).values() for r in rs if r["k"] == "fail")
    truths = [check_attempt(job, a0, 0, failed_at=fail_t), check_attempt(job, a1, 1)]
    assert a0["buckets"]["after_failure"] > 0
    redo_truth = max(sum(1 for r in recs if r["k"] == "step" and r["redo"]) for recs in records(job, 1).values())
    p1 = a1["progress"]
    assert p1["source"] == "inferred" and p1["redone_steps"] == redo_truth == 6, p1
    assert "redone" in a1["notes"]
    check_advice(g, truths)
