"""Values at the bounds, and SIGTERM in every phase of a launch: real ``traceml run`` processes.

At the node limit (65,536 nodes) node 0 must end a run whose other nodes never come, promptly,
with a bounded log, bounded memory and a summary (issue 15: --nnodes=200000 used to hang at full CPU
for 15 minutes in a nodes x ranks loop, ignore SIGTERM and write no summary). SIGTERM must end the
launcher promptly whatever it is doing: the pre-flight (torch import in the torchrun process),
the wait for node 0's aggregator, training.
"""

from __future__ import annotations

import signal
import socket
import sys
import time

import pytest
from harness import Launch, children, cmdline, free_ports

from traceml_core import limits


def _own_address() -> str:
    """A non-loopback address of this host (the multi-node checks refuse loopback masters)."""
    for cand in (socket.gethostname(),):
        try:
            ip = socket.gethostbyname(cand)
        except OSError:
            continue
        if not ip.startswith("127."):
            return ip
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 9))   # no packet is sent: only picks the outgoing interface
        ip = s.getsockname()[0]
    except OSError:
        ip = ""
    finally:
        s.close()
    if not ip or ip.startswith("127."):
        pytest.skip("no non-loopback address here (run the tests inside the dev cluster)")
    return ip


def _wait_for_line(launch: Launch, needle: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in launch.stderr_now():
            return
        assert launch.proc.poll() is None, launch.stderr_now()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} in the launcher's log:\n{launch.stderr_now()[-3000:]}")


#: runs the launch and writes the largest peak RSS of its process tree (the launcher and every
#: process it waited for). Not this pytest's own RUSAGE_CHILDREN: that is the largest child of the
#: whole session, so an earlier test's big child failed this one (CI: 1,180,324 KiB)
_PEAK_RSS = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
             "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
             "sys.exit(rc)")


def test_the_node_limit_ends_promptly_with_a_bounded_log_memory_and_a_summary(tmp_path):
    n = limits.NODES.hi
    peak_file = tmp_path / "peak_kib"
    launch = Launch(tmp_path, ["--steps", "5"], nproc=1,
                    flags=[f"--nnodes={n}", "--node-rank=0", f"--master-addr={_own_address()}",
                           "--aggregator-wait=3"],
                    prefix=[sys.executable, "-c", _PEAK_RSS, str(peak_file)])
    run = launch.wait(180)
    assert run.code != 0
    assert len(run.err) < 64 * 1024, f"{len(run.err)} bytes of log"
    assert f"{n - 2:,} more" in run.err or f"{n - 9:,} more" in run.err, run.err[-2000:]
    data = run.summary()
    assert data["topology"]["nnodes"] == n and sum(not x["joined"] for x in data["topology"]["nodes"]) == n - 1
    text = (run.run_dir / "final_summary.txt").read_text()
    assert len(text) < 64 * 1024 and "never joined" in text
    # every process of the launch (launcher, aggregator, torchrun, worker) stayed under 1 GiB
    peak_kib = int(peak_file.read_text())
    assert peak_kib < 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert run.wall < 120, run.wall


def test_past_the_world_size_limit_is_refused_before_anything_starts(tmp_path):
    nproc = limits.PROCS_PER_NODE.hi
    nodes = limits.WORLD_SIZE.hi // nproc + 1
    run = Launch(tmp_path, ["--steps", "5"], nproc=nproc,
                 flags=[f"--nnodes={nodes}", "--node-rank=0", f"--master-addr={_own_address()}"]).wait(60)
    assert run.code == 2 and run.err.count("\n") == 1 and "ranks, more than TraceML supports" in run.err
    assert not (run.logs / run.run_name).exists()


def test_sigterm_during_the_preflight_ends_the_launch_at_once(tmp_path):
    launch = Launch(tmp_path, ["--steps", "5"])
    deadline = time.monotonic() + 30    # the torchrun process has started: it is importing torch
    while not any("launcher.agent" in cmdline(c) for c in children(launch.pid)):
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()
        time.sleep(0.02)
    t0 = time.monotonic()
    launch.proc.send_signal(signal.SIGTERM)
    run = launch.wait(60)
    assert run.code == 143, run.err[-2000:]
    assert time.monotonic() - t0 < 20


def test_sigterm_while_waiting_for_node_0_ends_the_wait_at_once(tmp_path):
    """Node 1 waits for node 0's aggregator (here: nothing listens) for up to an hour; SIGTERM ends
    that wait within a couple of seconds, and the launcher exits 143."""
    (port,) = free_ports(1)
    launch = Launch(tmp_path, ["--steps", "5"], aggregator_port=port,
                    flags=["--nnodes=2", "--node-rank=1", f"--master-addr={_own_address()}",
                           "--aggregator-wait=3600"])
    _wait_for_line(launch, "joining the aggregator")
    time.sleep(1.0)
    t0 = time.monotonic()
    launch.proc.send_signal(signal.SIGTERM)
    run = launch.wait(60)
    took = time.monotonic() - t0
    assert run.code == 143, run.err[-2000:]
    assert took < 15, took
    assert "stopped waiting for the aggregator: interrupted" in run.err


def test_ctrl_c_exits_130_with_an_interrupted_summary(tmp_path):
    """Ctrl-C (SIGINT to the launcher) exits 130, the shell's convention, and the summary says so."""
    launch = Launch(tmp_path, ["--steps", "100000", "--step-ms", "20"])
    deadline = time.monotonic() + 120
    while not (launch.progress_dir / "rank0.txt").exists() or "step" not in (launch.progress_dir / "rank0.txt").read_text():
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()[-2000:]
        time.sleep(0.1)
    launch.proc.send_signal(signal.SIGINT)
    run = launch.wait(90)
    assert run.code == 130, run.err[-2000:]
    data = run.summary()
    assert data["run"]["status"] == "interrupted" and "interrupted by SIGINT (Ctrl-C)" in data["run"]["reason"]


def test_sigterm_before_the_first_step_is_not_blamed_on_the_script(tmp_path):
    """A job stopped while its ranks are still starting (scancel, a short time limit) has no step
    to judge: the summary says it was interrupted before the first step, never that the script
    does not call traceml, and its advice is not to add trace_step. (Seen: "NO-STEPS: no rank
    calls traceml ... add two lines" for a script that does.) The control, a script that never
    enters trace_step and completes, keeps that verdict (tests/zerocode/test_inferred.py)."""
    launch = Launch(tmp_path, ["--steps", "5", "--pause-at", "0", "--pause-s", "600"])
    deadline = time.monotonic() + 180
    files = [launch.progress_dir / f"rank{r}.txt" for r in (0, 1)]
    # both ranks past traceml.init() and DDP's set-up, waiting before their first step
    while not all(f.exists() and "pause 0" in f.read_text() for f in files):
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()[-3000:]
        time.sleep(0.1)
    launch.proc.send_signal(signal.SIGTERM)
    run = launch.wait(90)
    assert run.code == 143, run.err[-2000:]
    data = run.summary()
    assert data["run"]["status"] == "interrupted"
    v = data["verdict"]
    text = f"{v['why']} {v['next_step']}"
    assert "calls traceml" not in text and "add two lines" not in text, text
    assert v["kind"] == "no_steps" and "interrupted before any of its 2 joined rank(s) finished a first step" in v["why"], v
