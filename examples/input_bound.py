"""An input-bound run: the DataLoader needs ~32 ms per batch, the model ~1 ms per step.

    traceml run --nproc-per-node=2 examples/input_bound.py
    torchrun --nproc-per-node=2 examples/input_bound.py

Each sample costs ``--item-ms`` (default 2 ms) to "decode" in ``__getitem__`` and batches of 16
are loaded in the training process (``--workers 0``), so nearly all of each step is input wait.
The fix the summary should point to: more DataLoader workers, faster decoding, or caching.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import traceml_core as traceml  # noqa: E402
from _common import mlp, setup, teardown, wrap  # noqa: E402


class SlowDecode(Dataset):
    """Synthetic samples that take ``item_s`` seconds each to produce (I/O or decoding)."""

    def __init__(self, n: int, item_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.item_s = item_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.item_s)
        return self.x[i], self.y[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--item-ms", type=float, default=2.0, help="cost of one sample (default 2 ms)")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()

    traceml.init()
    d = setup()
    torch.manual_seed(0)
    model = wrap(mlp(), d)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = SlowDecode(args.steps * args.batch_size * max(1, d.world), args.item_ms / 1000)
    sampler = DistributedSampler(data) if d.distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)
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
        print(f"input_bound: {step} steps, ~{args.batch_size * args.item_ms:.0f} ms of loading "
              f"per batch", flush=True)
    teardown(d)


if __name__ == "__main__":
    main()
