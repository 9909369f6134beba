"""Minimal DDP training with TraceML: a small MLP on synthetic data through a real DataLoader.

    traceml run --nproc-per-node=2 examples/ddp_minimal.py      # telemetry + final summary
    torchrun --nproc-per-node=2 examples/ddp_minimal.py          # plain torchrun: telemetry off

Two lines are TraceML's: ``traceml.init()`` and ``with traceml.trace_step(model):``. CPU (gloo)
or GPU (nccl), picked automatically. A few hundred small steps; seconds on two CPU processes.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import traceml_core as traceml  # noqa: E402
from _common import mlp, setup, teardown, wrap  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps per rank (default 300)")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    traceml.init()
    d = setup()
    torch.manual_seed(0)
    model = wrap(mlp(), d)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    sampler = DistributedSampler(data) if d.distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None,
                        pin_memory=d.device.type == "cuda")

    step, epoch = 0, 0
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            with traceml.trace_step(model):
                x = x.to(d.device, non_blocking=True)
                y = y.to(d.device, non_blocking=True)
                loss = F.mse_loss(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    if d.rank == 0:
        print(f"ddp_minimal: {step} steps on {d.world} process(es), {d.device.type}, "
              f"last loss {loss.item():.4f}", flush=True)
    teardown(d)


if __name__ == "__main__":
    main()
