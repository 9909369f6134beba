"""One parameterised DDP training script whose cause of slowness is set from outside.

The verdict matrix (``benchmarks/verdict_matrix.py``) and its CI subset run this script under
``traceml run`` with flags that inject one known cause (or none, or two), so every run knows its
ground truth. Each cause is real work of the kind it stands for, placed where a user's script
would have it.

**Magnitudes are relative to the machine's compute** (``--*-factor``: times the compute per
step, 3 x the forward's wall time measured before the first step and averaged over the
ranks, so every rank injects the same amount), plus an
optional fixed part (``--*-ms``). A cause is then the same share of a step whether the machine
is idle or shared with ten other jobs: "rank 1's work takes twice as long", not "12 ms more",
which a loaded machine would shrink to noise and an idle one would blow up. The extra work is a
sleep, which takes the time asked whatever the load.

* ``--input``: ``pre`` (batches made up front: no input cost at all), ``loader`` (a DataLoader
  whose records cost ``--item-factor``/``--item-ms`` per batch to produce, ``--workers``
  workers) or ``get_batch`` (a nanoGPT-style function costing ``--fetch-factor``/``--fetch-ms``
  before each step, no DataLoader);
* ``--slow-rank R --slow-phase P --slow-factor F``: rank R does F times its compute more per
  step in ``forward`` (inside the model), ``backward`` (an autograd function on the first
  layer's output), ``optimizer`` (inside ``step``), ``nophase`` (inside the traced step, after
  the optimizer: no timed phase) or ``input`` (its batches cost that much more to fetch);
* ``--leak-rank R --leak-kib K``: rank R keeps K KiB per step (a tensor appended to a list, as a
  loss kept without ``.item()`` would), from step ``--leak-from`` until ``--leak-until`` (a
  plateau: memory grows, then stops); ``--leak-touch`` reads every kept tensor each step (a
  growing cache that is scanned), so the leak also slows its rank;
* ``--every K --every-factor F``: every K steps all ranks spend F times the compute of those K
  steps between steps (an evaluation or a checkpoint);
* ``--threads T``: ``torch.set_num_threads(T)`` on every rank (more threads than cores);
* ``--sync``: ``loss.item()`` every step (a host sync; meaningful on CUDA only).

The control (no flag) is cause-free by construction: batches are made before the first step,
and the model's compute per step (an MLP of ``--width`` x ``--depth`` on ``--batch`` samples,
~10 k parameters) is tens of times the gradient all-reduce (~40 kB).

    traceml run --nproc-per-node=2 benchmarks/scenarios/train.py --steps 120 --slow-rank 1 \
        --slow-phase backward --slow-factor 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import traceml_core as traceml

PHASES = ("forward", "backward", "optimizer", "nophase", "input")
#: untraced forward passes measured for the pace
CALIBRATION_PASSES = 7


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--input", choices=("pre", "loader", "get_batch"), default="pre")
    ap.add_argument("--item-ms", type=float, default=0.0, help="DataLoader: fixed cost of one batch's records")
    ap.add_argument("--item-factor", type=float, default=0.0, help="DataLoader: cost of one batch, x compute")
    ap.add_argument("--chunk", type=int, default=256, help="DataLoader: samples per record")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    ap.add_argument("--fetch-ms", type=float, default=0.0, help="get_batch: fixed cost of one batch")
    ap.add_argument("--fetch-factor", type=float, default=0.0, help="get_batch: cost of one batch, x compute")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-phase", choices=PHASES, default="forward")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--slow-factor", type=float, default=0.0)
    ap.add_argument("--leak-rank", type=int, default=-1)
    ap.add_argument("--leak-kib", type=float, default=0.0)
    ap.add_argument("--leak-from", type=int, default=0)
    ap.add_argument("--leak-until", type=int, default=-1, help="-1: until the end")
    ap.add_argument("--leak-touch", action="store_true")
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--every-ms", type=float, default=0.0)
    ap.add_argument("--every-factor", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--sync", action="store_true")
    return ap.parse_args(argv)


class Pace:
    """The run's compute per step in ms (:func:`calibrate`), shared with DataLoader workers
    (forked: they read it)."""

    def __init__(self) -> None:
        self.shared = multiprocessing.Value("d", 0.0, lock=False)

    @property
    def ms(self) -> float:
        return float(self.shared.value)

    def set(self, ms: float) -> None:
        self.shared.value = ms

    def sleep(self, fixed_ms: float, factor: float) -> None:
        """Sleep ``fixed_ms + factor x compute``."""
        s = (fixed_ms + factor * self.ms) / 1000.0
        if s > 0:
            time.sleep(s)


PACE = Pace()


class _Delay(torch.autograd.Function):
    """Identity forward; its backward sleeps (extra work in backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, extra: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.extra = extra
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.extra()
        return grad, None


class Net(nn.Module):
    """An MLP; on the slow rank, ``extra`` sleeps in forward or (through _Delay) in backward."""

    def __init__(self, features: int, width: int, depth: int, extra: Any, where: str) -> None:
        super().__init__()
        self.first = nn.Linear(features, width)
        self.body = nn.Sequential(*[m for _ in range(depth - 1) for m in (nn.ReLU(), nn.Linear(width, width))])
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(width, 1))
        self.extra, self.where = extra, where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra and self.where == "forward":
            self.extra()
        h = self.first(x)
        if self.extra and self.where == "backward":
            h = _Delay.apply(h, self.extra)
        return self.head(self.body(h))


def slow_sgd(extra: Any) -> type:
    class SlowSGD(torch.optim.SGD):
        """SGD whose step does extra work first (extra work in the optimizer)."""

        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            extra()
            return super().step(closure)

    return SlowSGD


class Records(Dataset):
    """Records of ``chunk`` samples each, made up front; producing the records of one batch
    (reading, decoding, augmenting) costs ``item_ms + item_factor x compute``, shared out over
    the batch's records. A record of many samples keeps the DataLoader's own per-item overhead
    small against the cost it stands for."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, chunk: int, n: int, per_batch: int,
                 item_ms: float, item_factor: float) -> None:
        self.x, self.y, self.chunk, self.n = x, y, chunk, n
        self.per_batch, self.item_ms, self.item_factor = per_batch, item_ms, item_factor
        self.distinct = len(x) // chunk

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        PACE.sleep(self.item_ms / self.per_batch, self.item_factor / self.per_batch)
        j = i % self.distinct  # a few distinct records, repeated: their cost is what matters
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        return self.x[s].clone(), self.y[s].clone()


def batches(args: argparse.Namespace, rank: int, world: int, slow_input: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234 + rank)
    if args.input == "loader":
        chunk = min(args.chunk, args.batch)
        per_batch = max(1, args.batch // chunk)
        ds = Records(torch.randn(chunk * 16, args.features, generator=gen),
                     torch.randn(chunk * 16, 1, generator=gen), chunk,
                     per_batch * (args.steps + 2) * world, per_batch, args.item_ms, args.item_factor)
        sampler = DistributedSampler(ds, shuffle=False) if world > 1 else None
        loader = DataLoader(ds, batch_size=per_batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
        for x, y in loader:
            PACE.sleep(0.0, slow_input)
            yield x.reshape(-1, args.features), y.reshape(-1, 1)
        return
    pool = [(torch.randn(args.batch, args.features, generator=gen), torch.randn(args.batch, 1, generator=gen))
            for _ in range(8)]
    i = 0
    while True:
        if args.input == "get_batch":
            PACE.sleep(args.fetch_ms, args.fetch_factor)
        PACE.sleep(0.0, slow_input)
        yield pool[i % len(pool)]
        i += 1


def calibrate(model: nn.Module, net: "Net", args: argparse.Namespace, device: torch.device, world: int) -> None:
    """The pace every injected magnitude is a multiple of: this machine's compute per step now,
    measured before the first traced step (a few untraced forward passes; the slow rank's extra
    work is off meanwhile) and averaged over the ranks, so every rank injects the same amount
    (a rank's own pace would make a slower rank's loader slower too)."""
    extra, net.extra = net.extra, None
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(args.batch, args.features, generator=gen).to(device)
    times = []
    with torch.no_grad():
        for _ in range(CALIBRATION_PASSES):
            t0 = time.perf_counter()
            net(x)
            times.append(time.perf_counter() - t0)
    net.extra = extra
    # 3 x the forward's wall time: backward is about twice the forward
    pace = torch.tensor([3.0 * sorted(times)[len(times) // 2] * 1000.0])
    if world > 1:
        dist.all_reduce(pace)
        pace /= world
    PACE.set(float(pace.item()))


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

    slow = rank == args.slow_rank and (args.slow_ms > 0 or args.slow_factor > 0)

    def extra() -> None:
        PACE.sleep(args.slow_ms, args.slow_factor)

    torch.manual_seed(0)
    net = Net(args.features, args.width, args.depth, extra if slow else None, args.slow_phase).to(device)
    model: nn.Module = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net, device_ids=[local] if cuda else None)
    opt_cls = slow_sgd(extra) if slow and args.slow_phase == "optimizer" else torch.optim.SGD
    opt = opt_cls(model.parameters(), lr=1e-3)
    slow_input = args.slow_factor if slow and args.slow_phase == "input" else 0.0

    leaking = rank == args.leak_rank and args.leak_kib > 0
    leak_until = args.leak_until if args.leak_until >= 0 else args.steps
    leak_floats = int(args.leak_kib * 1024 // 4)
    kept: list[torch.Tensor] = []

    calibrate(model, net, args, device, world)
    source = batches(args, rank, world, slow_input)
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
            if slow and args.slow_phase == "nophase":
                extra()
            if leaking and args.leak_from <= step < leak_until:
                kept.append(torch.ones(leak_floats))
            if leaking and args.leak_touch:
                for t in kept:
                    t.sum()
        if args.every and step % args.every == args.every - 1:
            PACE.sleep(args.every_ms, args.every_factor * args.every)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"scenario: {args.steps} steps done", flush=True)


if __name__ == "__main__":
    main()
