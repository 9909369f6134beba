"""Input that is not a DataLoader: a nanoGPT-style ``get_batch()`` called before each traced step.

    traceml run --nproc-per-node=2 examples/get_batch.py                 # input "not measured"
    traceml run --nproc-per-node=2 examples/get_batch.py --wrap          # measured via wrap_dataloader
    traceml run --nproc-per-node=2 examples/get_batch.py --fetch-ms 0    # control: nothing to fetch

Each batch costs ``--fetch-ms`` (default 15 ms: reading and slicing a memory-mapped token file)
and the model step ~2 ms. Without a DataLoader TraceML cannot time the fetch itself, so the
summary says input is *not measured* (never 0.00) and reads the time between traced steps, which
nothing else explains, as the input wait. ``--wrap`` passes the batch source through
``traceml.wrap_dataloader``, so the fetch is timed and credited to the step like a DataLoader's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterator

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import traceml_core as traceml  # noqa: E402
from _common import mlp, setup, teardown, wrap  # noqa: E402


def get_batch(gen: torch.Generator, batch_size: int, fetch_s: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What nanoGPT's get_batch does, with the disk read made a fixed cost."""
    if fetch_s > 0:
        time.sleep(fetch_s)
    x = torch.randn(batch_size, 32, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def batches(gen: torch.Generator, batch_size: int, fetch_s: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield get_batch(gen, batch_size, fetch_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--fetch-ms", type=float, default=15.0, help="cost of one get_batch() (default 15)")
    ap.add_argument("--wrap", action="store_true", help="time the fetches with traceml.wrap_dataloader")
    args = ap.parse_args()

    traceml.init()
    d = setup()
    torch.manual_seed(0)
    model = wrap(mlp(), d)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(d.rank)
    source = batches(gen, args.batch_size, args.fetch_ms / 1000)
    if args.wrap:
        source = iter(traceml.wrap_dataloader(_Reiterable(source)))
    for _ in range(args.steps):
        x, y = next(source)
        with traceml.trace_step(model):
            loss = F.mse_loss(model(x.to(d.device)), y.to(d.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    if d.rank == 0:
        print(f"get_batch: {args.steps} steps, {args.fetch_ms:g} ms per fetch"
              + (" (wrapped)" if args.wrap else ""), flush=True)
    teardown(d)


class _Reiterable:
    """wrap_dataloader takes an iterable (anything with __iter__); a generator object is one."""

    def __init__(self, it: Iterator) -> None:
        self._it = it

    def __iter__(self) -> Iterator:
        return self._it


if __name__ == "__main__":
    main()
