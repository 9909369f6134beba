"""``--export wandb,mlflow,prometheus``: a real run exports while it trains, and each destination is
read back with its own library: W&B's offline run with ``wandb leet inspect`` (W&B's reader of its
transaction log), MLflow's local file store with ``MlflowClient``, the Prometheus textfile with
``prometheus_client``'s parser (the format node_exporter reads).

And the bounds, with the real exporters: a destination that hangs (an MLflow "server" that accepts
and never answers) never blocks the aggregator's offers; its batches are dropped and counted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

for lib in ("wandb", "mlflow", "prometheus_client"):
    pytest.importorskip(lib)

#: one rank, ~40 ms a step for at least 200 steps (~8 s), and on until points have gone out live:
#: W&B open, MLflow's store holding points of rank 0 (written at an export tick, not at the end),
#: and 5 s more, in which W&B writes the same batch and after which the run ends. A fixed length
#: of training is not enough on a loaded machine: W&B's start can take 10 s and more, and the
#: aggregator stretches the next export interval to 20x a batch's build time (a build takes
#: ~0.1-0.9 s under load 11; the first, cold one is no longer paced). The wait is bounded (180 s): exports that
#: only happen at the end train that long and then fail the "written during the run" checks.
TRAIN = '''
import glob, time, torch
import traceml_core as traceml
traceml.init()

def live_points_out():
    if not glob.glob("logs/live/wandb/offline-run-*/run-*.wandb"):   # W&B's transaction log
        return False
    # MLflow's file store: a line per point written
    return any(open(f).read().count("\\n") >= 2
               for f in glob.glob("logs/live/mlruns/*/*/metrics/rank_0000/step_ms"))

model = torch.nn.Linear(8, 1)
step, out_since, bound = 0, None, time.monotonic() + 180
while time.monotonic() < bound:
    if out_since is None and live_points_out():
        out_since = time.monotonic()
    if step >= 200 and out_since is not None and time.monotonic() - out_since >= 5.0:
        break
    with traceml.trace_step(model):
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.04)
    step += 1
'''


def run_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TRACEML_", "WANDB_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", WANDB_MODE="offline",
               WANDB_SILENT="true", **extra)
    return env


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "train.py").write_text(TRAIN)
    started = time.time()
    p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "run", "--nproc-per-node=1",
                        f"--logs-dir={tmp / 'logs'}", "--run-name=live",
                        "--export=wandb,mlflow,prometheus", "--export-interval=1", "train.py"],
                       cwd=tmp, env=run_env(tmp), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    run_dir = tmp / "logs" / "live"
    summary = json.loads((run_dir / "final_summary.json").read_text())
    return {"dir": run_dir, "summary": summary, "stderr": p.stderr, "started": started, "cwd": tmp,
            "report": json.loads((run_dir / "exports.json").read_text())["exports"]}


def ended_at(summary: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(summary["run"]["ended_at"]).timestamp()


def last_steps(run_dir: Path) -> dict[str, int]:
    """The last step bucket of each rank, as the end-of-run series (steps.jsonl's rows) says."""
    from traceml_core.report.export import rank_rows

    summary = json.loads((run_dir / "final_summary.json").read_text())
    out: dict[str, int] = {}
    for row in rank_rows(summary):
        if row["kind"] == "rank" and row["step_ms"] is not None:
            out[f"rank_{row['rank']:04d}"] = row["step_last"]
    return out


def processes_in(cwd: Path) -> list[str]:
    """The processes whose working directory is ``cwd`` (the run's: the aggregator's children
    inherit it), as "pid command"."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "cwd") == str(cwd):
                    out.append(f"{d.name} {(d / 'cmdline').read_bytes().replace(bytes(1), b' ').decode()[:120]}")
            except OSError:
                pass
    return out


def test_no_helper_process_outlives_the_run(exported):
    """W&B's wandb-core service outlived a run by 55 s: after `traceml run` returns, nothing the
    run started is left (within a few seconds: a process may still be exiting)."""
    deadline = time.monotonic() + 10
    while processes_in(exported["cwd"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_in(exported["cwd"])


def test_every_destination_reports_what_it_wrote_and_dropped(exported):
    by_kind = {e["kind"]: e for e in exported["report"]}
    assert sorted(by_kind) == ["mlflow", "prometheus", "wandb"]
    for kind, e in by_kind.items():
        assert e["error"] is None and e["finished"] and e["points_queued"] == 0, e
        assert e["batches"] >= 2, e   # live batches and the final one
        line = f"export {kind}: {e['points_written']:,} points written"
        if e["points_dropped"]:  # a destination slower than the run (W&B starting on a busy machine)
            line += f" to {e['target']}; {e['points_dropped']:,} dropped"
        assert line in exported["stderr"], (line, exported["stderr"][-2000:])


def test_wandb_offline_run_read_back_with_wandbs_reader(exported):
    wandb_dir = exported["dir"] / "wandb"
    run = next(wandb_dir.glob("offline-run-*"))
    cli = [str(BIN / "wandb"), "leet", "inspect", "--json", str(run)]
    records = [json.loads(line) for line in subprocess.run(cli, capture_output=True, text=True,
                                                           timeout=120, check=True).stdout.splitlines()]
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    steps = [h["step"] for h in history if "rank_0000/step_ms" in h]
    assert steps == sorted(steps) and len(steps) >= 3, steps
    assert steps[-1] == last_steps(exported["dir"])["rank_0000"]     # nothing of the end missing
    # written during the run: points went out before training ended
    ended = ended_at(exported["summary"])
    early = [h for h in history if "rank_0000/step_ms" in h and h["_timestamp"] < ended - 1.0]
    assert len(early) >= 2, (len(early), len(history))
    (header,) = [r["run"] for r in records if r.get("type") == "run"]
    assert header["display_name"] == "live" and header["config"]["update"]["world_size"] == 1
    summary: dict = {}
    for r in records:
        if r.get("type") == "summary":
            summary.update(r["summary"].get("update") or {})
    assert summary["verdict/kind"] == exported["summary"]["verdict"]["kind"]
    assert summary["status"] == "completed"
    assert [r["exit"].get("exit_code", 0) for r in records if r.get("type") == "exit"] == [0]
    arts = [r for r in records if r.get("type") == "artifact"]
    assert arts and arts[-1]["artifact"]["type"] == "traceml-report", arts[-1:]


def test_mlflow_file_store_read_back_with_mlflows_client(exported):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(exported["dir"] / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("traceml")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "live" and run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "1"
    assert run.data.tags["traceml.verdict"] == exported["summary"]["verdict"]["kind"]
    history = client.get_metric_history(run.info.run_id, "rank_0000/step_ms")
    steps = [m.step for m in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps) >= 3, steps
    assert steps[-1] == last_steps(exported["dir"])["rank_0000"]
    ended_ms = 1000 * ended_at(exported["summary"])
    assert sum(m.timestamp < ended_ms - 1000 for m in history) >= 2   # written during the run
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"final_summary.json", "final_summary.html", "final_summary.txt"} <= names, names


def test_prometheus_textfile_parses_with_prometheus_client(exported):
    from prometheus_client.parser import text_string_to_metric_families

    (path,) = list((exported["dir"] / "prometheus").glob("traceml_live_*.prom"))
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    step = families["traceml_step_seconds"].samples
    assert len(step) == 1 and step[0].labels["rank"] == "0" and step[0].labels["run"] == "live"
    assert 0.02 < step[0].value < 5.0, step
    verdict = families["traceml_verdict_info"].samples[0]
    assert verdict.labels["kind"] == exported["summary"]["verdict"]["kind"] and verdict.value == 1
    assert families["traceml_run_info"].samples[0].labels["status"] == "completed"
    assert {s.labels["phase"] for s in families["traceml_phase_seconds"].samples} >= {"forward", "backward"}
    assert not list(path.parent.glob("*.tmp*")), "a temporary file was left behind"


# --- the bounds, with a real exporter against a destination that never answers -------------------
def test_a_destination_that_hangs_never_blocks_and_its_points_are_counted(tmp_path):
    """An MLflow "server" that accepts and never answers: the offers never wait, and at the end
    the destination is named with what it was stuck in and what was still queued (it was
    reported as error: null and 0 dropped with batches queued)."""
    from traceml_core.exporters.batch import Batch, FinalFiles, Point, RunIdentity
    from traceml_core.exporters.hub import QUEUE_BATCHES, ExportHub
    from traceml_core.exporters.live import makers

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_say_nothing() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept_and_say_nothing, daemon=True)
    t.start()
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "300"
    run = RunIdentity("hang", None, time.time(), 1, 1, ("h",), "train.py", str(tmp_path))
    # the URI is the output's setting (--mlflow-tracking-uri), handed over: no environment read
    hub = ExportHub(makers(["mlflow"], {"mlflow_tracking_uri": f"http://127.0.0.1:{server.getsockname()[1]}"}), run)
    try:
        slowest = 0.0
        for i in range(QUEUE_BATCHES + 6):
            batch = Batch(time.time(), (Point("rank_0000", "rank", float(i), {"step_ms": 1.0}, rank=0),))
            t0 = time.perf_counter()
            hub.offer(batch)
            slowest = max(slowest, time.perf_counter() - t0)
        assert slowest < 0.5, slowest   # the aggregator's loop never waits for a destination (which hangs 300 s)
        (stats,) = hub.finish(Batch(time.time(), final=FinalFiles("completed")), deadline_s=1.0)
        assert not stats.finished and stats.points_written == 0
        # all but the batches waiting in its queue were dropped and counted, and the final one
        # took the place of one of those; what waited is counted as still queued
        assert stats.batches_dropped >= 7 and stats.points_dropped == stats.batches_dropped, stats
        assert stats.points_queued == QUEUE_BATCHES - 1 and stats.batches_queued == QUEUE_BATCHES, stats
        assert stats.stuck_in and stats.stuck_in.startswith("opening"), stats
        assert stats.error and "no answer" in stats.error and "opening" in stats.error, stats
        line = stats.line()
        assert "dropped" in line and f"{QUEUE_BATCHES - 1} still queued" in line and "error: no answer" in line
    finally:
        os.environ.pop("MLFLOW_HTTP_REQUEST_TIMEOUT", None)
        stop.set()
        for c in held:
            c.close()
        server.close()


# --- one run across attempts --------------------------------------------------------------------
#: one attempt of a resumable script: it goes on from the global step the attempt before saved
#: (a checkpoint file), tells TraceML its global step, and trains 30 more steps
ATTEMPT = '''
import os, time, torch
import traceml_core as traceml
traceml.init()
start = int(open("ckpt").read()) if os.path.exists("ckpt") else 0
model = torch.nn.Linear(8, 1)
for step in range(start, start + 30):
    with traceml.trace_step(model, step=step):
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.03)
open("ckpt", "w").write(str(start + 30))
'''


def test_two_attempts_are_one_wandb_run_and_one_mlflow_run(tmp_path):
    """The second attempt of a run (what a requeue is: the same run name and run directory) goes
    on in the same W&B run and the same MLflow run, read back with their own readers, with the
    run's global steps (30-59 after 0-29) and the attempt as a dimension."""
    (tmp_path / "train.py").write_text(ATTEMPT)
    for attempt in (0, 1):
        p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "run", "--nproc-per-node=1",
                            f"--logs-dir={tmp_path / 'logs'}", "--run-name=again", "--export=wandb,mlflow",
                            "--export-interval=1", "train.py"],
                           cwd=tmp_path, env=run_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-4000:]
    run_dir = tmp_path / "logs" / "again"
    assert (run_dir / "attempt-0").is_dir()
    # MLflow: one run in the store, with both attempts' points at the global steps
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("traceml").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["traceml.attempt"] == "1", run.data.tags
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rank_0000/step_ms")]
    # a point is a bucket's last step: attempt 0's end at step <= 29 (+ its last bucket's
    # width), attempt 1's reach 59 (without the ledger's offset they would end near 29 again)
    assert min(steps) <= 29 and 59 <= max(steps) <= 120 and len(set(steps)) == len(steps), sorted(steps)
    # W&B: two offline parts (one per attempt) of one run id, the second's rows at steps >= 30
    parts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(parts) == 2, parts
    ids, rows = set(), []
    for part in parts:
        cli = [str(BIN / "wandb"), "leet", "inspect", "--json", str(part)]
        records = [json.loads(line) for line in subprocess.run(cli, capture_output=True, text=True,
                                                               timeout=120, check=True).stdout.splitlines()]
        ids |= {r["run"]["run_id"] for r in records if r.get("type") == "run"}
        rows.append([r["history"]["item"] for r in records if r.get("type") == "history"
                     and "rank_0000/step_ms" in r["history"]["item"]])
    assert len(ids) == 1, ids
    assert {h["attempt"] for h in rows[0]} == {0} and {h["attempt"] for h in rows[1]} == {1}
    assert max(h["step"] for h in rows[0]) < min(h["step"] for h in rows[1]), rows
    assert max(h["step"] for h in rows[1]) >= 59, rows[1][-1:]


# --- what the destinations' libraries start does not outlive their end ---------------------------
def _children_named(name: str) -> list[int]:
    from traceml_core.exporters.hub import descendants

    out = []
    for pid in descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                out.append(pid)
        except OSError:
            pass
    return out


def test_wandb_core_is_gone_when_the_hub_has_finished(tmp_path, monkeypatch):
    """W&B's wandb-core service outlived a run by 55 s: it lives as long as the process that
    started it (node 0's aggregator, which goes on after the exports' end). Here that process
    is this one, which goes on too: when the hub's finish returns, no wandb-core is left."""
    from traceml_core.exporters.batch import Batch, FinalFiles, Point, RunIdentity
    from traceml_core.exporters.hub import ExportHub
    from traceml_core.exporters.live import makers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunIdentity("core", None, time.time(), 1, 1, ("h",), "train.py", str(tmp_path))
    hub = ExportHub(makers(["wandb"], {}), run)
    hub.offer(Batch(time.time(), (Point("rank_0000", "rank", 1.0, {"step_ms": 1.0}, rank=0),)))
    (stats,) = hub.finish(Batch(time.time(), final=FinalFiles("completed")), deadline_s=60.0)
    assert stats.finished and stats.error is None, stats
    assert not _children_named("wandb-core")


def test_a_hung_destination_s_helper_process_is_stopped(tmp_path):
    """A destination stuck in its library (here: its open never returns) with a helper process
    running (a real child process, as wandb-core is): at the deadline the hub stops the helper
    and says so, and the destination is named with what it was stuck in."""
    from traceml_core.exporters.batch import Batch, FinalFiles, RunIdentity
    from traceml_core.exporters.hub import ExportHub

    release = threading.Event()

    class StuckWithAHelper:
        target = ""

        def open(self, run):
            self.helper = subprocess.Popen(["sleep", "300"])
            release.wait(120)

        def write(self, batch):
            pass

        def close(self, final):
            pass

    run = RunIdentity("stuck", None, time.time(), 1, 1, ("h",), "train.py", str(tmp_path))
    hub = ExportHub({"stuck": StuckWithAHelper}, run)
    deadline = time.monotonic() + 60
    while not _children_named("sleep") and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = _children_named("sleep")
    try:
        (stats,) = hub.finish(Batch(time.time(), final=FinalFiles("completed")), deadline_s=0.5)
        assert stats.stuck_in and stats.stuck_in.startswith("opening") and "no answer" in (stats.error or "")
        assert hub.helpers_stopped == [f"{pid} sleep"], hub.helpers_stopped
        assert not _children_named("sleep")
    finally:
        release.set()
