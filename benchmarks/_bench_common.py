"""Shared bits of the rank-side benchmarks: a loopback receiver in its own process, statistics."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"
RUN = "bench"


class SinkProcess:
    """``python -m traceml_core.wire.sink`` as a separate process (so it does not share our GIL)."""

    def __init__(self, expect_byes: int = 1) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traceml_core.wire.sink", "--token", TOKEN, "--run", RUN,
             "--expect-byes", str(expect_byes), "--timeout", "900"],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        line = self.proc.stdout.readline()          # type: ignore[union-attr]
        self.port = int(line.split()[1])
        self.address = f"127.0.0.1:{self.port}"

    def totals(self, timeout: float = 30.0) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile)."""
    if len(values) < 2:
        v = values[0]
        return v, v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def machine() -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def maybe_json(path: Optional[str], data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")


class LocalRun:
    """A real aggregator process and node 0's real relay, wired as ``traceml run`` wires them on
    one node: ranks connect to ``port`` (the relay); :meth:`finish` drains the relay first."""

    def __init__(self, settings: Any, flush_s: float = 0.1, tail: bool = False) -> None:
        sys.path.insert(0, str(REPO / "src"))
        from traceml_core.aggregator.process import start_aggregator
        from traceml_core.launcher.relay import Relay

        self.handle = start_aggregator(settings)
        s = settings
        self.relay = Relay(token=s.token, run_name=s.run_name, job_id=s.job_id, node=0, nnodes=s.nnodes,
                           nproc_per_node=s.nproc_per_node,
                           upstream=(self.handle.connect_host, self.handle.port), flush_s=flush_s,
                           tail=tail).start()
        if not self.relay.wait_connected(30.0):
            raise RuntimeError(f"the relay did not join the aggregator: {self.relay.client.stats()}")
        self.port = self.relay.port
        self.address = f"{self.relay.host}:{self.relay.port}"

    def finish(self, exit_code: int = 0, **kw: Any) -> Any:
        self.relay.drain(10.0)
        self.relay.run_ended()
        try:
            return self.handle.finish(exit_code, **kw)
        finally:
            self.relay_stats = self.relay.close(1.0)

    def kill(self) -> None:
        self.relay.close(0.5)
        if self.handle.alive():
            self.handle.kill()
