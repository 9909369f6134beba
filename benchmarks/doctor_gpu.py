"""The doctor's GPU checks for real, on a machine with NVIDIA GPUs (no Slurm needed).

    python benchmarks/doctor_gpu.py            # one short run: about 10-30 s

It pretends to be task 0 of a one-node srun step that was allocated every GPU NVML sees
(SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES), then runs gpu.count, gpu.cuda-init, gpu.free, sw.torch
and sw.nccl against the REAL NVML (pynvml) and a real `import torch` + CUDA init in the child
process, and finally the --full NCCL all-reduce probe with one process (world 1: it exercises the
code path and prints the algorithm bandwidth of the local device). Prints every outcome and the
figures; exits 1 if a check failed. The unit tests run the same checks against a fake NVML.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from traceml_slurm.doctor.model import Status  # noqa: E402
from traceml_slurm.doctor.node import NodeContext, Options  # noqa: E402
from traceml_core.sdk.samplers.nvml import NvmlUnavailable, load_nvml  # noqa: E402
from traceml_slurm.doctor.registry import NODE_SPECS, run_checks  # noqa: E402
from traceml_slurm.doctor.thresholds import NCCL_SWEEP_BYTES  # noqa: E402
from traceml_slurm.doctor.torchprobe import run_probe  # noqa: E402

WANT = ("gpu.count", "gpu.cuda-init", "gpu.free", "sw.torch", "sw.nccl")


def main() -> int:
    try:
        nv = load_nvml()
        devices = nv.devices()
        print(f"NVML: driver {nv.driver_version()}, {len(devices)} devices: "
              + ", ".join(f"{d.index}:{d.name} {d.memory_used / 2**30:.1f}/{d.memory_total / 2**30:.0f} GiB "
                          f"{len(d.processes)} procs" for d in devices))
    except NvmlUnavailable as exc:
        print(f"NVML unavailable: {exc}; the GPU checks will say so")
        devices = []
    n = len(devices)
    ids = ",".join(str(i) for i in range(n))
    host = socket.gethostname()
    env = dict(os.environ, SLURM_JOB_ID="1", SLURM_JOB_NAME="gpu-check", SLURM_JOB_NODELIST=host, SLURM_NNODES="1",
               SLURM_JOB_NUM_NODES="1", SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST=host,
               SLURM_STEP_TASKS_PER_NODE="1", SLURM_NODEID="0", SLURMD_NODENAME=host)
    if n:
        env.update(SLURM_GPUS_ON_NODE=str(n), CUDA_VISIBLE_DEVICES=ids, SLURM_STEP_GPUS=ids, SLURM_JOB_GPUS=ids)
    ctx = NodeContext(env, Options(timeout=120.0))
    t0 = time.perf_counter()
    outcomes = run_checks([s for s in NODE_SPECS if s.id in WANT], ctx)
    print(f"checks took {time.perf_counter() - t0:.1f} s")
    failed = False
    for cid, o in outcomes.items():
        failed |= o.status is Status.FAIL
        print(f"  {o.status.value:4} {cid}: {o.observed}" + (f"\n       fix: {o.fix}" if o.fix else ""))
    info = ctx.torch()
    if info.cuda_init:
        print("  CUDA init per device (s): " + ", ".join(f"{d['index']}:{d.get('seconds', '?')}" for d in info.cuda_init))
    if n and info.ok and info.cuda_build:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        r = run_probe(["nccl", "127.0.0.1", str(port), "0", "1", "60", ",".join(map(str, NCCL_SWEEP_BYTES))], 120.0, env)
        print(f"NCCL probe (world 1) in {r.seconds:.1f} s: " + (json.dumps(r.data.get("sizes")) if r.ok else str(r.error or r.data)))
        failed |= not r.ok or "sizes" not in r.data
    ctx.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
