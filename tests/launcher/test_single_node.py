"""`traceml run` on one node, as a user runs it: real torchrun, gloo DDP on CPU, real aggregator.

Each case checks what the user sees: the exit code of their training, the printed summary, the
files in the run directory and the verdict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
TRACEML = str(Path(sys.executable).parent / "traceml")
_port = [29900]


def launch(tmp_path: Path, script: str, *args: str, nproc: int = 2, env_extra: dict | None = None,
           run_name: str = "r") -> subprocess.Popen:
    _port[0] += 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env.update({"OMP_NUM_THREADS": "1"}, **(env_extra or {}))
    cmd = [TRACEML, "run", f"--nproc-per-node={nproc}", f"--logs-dir={tmp_path}", f"--run-name={run_name}",
           f"--master-port={_port[0]}", f"--aggregator-port={_port[0] + 1}", script, *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def summary(tmp_path: Path, run_name: str = "r") -> dict:
    assert (tmp_path / run_name / "final_summary.txt").exists()
    return json.loads((tmp_path / run_name / "final_summary.json").read_text())


def test_ddp_minimal_prints_summary_and_writes_files(tmp_path):
    code, out, err = finish(launch(tmp_path, str(REPO / "examples" / "ddp_minimal.py"), "--steps", "60"))
    assert code == 0, err
    assert "TraceML summary: run r" in out and "2 clean" in out
    data = summary(tmp_path)
    assert data["run"]["status"] == "completed" and data["run"]["exit_code"] == 0
    assert data["telemetry"]["records_received"] == 120
    assert [r["steps"] for r in data["ranks"]] == [60, 60]
    # the README's demo on CPU: its all-reduce is measured, and no verdict gives GPU advice
    assert data["device"] == "cpu" and data["communication"]["measured"]
    assert all(r["comm"]["calls_per_step"] == 1 for r in data["ranks"]), "one small bucket per step"
    assert "Communication: waits" in out
    for v in [data["verdict"]] + data["other_verdicts"]:
        for word in ("GPU", "bf16", "torch.compile", "pin_memory", "NCCL", "between the nodes"):
            assert word not in v["next_step"], (word, v)


def test_input_bound_example_gets_input_bound_verdict(tmp_path):
    code, out, err = finish(launch(tmp_path, str(REPO / "examples" / "input_bound.py"), "--steps", "25"))
    assert code == 0, err
    assert summary(tmp_path)["verdict"]["kind"] == "input_bound"


def test_straggler_example_names_the_culprit_rank(tmp_path):
    code, out, err = finish(launch(tmp_path, str(REPO / "examples" / "straggler.py"), "--steps", "40",
                                   env_extra={"STRAGGLER_RANK": "1", "STRAGGLER_DELAY_MS": "30"}))
    assert code == 0, err
    data = summary(tmp_path)
    verdicts = [data["verdict"]] + data.get("other_verdicts", [])
    straggler = next(v for v in verdicts if v["kind"] == "straggler")
    assert straggler["culprit"]["rank"] == 1 and straggler["culprit"]["node"] == 0
    for r in data["ranks"]:  # the straggler is slow, not broken: every step of both ranks arrived
        assert r["status"] == "clean" and r["steps"] == 40 and r["telemetry"]["lost"] == 0, r


FAILING = """
import os, sys, torch
import traceml_core as traceml
traceml.init()
model = torch.nn.Linear(4, 4)
for i in range(30):
    with traceml.trace_step(model):
        model(torch.randn(2, 4)).sum().backward()
    if i == 10 and os.environ["RANK"] == "1":
        {action}
"""


def test_training_exit_code_is_propagated_and_rank_ending_reported(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAILING.format(action="sys.exit(3)"))
    code, out, err = finish(launch(tmp_path, str(script)))
    assert code != 0
    data = summary(tmp_path)
    assert data["run"]["status"] == "failed"
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert ranks[0]["status"] == "clean" and ranks[1]["status"] in ("error", "crashed")


def test_exception_text_reaches_the_summary(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(FAILING.format(action="raise RuntimeError('boom at step ten')"))
    code, out, err = finish(launch(tmp_path, str(script)))
    assert code != 0
    ranks = {r["rank"]: r for r in summary(tmp_path)["ranks"]}
    assert ranks[1]["status"] == "error" and "boom at step ten" in (ranks[1]["error"] or "")


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _wait_for_records(path: Path, timeout: float = 120) -> None:
    """Until the aggregator's checkpoint holds step records (training is running and reporting)."""
    from traceml_core.rundir import load_checkpoint

    deadline = time.monotonic() + timeout
    while True:
        try:
            if int(load_checkpoint(path)["state"]["records"]) > 0:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, f"no step records in {path} after {timeout} s"
        time.sleep(0.2)


def test_sigterm_writes_interrupted_summary_quickly(tmp_path):
    proc = launch(tmp_path, str(REPO / "examples" / "ddp_minimal.py"), "--steps", "10000000")
    _wait_for_records(tmp_path / "r" / "aggregate.state")  # steps flow (a checkpoint says so)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    took = time.monotonic() - t0
    assert code == 143, err[-2000:]  # 128 + SIGTERM, the shell's convention
    assert took < 25, f"{took:.1f} s from SIGTERM to exit (Slurm's KillWait is 30 s)"
    data = summary(tmp_path)
    assert data["run"]["status"] == "interrupted" and "SIGTERM" in data["run"]["reason"]
    assert data["telemetry"]["records_received"] > 0
    assert "received SIGTERM" in err


def test_usr1_is_logged_not_fatal(tmp_path):
    """`--signal=USR1@N` without `B:` signals every process of the step, workers included."""
    proc = launch(tmp_path, str(REPO / "examples" / "ddp_minimal.py"), "--steps", "400")
    _wait_for(tmp_path / "r" / "aggregate.state")
    children = subprocess.run(["pgrep", "-g", str(os.getpgid(proc.pid)), "-f", "ddp_minimal"],
                              capture_output=True, text=True).stdout.split()
    group = [int(p) for p in children]
    for pid in [proc.pid] + group:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    code, out, err = finish(proc)
    assert code == 0, err
    assert "received SIGUSR1" in err
    assert summary(tmp_path)["run"]["status"] == "completed"


def test_usr1_to_the_launcher_alone_reaches_the_workers_handler(tmp_path):
    """Under proctrack/cgroup, Slurm's `--signal=USR1@N` signals only the step's tasks (the
    launchers), not the workers torchrun starts in sessions of their own: the launcher passes it
    on. A script with a SIGUSR1 handler saves and ends at the next step boundary (both ranks, by
    an all_reduce of the flag), the run completes, and its ledger says the warning came and a
    checkpoint was saved after it."""
    truth = tmp_path / "truth"
    truth.mkdir()
    script = str(REPO / "tests" / "slurm" / "goodput_train.py")
    proc = launch(tmp_path, script, "--steps", "100000", "--step-ms", "20", "--ckpt-every", "100000",
                  "--ckpt-dir", str(tmp_path / "ckpt"), "--usr1", "--give-step",
                  env_extra={"GOODPUT_TRUTH": str(truth)})
    try:
        deadline = time.monotonic() + 120
        while not all((truth / f"rank{r}-a0.jsonl").exists() and '"step"' in (truth / f"rank{r}-a0.jsonl").read_text()
                      for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        sent = time.time()
        os.kill(proc.pid, signal.SIGUSR1)          # the launcher only, as Slurm does
        code, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    assert "received SIGUSR1" in err and "passed on to the workers" in err
    for r in (0, 1):
        recs = [json.loads(ln) for ln in (truth / f"rank{r}-a0.jsonl").read_text().splitlines()]
        assert [x for x in recs if x["k"] == "usr1"] and [x for x in recs if x["k"] == "ckpt"], (r, recs[-3:])
    data = summary(tmp_path)
    assert data["run"]["status"] == "completed"
    e = data["goodput"]["attempts"][-1]["ending"]
    assert e["warning"] == "SIGUSR1" and abs(e["warning_at"] - sent) < 1.0 and e["saved_after_warning"] is True, e
    assert e["scheduled_end"] is None and "the cluster did not say when the time limit was" in e["words"], e
