"""No worker outlives the run, whatever dies: torchrun, the launcher, or both, by SIGKILL.

Real ``traceml run`` with real torchrun and gloo DDP workers (faulty_train.py records each rank's
pid independently of TraceML). torchrun starts every worker in its own session, so before the
launcher owned its workers, SIGKILLing torchrun left both workers training (issue 15).
See launcher/ownership.py for the three layers these tests exercise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import Launch, Progress, children, cmdline, pid_alive

from traceml_core.launcher import ownership

LONG = ["--steps", "100000", "--step-ms", "20"]   # trains until something kills it


def _stepping(launch: Launch, nproc: int = 2, timeout: float = 120.0) -> list[int]:
    """The workers' pids, once every rank has done a step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = Progress.read(launch.progress_dir)
        if len(p.pids) == nproc and all(p.done(r) > 0 for r in p.pids):
            return list(p.pids.values())
        assert launch.proc.poll() is None, launch.stderr_now()[-3000:]
        time.sleep(0.1)
    raise AssertionError("the workers did not start stepping:\n" + launch.stderr_now()[-3000:])


def _torchrun(launcher: int) -> int:
    for c in children(launcher):
        if "traceml_core.launcher.agent" in cmdline(c):
            return c
    raise AssertionError(f"no torchrun process under the launcher {launcher}")


def _gone(pids: list[int], timeout: float) -> list[int]:
    """Waits until every pid is gone (or a zombie); returns those still running at the bound."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def _kill_leftovers(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigkill_torchrun_takes_the_workers_with_it_and_the_summary_is_written(tmp_path):
    launch = Launch(tmp_path, LONG)
    workers = _stepping(launch)
    os.kill(_torchrun(launch.pid), signal.SIGKILL)
    run = launch.wait(90)
    left = _gone(workers, 10)
    _kill_leftovers(left)
    assert not left, f"workers outlived torchrun: {[(p, cmdline(p)) for p in left]}"
    assert run.code == 137, run.err[-2000:]
    data = run.summary()
    assert data["run"]["status"] != "completed"
    assert "stopping" not in run.err or "left behind" in run.err


def test_sigkill_the_launcher_stops_torchrun_and_every_worker(tmp_path):
    launch = Launch(tmp_path, LONG)
    workers = _stepping(launch)
    torchrun = _torchrun(launch.pid)
    os.kill(launch.pid, signal.SIGKILL)
    launch.proc.wait(10)
    # torchrun gets SIGTERM from the kernel and stops its workers as on any SIGTERM
    left = _gone([torchrun] + workers, 60)
    _kill_leftovers(left)
    assert not left, f"outlived the launcher: {[(p, cmdline(p)) for p in left]}"


def test_sigkill_the_launcher_and_torchrun_together_still_stops_every_worker(tmp_path):
    launch = Launch(tmp_path, LONG)
    workers = _stepping(launch)
    torchrun = _torchrun(launch.pid)
    os.kill(torchrun, signal.SIGKILL)   # torchrun first, so nothing is left to stop the workers
    os.kill(launch.pid, signal.SIGKILL)
    launch.proc.wait(10)
    left = _gone(workers, 10)           # each worker's own parent-death signal
    _kill_leftovers(left)
    assert not left, f"workers outlived torchrun and the launcher: {[(p, cmdline(p)) for p in left]}"


ADOPTER = r"""
import os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from traceml_core.launcher import ownership
assert ownership.become_subreaper()
# a middle process (torchrun's role) starts a worker in its own session, then dies by SIGKILL
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time;"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True,"
    " env={'MARKER': '1', 'PATH': '/usr/bin:/bin'});"
    "print(w.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
worker = int(middle.stdout.readline())
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])   # ours, not a worker
os.kill(middle.pid, signal.SIGKILL)
middle.wait()
deadline = time.monotonic() + 10
while worker not in ownership.children() and time.monotonic() < deadline:
    time.sleep(0.05)
adopted = worker in ownership.children()
stopped = ownership.stop_adopted("MARKER", grace=2.0)
print("adopted", adopted, "stopped", stopped == [worker], "other-alive", other.poll() is None, flush=True)
other.kill()
"""


def test_the_launcher_adopts_and_stops_workers_whose_torchrun_died(tmp_path):
    """Layer 3 alone (what holds on a torch the agent cannot patch): a subreaper adopts the orphaned
    worker, stops it, and leaves its other children alone."""
    src = str(Path(ownership.__file__).parents[2])
    out = subprocess.run([sys.executable, "-c", ADOPTER, src], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["adopted", "True", "stopped", "True", "other-alive", "True"], out
