"""Real ranks behind a real node relay, without `traceml run`: the aggregator in its own process
(as node 0's launcher starts it), the node's :class:`~traceml_core.launcher.relay.Relay` in this
process, and gloo DDP ranks of ``faulty_train.py`` under plain torchrun whose SDK connects to that
relay as it would under `traceml run`. A test can then ask the ranks what node 0 asks them (a
``stacks`` request, the hang autopsy) as often as it likes, at any point of their steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from harness import SCRIPT, base_env, free_ports, pid_alive

from traceml_core.aggregator.process import AggregatorHandle, start_aggregator
from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.launcher.relay import Relay
from traceml_core.runinfo import ENV_VAR, RunInfo

TOKEN = "rig-token-0123456789abcdef"
RUN = "rig"


class RankRig:
    def __init__(self, tmp: Path, nproc: int = 2, flush_s: float = 0.05) -> None:
        self.tmp, self.nproc = tmp, nproc
        self.progress = tmp / "progress"
        self.progress.mkdir(parents=True, exist_ok=True)
        self.agg: AggregatorHandle = start_aggregator(AggregatorSettings(
            run_name=RUN, token=TOKEN, run_dir=tmp / "logs" / RUN, port=0, nnodes=1,
            nproc_per_node=nproc, drain_s=1.0), ready_timeout=60.0)
        self.relay = Relay(token=TOKEN, run_name=RUN, job_id=None, node=0, nnodes=1, nproc_per_node=nproc,
                           upstream=(self.agg.connect_host, self.agg.port), hostname="h",
                           flush_s=flush_s).start()
        assert self.relay.wait_connected(60.0), "the relay never reached the aggregator"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, script_args: Sequence[str], script: str = SCRIPT) -> None:
        info = RunInfo(run_name=RUN, job_id=None, nnodes=1, node_rank=0, nproc_per_node=self.nproc,
                       aggregator_host=self.relay.host, aggregator_port=self.relay.port, token=TOKEN,
                       connect_wait=60.0, mode="summary", logs_dir=str(self.tmp / "logs"))
        env = base_env(self.progress, **{ENV_VAR: info.to_env()})
        self.proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run",
                                      f"--nproc-per-node={self.nproc}", f"--master-port={free_ports(1)[0]}",
                                      script, *script_args],
                                     env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=open(self.tmp / "torchrun.err", "wb"))

    def steps(self) -> dict[int, int]:
        """Steps each rank finished, as training itself wrote them."""
        out = {}
        for r in range(self.nproc):
            f = self.progress / f"rank{r}.txt"
            if f.exists():
                out[r] = sum(1 for ln in f.read_text().splitlines() if ln.startswith("step"))
        return out

    def pids(self) -> dict[int, int]:
        out = {}
        for r in range(self.nproc):
            f = self.progress / f"rank{r}.txt"
            if f.exists():
                first = f.read_text().split("\n", 1)[0].split()
                if len(first) == 2 and first[0] == "pid":
                    out[r] = int(first[1])
        return out

    def wait_steps(self, n: int, bound_s: float = 180.0) -> None:
        """Until every rank finished ``n`` steps and its SDK is connected to the relay."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            st = self.steps()
            if len(st) == self.nproc and min(st.values()) >= n and \
                    self.relay.stats().ranks_connected == self.nproc:
                return
            assert self.proc is None or self.proc.poll() is None, self.stderr()
            time.sleep(0.05)
        raise AssertionError(f"the ranks never reached step {n}: {self.steps()}\n{self.stderr()}")

    def request_stacks(self, req_id: int) -> None:
        """What node 0's aggregator sends down for the hang autopsy, as the relay receives it."""
        self.relay._from_upstream({"t": "req", "id": req_id, "kind": "stacks", "ranks": None, "args": {}})

    def autopsy(self) -> Optional[dict[str, Any]]:
        """The hang report, taken the way node 0's launcher takes it."""
        return self.agg.autopsy(61.0, 60.0, "test")

    def stderr(self) -> str:
        p = self.tmp / "torchrun.err"
        return p.read_text(errors="replace")[-3000:] if p.exists() else ""

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def close(self) -> None:
        pids = list(self.pids().values())
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait(30)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.relay.close(1.0)
        self.agg.kill()
