"""The doctor's torch probe when its time runs out: real child processes with the real torch,
slowed at one stage by a ``sitecustomize`` that delays an import (the way a cold shared filesystem
delays `import torch`). Slow is not broken: a timed-out import must not be called an unusable torch
with the advice to install one, and a probe that got past the import keeps what it learnt."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from doctor_env import make, step

from traceml_slurm.doctor import gpu as G
from traceml_slurm.doctor import software as S
from traceml_slurm.doctor.agent import _bench
from traceml_slurm.doctor.model import Status
from traceml_slurm.doctor.torchprobe import INFO_ARGS, ProbeProcess, TorchInfo

#: a sitecustomize for the probe's child: the import of one module waits (says so in a file first)
DELAY = """\
import importlib.abc, pathlib, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            pathlib.Path({reached!r}).write_text("waiting")
            time.sleep(300)
        return None

sys.meta_path.insert(0, _Slow())
"""


def probe(tmp_path: Path, module: str) -> TorchInfo:
    """The probe's answer when its time runs out while ``module`` is being imported. The bound is
    set once the child is there (however long a loaded machine took to get it there), so the
    stage it stopped in is the one the test means."""
    reached = tmp_path / "reached"
    (tmp_path / "sitecustomize.py").write_text(DELAY.format(module=module, reached=str(reached)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    p = ProbeProcess(INFO_ARGS, 300.0, env)
    try:
        deadline = time.monotonic() + 240
        while not reached.exists():
            assert time.monotonic() < deadline and p.proc.poll() is None, "the probe never reached the import"
            time.sleep(0.05)
        p.timeout = round(p.elapsed()) + 1.0
        return TorchInfo.from_probe(p.result(), p.timeout)
    finally:
        p.kill()


def test_an_import_that_does_not_finish_is_not_measured_not_a_broken_torch(tmp_path):
    info = probe(tmp_path, "torch")
    within = f"did not finish within {info.timeout_s:.0f} s"
    assert info.stalled == "`import torch`" and info.version is None
    o = S.check_torch(make(step(), torch=info))
    assert o.status is Status.WARN, o
    assert o.observed.startswith(f"not measured: `import torch` {within}"), o.observed
    assert "--timeout 120" in o.fix and "pip install" not in o.fix
    # the checks that need torch say why they could not run, and give no install advice either
    assert S.check_nccl(make(step(), torch=info)).status is Status.SKIP
    cuda = G.check_cuda_init(make(step(SLURM_GPUS_ON_NODE="1"), torch=info))
    assert cuda.status is Status.SKIP and within in cuda.observed, cuda


def test_a_probe_stopped_in_the_benchmarks_keeps_the_import_and_says_what_is_missing(tmp_path):
    # the benchmarks start by importing traceml_core.selftest (the cgroup's CPU figures): delayed
    info = probe(tmp_path, "traceml_core.selftest")
    within = f"did not finish within {info.timeout_s:.0f} s"
    assert info.stalled == "the micro-benchmarks" and info.ok, info
    assert info.version and info.version.startswith("2.") and info.gloo is True and info.import_s is not None
    o = S.check_torch(make(step(), torch=info))
    assert o.status in (Status.PASS, Status.WARN), o   # WARN: the import itself was slow (a loaded machine)
    assert re.search(rf"; import [\d.]+ s; then the micro-benchmarks {within}", o.observed), o.observed
    # the cross-node compute check gets the reason, not a bare "see sw.torch"
    assert _bench(info) == {"cpu": {"error": f"the micro-benchmarks {within}"}}


def test_cuda_that_does_not_initialise_is_the_gpus_problem_not_torchs():
    # (no GPU here: the facts a probe stopped in CUDA initialisation reports, as from_probe builds them)
    info = TorchInfo(version="2.13.0+cu128", path="/venv/torch", cuda_build="12.8", device_count=1, gloo=True,
                     import_s=2.0, stalled="CUDA initialisation", timeout_s=15.0)
    assert S.check_torch(make(step(), torch=info)).status is Status.PASS
    o = G.check_cuda_init(make(step(SLURM_GPUS_ON_NODE="1"), torch=info))
    assert o.status is Status.FAIL and o.observed.startswith("CUDA initialisation did not finish within 15 s"), o
    assert "Xid" in o.fix and "install" not in o.fix.lower()


def test_a_slow_import_that_finished_is_a_warning_with_its_time():
    slow = TorchInfo(version="2.13.0+cpu", path="/lustre/venv/torch", cuda_build=None, device_count=0, gloo=True,
                     import_s=41.5)
    o = S.check_torch(make(step(), torch=slow))
    assert o.status is Status.WARN and "import 41.5 s" in o.observed and "each start" in o.observed, o
    assert "node-local disk" in o.fix
