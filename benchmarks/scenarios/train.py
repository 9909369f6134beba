"""One parameterised DDP training script whose cause of slowness is set from outside.

The verdict matrix (``benchmarks/verdict_matrix.py``) and its CI subset run this script under
``traceml run`` with flags that inject one known cause (or none, or two), so every run knows its
ground truth. Each cause is real work of the kind it stands for, placed where a user's script
would have it:

* ``--input``: ``pre`` (batches made up front: no input cost at all), ``loader`` (a DataLoader
  whose ``__getitem__`` costs ``--item-ms`` per sample, ``--workers`` workers) or ``get_batch``
  (a nanoGPT-style function costing ``--fetch-ms`` before each step, no DataLoader);
* ``--slow-rank R --slow-phase P --slow-ms X``: rank R does X ms more per step in ``forward``
  (inside the model), ``backward`` (an autograd function on the first layer's output), ``optimizer``
  (inside ``step``), ``nophase`` (inside the traced step, after the optimizer: no timed phase) or
  ``input`` (its batches cost X ms more to fetch). A sleep stands for the extra work: it takes the
  same time on a loaded machine as on an idle one, so the magnitude is what was asked for;
* ``--leak-rank R --leak-kib K``: rank R keeps K KiB per step (a tensor appended to a list, as a
  loss kept without ``.item()`` would), from step ``--leak-from`` until ``--leak-until`` (a
  plateau: memory grows, then stops); ``--leak-touch`` reads every kept tensor each step (a
  growing cache that is scanned), so the leak also slows its rank;
* ``--every K --every-ms X``: every K steps all ranks spend X ms between steps (an evaluation or
  a checkpoint);
* ``--threads T``: ``torch.set_num_threads(T)`` on every rank (more threads than cores);
* ``--sync``: ``loss.item()`` every step (a host sync; meaningful on CUDA only).

The control (no flag) is cause-free by construction: batches are made before the first step,
and the model's compute per step (an MLP of ``--width`` x ``--depth`` on ``--batch`` samples) is
tens of times the gradient all-reduce.

    traceml run --nproc-per-node=2 benchmarks/scenarios/train.py --steps 120 --slow-rank 1 \
        --slow-phase backward --slow-ms 10
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import traceml_core as traceml

PHASES = ("forward", "backward", "optimizer", "nophase", "input")


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--input", choices=("pre", "loader", "get_batch"), default="pre")
    ap.add_argument("--item-ms", type=float, default=0.0, help="DataLoader: cost of one item")
    ap.add_argument("--chunk", type=int, default=256, help="DataLoader: samples per item (a record of a shard)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    ap.add_argument("--fetch-ms", type=float, default=0.0, help="get_batch: cost of one batch")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-phase", choices=PHASES, default="forward")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--leak-rank", type=int, default=-1)
    ap.add_argument("--leak-kib", type=float, default=0.0)
    ap.add_argument("--leak-from", type=int, default=0)
    ap.add_argument("--leak-until", type=int, default=-1, help="-1: until the end")
    ap.add_argument("--leak-touch", action="store_true")
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--every-ms", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--sync", action="store_true")
    return ap.parse_args(argv)


def sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


class _Delay(torch.autograd.Function):
    """Identity forward; its backward takes ``secs`` longer (extra work in backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, secs: float) -> torch.Tensor:  # type: ignore[override]
        ctx.secs = secs
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        time.sleep(ctx.secs)
        return grad, None


class Net(nn.Module):
    """An MLP; ``forward_extra_s`` / ``backward_extra_s`` add the slow rank's extra work."""

    def __init__(self, features: int, width: int, depth: int, forward_extra_s: float,
                 backward_extra_s: float) -> None:
        super().__init__()
        self.first = nn.Linear(features, width)
        self.body = nn.Sequential(*[m for _ in range(depth - 1) for m in (nn.ReLU(), nn.Linear(width, width))])
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(width, 1))
        self.forward_extra_s = forward_extra_s
        self.backward_extra_s = backward_extra_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_extra_s:
            time.sleep(self.forward_extra_s)
        h = self.first(x)
        if self.backward_extra_s:
            h = _Delay.apply(h, self.backward_extra_s)
        return self.head(self.body(h))


def slow_sgd(extra_s: float) -> type:
    class SlowSGD(torch.optim.SGD):
        """SGD whose step takes ``extra_s`` longer (extra work in the optimizer)."""

        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            time.sleep(extra_s)
            return super().step(closure)

    return SlowSGD


class Records(Dataset):
    """Records of ``chunk`` samples each, made up front; ``item_ms`` is what producing one costs
    (reading, decoding, augmenting). A record of many samples keeps the per-item overhead of the
    DataLoader small against the cost it stands for."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, chunk: int, n: int, item_ms: float) -> None:
        self.x, self.y, self.chunk, self.n, self.item_ms = x, y, chunk, n, item_ms
        self.distinct = len(x) // chunk

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        sleep_ms(self.item_ms)
        j = i % self.distinct  # a few distinct records, repeated: their cost is what matters
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        return self.x[s].clone(), self.y[s].clone()


def batches(args: argparse.Namespace, rank: int, world: int, extra_fetch_ms: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234 + rank)
    pool = [(torch.randn(args.batch, args.features, generator=gen), torch.randn(args.batch, 1, generator=gen))
            for _ in range(8)]
    if args.input == "loader":
        chunk = min(args.chunk, args.batch)
        per_batch = max(1, args.batch // chunk)
        ds = Records(torch.randn(chunk * 16, args.features, generator=gen),
                     torch.randn(chunk * 16, 1, generator=gen), chunk,
                     per_batch * (args.steps + 2) * world, args.item_ms)
        sampler = DistributedSampler(ds, shuffle=False) if world > 1 else None
        loader = DataLoader(ds, batch_size=per_batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
        for x, y in loader:
            sleep_ms(extra_fetch_ms)
            yield x.reshape(-1, args.features), y.reshape(-1, 1)
        return
    i = 0
    while True:
        if args.input == "get_batch":
            sleep_ms(args.fetch_ms)
        sleep_ms(extra_fetch_ms)
        yield pool[i % len(pool)]
        i += 1


def main(argv: Optional[list[str]] = None) -> None:
    args = parse(argv)
    traceml.init()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group(backend="nccl" if cuda else "gloo")

    slow = args.slow_ms / 1000.0 if rank == args.slow_rank else 0.0
    torch.manual_seed(0)
    net = Net(args.features, args.width, args.depth,
              slow if args.slow_phase == "forward" else 0.0,
              slow if args.slow_phase == "backward" else 0.0).to(device)
    model: nn.Module = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net, device_ids=[local] if cuda else None)
    opt_cls = slow_sgd(slow) if slow and args.slow_phase == "optimizer" else torch.optim.SGD
    opt = opt_cls(model.parameters(), lr=1e-3)
    nophase_s = slow if args.slow_phase == "nophase" else 0.0
    extra_fetch_ms = args.slow_ms if slow and args.slow_phase == "input" else 0.0

    leaking = rank == args.leak_rank and args.leak_kib > 0
    leak_until = args.leak_until if args.leak_until >= 0 else args.steps
    leak_floats = int(args.leak_kib * 1024 // 4)
    kept: list[torch.Tensor] = []
    touch: Callable[[], None] = (lambda: [t.sum() for t in kept] and None) if args.leak_touch else (lambda: None)

    source = batches(args, rank, world, extra_fetch_ms)
    for step in range(args.steps):
        x, y = next(source)
        with traceml.trace_step(model):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if args.sync:
                loss.item()
            if nophase_s:
                time.sleep(nophase_s)
            if leaking and args.leak_from <= step < leak_until:
                kept.append(torch.ones(leak_floats))
            if leaking:
                touch()
        if args.every and args.every_ms and step % args.every == args.every - 1:
            sleep_ms(args.every_ms)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"scenario: {args.steps} steps done", flush=True)


if __name__ == "__main__":
    main()
