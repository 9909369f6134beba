"""The hang autopsy's two ends without the network in between: real gloo DDP ranks that hang
(faulty_train.py under plain torchrun, the SDK set up as the launcher sets it up), the node-side
collector making each rank dump every thread's stack from inside a signal handler, and the
analysis reading where each rank is stuck.

Three hangs: rank 1 stuck in its own code while rank 0 waits for it in DDP's gradient all-reduce
(rank 1 "never arrived"); rank 1 in an all_reduce that rank 0 never enters (mismatched
collectives); rank 1 waiting for a batch its DataLoader worker never delivers (a deadlocked
loader: it never arrived, waiting for a batch). The full path through `traceml run` and the aggregator is tested in
test_hang_autopsy.py and, across two Slurm nodes, in tests/slurm/test_headline_slurm.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import SCRIPT, base_env, free_ports, pid_alive

from traceml_core.launcher.stacks import COLLECT_S, StackCollector
from traceml_core.report import hang
from traceml_core.runinfo import RunInfo


def _hung(tmp: Path, fault: str, collector: StackCollector):
    """Start a 2-rank run with ``fault`` on rank 1 at step 20; return (proc, pids) once both
    ranks have reached step 20 (rank 0 past step 19, rank 1 at or on its way to its fault)."""
    (tmp / "progress").mkdir()
    info = RunInfo(run_name="x", job_id=None, nnodes=1, node_rank=0, nproc_per_node=2,
                   aggregator_host="127.0.0.1", aggregator_port=free_ports(1)[0], token="t" * 32,
                   connect_wait=0.0, mode="summary", logs_dir=str(tmp), stack_dir=collector.path)
    env = base_env(tmp / "progress", TRACEML_RUN_INFO=info.to_env())
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                             f"--master-port={free_ports(1)[0]}", SCRIPT, "--steps", "200",
                             "--fault", fault, "--fault-rank", "1", "--fault-step", "20",
                             "--settle", "0"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        steps = {}
        pids = {}
        for r in (0, 1):
            f = tmp / "progress" / f"rank{r}.txt"
            if f.exists():
                lines = f.read_text().splitlines()
                steps[r] = sum(1 for ln in lines if ln.startswith("step"))
                pids[r] = int(lines[0].split()[1]) if lines and lines[0].startswith("pid") else None
        if steps.get(1, 0) >= 20 and steps.get(0, 0) >= 20 and all(pids.values()) and len(pids) == 2:
            return proc, pids
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the ranks never reached step 20")


def _stop(proc, pids):
    for pid in list(pids.values()) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _report(collector, pids):
    t0 = time.monotonic()
    dumps = collector.collect(pids)
    took = time.monotonic() - t0
    rows = [{"rank": r, "node": 0, "host": "h", "dump": dumps[r], "snapshot": None, "step": None}
            for r in sorted(dumps)]
    return hang.build(rows, world=2, silent_s=61, threshold_s=60, threshold_source="test",
                      at=time.time()), dumps, took


DDP = ("ddp_backward", "ddp_bucket")
#: where each rank is once the hang has set in: {fault: {rank: (state, collectives or None)}}
SETTLED = {"hang": {0: ("collective", DDP), 1: ("running", None)},
           "hang-in-collective": {0: ("collective", DDP), 1: ("collective", ("all_reduce",))},
           "hang-in-loader": {0: ("collective", DDP), 1: ("dataloader", None)}}


def _settled(report, fault) -> bool:
    ranks = {a["rank"]: a for a in report["ranks"]}
    return ranks.keys() == SETTLED[fault].keys() and all(
        ranks[r]["state"] == state and (ops is None or ranks[r].get("collective") in ops)
        for r, (state, ops) in SETTLED[fault].items())


def _report_once_hung(collector, pids, fault, bound_s: float = 30.0):
    """Collect until both ranks are where the hang leaves them (rank 0 in the next collective,
    rank 1 at its fault): step 20's record is written before they get there, and on a loaded
    machine the way can take a while. Returns the last (report, dumps), the slowest collection's
    seconds and the number of collections."""
    deadline = time.monotonic() + bound_s
    slowest, n = 0.0, 0
    while True:
        report, dumps, took = _report(collector, pids)
        slowest, n = max(slowest, took), n + 1
        if _settled(report, fault) or time.monotonic() > deadline:
            return report, dumps, slowest, n
        time.sleep(0.5)


@pytest.mark.parametrize("fault", ["hang", "hang-in-collective", "hang-in-loader"])
def test_each_rank_dumps_and_the_report_says_where(tmp_path, fault):
    collector = StackCollector()
    proc, pids = _hung(tmp_path, fault, collector)
    try:
        report, dumps, took, tries = _report_once_hung(collector, pids, fault)
    finally:
        _stop(proc, pids)
        collector.close()
    print(f"{fault}: stacks of 2 ranks collected in {took:.2f} s (the slowest of {tries} collections)")
    # the collector waits COLLECT_S at most for a rank's dump; 2 s more for a loaded machine
    assert took < COLLECT_S + 2.0, took
    assert all(d["ok"] for d in dumps.values()), dumps
    ranks = {a["rank"]: a for a in report["ranks"]}
    assert ranks[0]["state"] == "collective" and ranks[0]["collective"] in ("ddp_backward", "ddp_bucket")
    assert ranks[0]["where"].startswith("faulty_train.py:")
    lines = hang.render(report)
    if fault == "hang":
        # rank 1 sleeps in its own code: it never arrived at the all-reduce rank 0 waits in
        assert ranks[1]["state"] == "running" and ranks[1]["where"].startswith("faulty_train.py:")
        assert report["culprits"] == [1]
        assert "rank 1 (node 0, h) never arrived at the collective the others wait in" in report["finding"]
        assert any("<- never arrived" in ln and ln.lstrip().startswith("rank 1") for ln in lines), lines
    elif fault == "hang-in-loader":
        # rank 1's DataLoader never delivers the batch: it never arrived, waiting for the batch
        assert ranks[1]["state"] == "dataloader" and ranks[1]["where"].startswith("faulty_train.py:"), ranks[1]
        assert report["culprits"] == [1]
        assert ("rank 1 (node 0, h) never arrived at the collective the others wait in "
                "(the gradient all-reduce (DDP backward)): it is waiting for a DataLoader batch"
                in report["finding"]), report["finding"]
    else:
        # rank 1 waits in an all_reduce rank 0 never enters: mismatched, nobody singled out of two
        assert ranks[1]["state"] == "collective" and ranks[1]["collective"] == "all_reduce"
        assert "different collectives" in report["finding"] and report["culprits"] == []
    assert all(len(d["text"]) > 0 and "most recent call first" in d["text"] for d in dumps.values())


def test_a_rank_that_never_registered_or_is_gone_is_reported(tmp_path):
    collector = StackCollector()
    try:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        out = collector.collect({0: sleeper.pid, 1: 2 ** 22 + 7})
        sleeper.kill()
        sleeper.wait()
    finally:
        collector.close()
    assert not out[0]["ok"] and "registered no stack dump" in out[0]["error"]
    assert not out[1]["ok"]


def test_the_task_layout_agrees_on_a_node_directory_without_talking(tmp_path, monkeypatch):
    """One srun task per GPU: the rank is started by Slurm, not by the relay's task, so both sides
    compute the node's stack directory (launcher/stacks.node_dir) from the run and the node. A
    rank that registered there (its own task made the directory) is dumped by a collector built
    separately in another task; another user's directory planted at that path is refused (no
    dumps, training goes on) rather than used."""
    from traceml_core.launcher.stacks import node_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = node_dir("job-train-42", 1)
    assert path == node_dir("job-train-42", 1) and path != node_dir("job-train-42", 0)
    ranks_task = StackCollector(path)            # the rank's own task (local rank 1)
    # 'ready' from inside the function: a dump taken right after it still has the frame (printed
    # before the call, a loaded machine's dump caught the module level between the two)
    code = ("import sys, time; from traceml_core.sdk import stackdump; "
            "assert stackdump.install(sys.argv[1], 3)\n"
            "def stuck_in_my_code():\n    print('ready', flush=True)\n    time.sleep(60)\nstuck_in_my_code()")
    rank = subprocess.Popen([sys.executable, "-c", code, ranks_task.path], stdout=subprocess.PIPE, text=True)
    relay_task = StackCollector(path)            # local rank 0's task, which runs the relay
    try:
        assert rank.stdout.readline().strip() == "ready"
        out = relay_task.collect({3: rank.pid})
    finally:
        rank.kill()
        rank.wait()
        relay_task.close()
    assert out[3]["ok"] and "stuck_in_my_code" in out[3]["text"], out
    assert not path.exists(), "the relay's task removes the node's directory at the end"
    # a directory that is not ours (here: a symlink planted at the path) is never used
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path.symlink_to(elsewhere)
    assert StackCollector(path).dir is None
