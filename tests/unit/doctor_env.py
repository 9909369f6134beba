"""Environments and contexts for the doctor's unit tests (real Slurm variable sets, as captured on the
local cluster: see tests/slurm for the live versions)."""

from __future__ import annotations

from typing import Optional

from traceml_slurm.doctor.netinfo import Interface
from traceml_slurm.doctor.node import NodeContext, Options
from traceml_core.selftest import FakeNvml, NvmlUnavailable
from traceml_slurm.doctor.torchprobe import TorchInfo

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "ddp", "SLURM_SUBMIT_DIR": "/home/u/p", "SLURM_JOB_NUM_NODES": "2",
       "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_TASKS_PER_NODE": "1(x2)",
       "SLURM_NTASKS_PER_NODE": "1", "PATH": "/usr/bin:/bin"}
CPU_TORCH = TorchInfo(version="2.13.0+cpu", path="/venv/torch", cuda_build=None, device_count=0, gloo=True, import_s=1.0)


def cuda_torch(n: int, *, init_ok: bool = True) -> TorchInfo:
    return TorchInfo(version="2.13.0+cu128", path="/venv/torch", cuda_build="12.8", device_count=n, gloo=True,
                     nccl_version="2.27.3",
                     cuda_init=[{"index": i, "ok": init_ok, "seconds": 0.5, **({} if init_ok else {"error": "CUDA error: ECC"})}
                                for i in range(n)])


def step(**kw: Optional[str]) -> dict[str, str]:
    """Task 0's environment in `srun -N2 --ntasks-per-node=1` of a 2-node job (no GPU unless given)."""
    env = dict(JOB, SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="2", SLURM_STEP_NODELIST="gpu[07-08]",
               SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_STEP_NUM_TASKS="2", SLURM_NODEID="0", SLURMD_NODENAME="gpu07",
               SLURM_PROCID="0", SLURM_LOCALID="0")
    for k, v in kw.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def batch(**kw: Optional[str]) -> dict[str, str]:
    env = dict(JOB, SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0", SLURMD_NODENAME="gpu07")
    for k, v in kw.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def gpus(n: int, **kw: Optional[str]) -> dict[str, str]:
    ids = ",".join(str(i) for i in range(n))
    return step(**{"SLURM_GPUS_ON_NODE": str(n), "SLURM_JOB_GPUS": ids, "SLURM_STEP_GPUS": ids,
                   "CUDA_VISIBLE_DEVICES": ids, **kw})


def no_nvml() -> FakeNvml:
    raise NvmlUnavailable("libnvidia-ml.so.1 is not found: no NVIDIA driver on this node")


ETH = [Interface("lo", True, ("127.0.0.1",), loopback=True), Interface("eth0", True, ("10.0.0.7",)),
       Interface("ib0", False, ())]


def make(env: dict[str, str], *, nvml=None, torch: Optional[TorchInfo] = CPU_TORCH, interfaces=None,
         options: Options = Options(), **kw) -> NodeContext:
    loader = no_nvml if nvml is None else (lambda: nvml)
    return NodeContext(env, options, hostname=env.get("SLURMD_NODENAME", "testhost"), nvml_loader=loader,
                       torch_info=torch, interfaces=interfaces if interfaces is not None else ETH, **kw)
