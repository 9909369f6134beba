"""A straggler: one rank's forward is slower every step, so in DDP every other rank waits for it
inside backward (the gradient all-reduce).

    traceml run --nproc-per-node=2 examples/straggler.py
    STRAGGLER_RANK=0 STRAGGLER_DELAY_MS=50 torchrun --nproc-per-node=2 examples/straggler.py

``STRAGGLER_RANK`` (default: the last rank) and ``STRAGGLER_DELAY_MS`` (default 30) pick the slow
rank and how much slower it is (a sleep inside its forward, standing in for a slower GPU, a
throttled node or a noisy neighbour). The summary should name that rank, and its node.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import traceml_core as traceml  # noqa: E402
from _common import mlp, setup, teardown, wrap  # noqa: E402


class SlowerOnOneRank(nn.Module):
    """Wraps the model; on the straggler rank each forward takes ``delay_s`` longer."""

    def __init__(self, inner: nn.Module, delay_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    traceml.init()
    d = setup()
    slow_rank = int(os.environ.get("STRAGGLER_RANK", str(d.world - 1)))
    delay_ms = float(os.environ.get("STRAGGLER_DELAY_MS", "30"))
    torch.manual_seed(0)
    model = wrap(SlowerOnOneRank(mlp(), delay_ms / 1000 if d.rank == slow_rank else 0.0), d)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(args.steps * args.batch_size * d.world, 32),
                         torch.randn(args.steps * args.batch_size * d.world, 1))
    sampler = DistributedSampler(data) if d.distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    step = 0
    for x, y in loader:
        with traceml.trace_step(model):
            x, y = x.to(d.device), y.to(d.device)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step += 1
        if step >= args.steps:
            break
    if d.rank == 0:
        print(f"straggler: {step} steps; rank {slow_rank} was {delay_ms:.0f} ms slower per step",
              flush=True)
    teardown(d)


if __name__ == "__main__":
    main()
