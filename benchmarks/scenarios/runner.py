"""Run one scenario for real and read its ``final_summary.json``.

One node: ``traceml run --nproc-per-node=N train.py ARGS`` (torchrun, gloo DDP on CPU, the real
aggregator). Several nodes: a batch job on the dev Slurm cluster (``srun traceml run``, one rank
per node), which needs the runner to run inside the cluster's login namespace
(``scripts/dev-cluster exec``). Around the run, what the scenario asks for: busy loops beside it
(CPU load from outside the job, each started and ended by its pid), a node's link limited with
``tc tbf`` (always removed after).

Used by ``benchmarks/verdict_matrix.py`` and by the CI subset (tests/verdicts). Run it inside a
network namespace of your own (``scripts/dev-cluster exec``) when others share the machine, so
the runs' loopback ports never meet theirs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

from .catalog import Outcome, Scenario, outcome_from_summary

REPO = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).resolve().with_name("train.py")
MODES = ("summary", "cli")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


#: the TraceML source the runs use: this checkout's, or another (``verdict_matrix.py --src``:
#: the baseline of an older commit, measured with today's scenarios)
SRC = [REPO / "src"]


def clean_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of a run outside any job: no Slurm or TraceML variables of ours leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = str(SRC[0]) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """``n`` busy loops beside the run (another job's CPU load), each ended by its pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def launch(sc: Scenario, mode: str, logs: Path, name: str, timeout: float = 600.0,
           python: str = sys.executable) -> tuple[subprocess.CompletedProcess, float]:
    master, agg = free_ports(2)
    cmd = [python, "-m", "traceml_core.cli", "run", f"--nproc-per-node={sc.nproc}",
           f"--logs-dir={logs}", f"--run-name={name}", f"--master-port={master}",
           f"--aggregator-port={agg}", f"--mode={mode}", *sc.launch, str(TRAIN), *sc.args]
    t0 = time.monotonic()
    with busy_loops(sc.busy):
        p = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(dict(sc.env)),
                           timeout=timeout, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t0


def _cluster():  # noqa: ANN202 - tests/slurm/cluster.Cluster, imported only for cluster scenarios
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    from cluster import Cluster

    cluster, why = Cluster.detect()
    if cluster is None:
        raise RuntimeError(f"scenario needs the dev Slurm cluster: {why}")
    return cluster


@contextlib.contextmanager
def throttled(cluster, throttle: Optional[tuple[str, str]]) -> Iterator[None]:  # noqa: ANN001
    """A node's egress limited (tc tbf) for the duration; the qdisc is always removed."""
    if throttle is None:
        yield
        return
    node, rate = throttle
    cluster.on_node(node, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                    "burst", "32kbit", "latency", "400ms")
    try:
        yield
    finally:
        cluster.on_node(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


def launch_cluster(sc: Scenario, mode: str, logs: Path, name: str, timeout: float = 600.0,
                   python: str = sys.executable) -> tuple[subprocess.CompletedProcess, float]:
    """The scenario as a batch job of ``sc.nodes`` nodes of the dev cluster."""
    cluster = _cluster()
    bin_dir = str(Path(python).parent)
    args = " ".join(sc.args)
    script = f"""#!/bin/bash
export TRACEML_TOKEN={secrets.token_hex(16)}
srun --kill-on-bad-exit=1 traceml run --logs-dir={logs} --run-name={name} --mode={mode} {' '.join(sc.launch)} {TRAIN} {args}
"""
    env = clean_env(dict(sc.env))
    env.update({k: v for k, v in os.environ.items() if k.startswith(("SLURM_CONF", "TRACEML_CLUSTER"))})
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["TRACEML_NODE_STORE"] = str(logs / f"{name}.nodes.sqlite")
    t0 = time.monotonic()
    with busy_loops(sc.busy), throttled(cluster, sc.throttle):
        job, state, out = cluster.run_job(script, f"--nodes={sc.nodes}", f"--ntasks-per-node={sc.nproc}",
                                          "--gres=gpu:1", "--cpus-per-task=1", timeout=timeout, env=env)
    return subprocess.CompletedProcess([job], 0 if state == "COMPLETED" else 1, out, state), time.monotonic() - t0


def run_scenario(sc: Scenario, mode: str, logs: Path, run: int = 0, timeout: float = 600.0) -> Outcome:
    """One real run; an outcome with ``error`` set when no summary came out of it."""
    name = f"{sc.name}-{mode}-{run}"
    before = os.getloadavg()[0]
    try:
        p, wall = (launch_cluster if sc.nodes > 1 else launch)(sc, mode, logs, name, timeout)
    except subprocess.TimeoutExpired:
        return Outcome(sc.name, mode, run, [], "timeout", timeout, (before, os.getloadavg()[0]),
                       error=f"timed out after {timeout:.0f} s")
    except Exception as exc:  # noqa: BLE001 - a scenario that cannot run is an outcome, not a crash
        return Outcome(sc.name, mode, run, [], "not run", 0.0, (before, os.getloadavg()[0]),
                       error=f"could not run: {type(exc).__name__}: {exc}")
    load = (before, os.getloadavg()[0])
    path = logs / name / "final_summary.json"
    if not path.is_file():
        return Outcome(sc.name, mode, run, [], "no summary", wall, load,
                       error=f"no summary (exit {p.returncode}): {p.stderr[-600:]}")
    summary = json.loads(path.read_text())
    return outcome_from_summary(summary, sc.name, mode, run, wall, load)
