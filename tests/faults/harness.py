"""Shared pieces of the single-node fault tests: run ``traceml run`` (or plain torchrun) on
``faulty_train.py`` with real processes on loopback, and read what training and TraceML reported.

Every run uses ports picked free for it (other test runs may share this machine), its own logs
dir and progress dir, and a hard timeout: a run that outlives it is killed (its whole process
group) and the test fails, so no case can hang the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from testports import free_ports  # noqa: F401 - the fault tests import it from here

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).with_name("faulty_train.py"))
PY = sys.executable



def base_env(progress: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    env["FAULT_PROGRESS_DIR"] = str(progress)
    for k in [k for k in env if k.startswith(("TRACEML_", "SLURM_"))]:
        del env[k]
    env.update(extra)
    return env


@dataclass
class Progress:
    """What each rank of faulty_train.py wrote about itself (independent of TraceML)."""

    pids: dict[int, int] = field(default_factory=dict)
    steps: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)
    result: Optional[str] = None
    #: when each faulty rank's fault began (wall time): the truth of a hang's start
    fault_at: dict[int, float] = field(default_factory=dict)

    @classmethod
    def read(cls, d: Path) -> "Progress":
        p = cls()
        for f in sorted(d.glob("rank*.txt")):
            rank = int(f.stem[4:])
            p.steps[rank] = []
            for line in f.read_text().splitlines():
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == "pid":
                    p.pids[rank] = int(parts[1])
                elif parts[0] == "step" and len(parts) == 3:
                    p.steps[rank].append((int(parts[1]), float(parts[2])))
                elif parts[0] == "sent":
                    p.sent[rank] = int(parts[1])
                elif parts[0] == "result":
                    p.result = parts[1]
                elif parts[0] == "fault_at":
                    p.fault_at[rank] = float(parts[1])
        return p

    def done(self, rank: int) -> int:
        return len(self.steps.get(rank, []))


@dataclass
class Run:
    code: int
    out: str
    err: str
    wall: float
    progress: Progress
    logs: Path
    run_name: str

    @property
    def run_dir(self) -> Path:
        return self.logs / self.run_name

    def summary(self, where: Optional[Path] = None) -> dict[str, Any]:
        path = (where or self.run_dir) / "final_summary.json"
        assert path.is_file(), f"no summary at {path}\nstderr:\n{self.err[-3000:]}"
        return json.loads(path.read_text())


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc), for finding the aggregator of a launcher."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def aggregator_pid(launcher: int, timeout: float = 120.0) -> int:
    """The aggregator the launcher started: it comes after the pre-flight, whose torch import in
    the workers' Python can take tens of seconds on a loaded 2-core CI machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in children(launcher):
            if "traceml_core.aggregator" in cmdline(c):
                return c
        time.sleep(0.05)
    raise AssertionError("the launcher started no aggregator")


class Launch:
    """One ``traceml run`` (or plain torchrun) in its own process group, with a hard timeout."""

    def __init__(self, tmp: Path, script_args: Sequence[str] = (), *, nproc: int = 2,
                 traceml: bool = True, flags: Sequence[str] = (), env: Optional[dict[str, str]] = None,
                 run_name: str = "run", logs: Optional[Path] = None,
                 aggregator_port: Optional[int] = None, prefix: Sequence[str] = ()) -> None:
        self.progress_dir = tmp / ("progress" if traceml else "progress-plain")
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        self.logs = logs or tmp / "logs"
        self.run_name = run_name
        master, agg = free_ports(2)
        agg = aggregator_port or agg
        self.aggregator_port = agg
        if traceml:
            cmd = [PY, "-m", "traceml_core.cli", "run", f"--nproc-per-node={nproc}",
                   f"--logs-dir={self.logs}", f"--run-name={run_name}", f"--master-port={master}",
                   f"--aggregator-port={agg}", *flags, SCRIPT, *script_args]
        else:
            cmd = [PY, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                   f"--master-port={master}", "--max-restarts=0", SCRIPT, *script_args]
        self.cmd = cmd = [*prefix, *cmd]
        self.env = base_env(self.progress_dir, **(env or {}))
        self.out_path = tmp / f"{run_name}-{'traceml' if traceml else 'plain'}.out"
        self.err_path = self.out_path.with_suffix(".err")
        self._out = open(self.out_path, "w")
        self._err = open(self.err_path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._out, stderr=self._err,
                                     start_new_session=True, cwd=str(tmp))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_now(self) -> str:
        return self.err_path.read_text()

    def wait(self, timeout: float) -> Run:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for pid in Progress.read(self.progress_dir).pids.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"{self.cmd[2:4]} did not end within {timeout} s; killed it.\n"
                                 f"stderr tail:\n{self.err_path.read_text()[-3000:]}")
        wall = time.monotonic() - self.t0
        self._out.close()
        self._err.close()
        return Run(code, self.out_path.read_text(), self.err_path.read_text(), wall,
                   Progress.read(self.progress_dir), self.logs, self.run_name)


def run(tmp: Path, script_args: Sequence[str] = (), *, timeout: float = 180, **kw: Any) -> Run:
    """Launch and wait. ``timeout`` is only a hang guard: under CI load the pre-flight and the
    workers' torch imports alone can take 30-45 s before the first step."""
    return Launch(tmp, script_args, **kw).wait(timeout)


def assert_no_leftovers(r: Run, extra_pids: Sequence[int] = ()) -> None:
    """Every worker (and any extra pid, e.g. the aggregator) is gone when the launcher returned."""
    deadline = time.monotonic() + 2.0
    pids = list(r.progress.pids.values()) + list(extra_pids)
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"processes left behind: {[(p, cmdline(p)) for p in alive]}"


def assert_counted(r: Run, summary: dict[str, Any]) -> None:
    """Every step the aggregator received is counted, and nothing is counted twice or invented:
    per rank, received <= what training did, and received + lost == expected."""
    for rank in summary["ranks"]:
        t = rank["telemetry"]
        did = r.progress.done(rank["rank"])
        # a rank's step in flight when it died may be recorded (its trace_step exited by exception)
        assert t["received"] <= did + 1, (rank["rank"], t, did)
        if t["expected"] is not None:
            assert t["received"] + t["lost"] == t["expected"], t
        sent = r.progress.sent.get(rank["rank"])
        if sent is not None:
            assert t["received"] >= sent, (rank["rank"], t, sent)
    # against the truth (the steps each rank's training loop wrote down): a rank that said goodbye
    # is counted exactly; one that did not is within the bound the summary states
    exact = True
    for rank in summary["ranks"]:
        t = rank["telemetry"]
        truth = r.progress.done(rank["rank"])
        if t["expected"] is None:
            exact = exact and truth == 0
            continue
        assert t["expected"] <= truth + 1, (rank["rank"], t, truth)
        if t["unsent_max"] == 0:
            assert t["expected"] >= truth, (rank["rank"], t, truth)
        elif t["unsent_max"] is not None:
            assert truth - t["expected"] <= t["unsent_max"], (rank["rank"], t, truth)
        exact = exact and t["expected"] >= truth and not t["lost"]
    tel = summary["telemetry"]
    if tel["complete"]:
        assert exact, "complete, but records are missing"
    assert tel["records_received"] == sum(x["telemetry"]["received"] for x in summary["ranks"])
