"""One parameterised DDP training script whose cause of slowness (or failure) is set from outside.

The verdict matrix (``benchmarks/verdict_matrix.py``) and its CI subset run this script under
``traceml run`` with flags that inject one known cause (or none, or two), so every run knows its
ground truth. **Each cause is the real thing where it can be**: a rank that computes more does
real matrix products, a bigger batch is a bigger tensor through the model, an evaluation is
forward passes over an evaluation batch, a leak keeps real tensors, CPU-bound input computes in
the DataLoader's workers. A sleep is used only where a sleep is the truth: a slower device or a
blocking wait (storage, the network, a lock) is, to the training thread, time off the CPU.

**Magnitudes are relative to the machine's compute** (``--*-factor``: times the compute per
step, 3 x the forward's wall time measured before the first step and averaged over the ranks,
so every rank injects the same amount). Real work is sized in units of work (a 96 x 96 matrix
product, timed at the start and averaged over the ranks): a rank asked for "1.0 x the compute"
does the matrix products that took one step's compute at the start, and on a machine that
gets busier later they take longer, as real work would. A sleep takes the time asked whatever
the load: it is sized from the same pace.

Causes (each also ``--cause-from S``: starts at step S, for causes that begin mid-run):

* ``--input``: ``pre`` (batches made up front: no input cost), ``loader`` (a DataLoader whose
  records cost ``--item-factor`` x compute per batch to *wait for* (a sleep: storage latency) and
  ``--item-cpu-factor`` x compute per batch to *compute* (decode, augment), ``--workers``
  workers) or ``get_batch`` (a nanoGPT-style function before each step, no DataLoader:
  ``--fetch-factor`` sleeps, ``--fetch-cpu-factor`` computes);
* ``--slow-rank R --slow-phase P --slow-factor F``: rank R *waits* F x compute more per step in P
  (a slower device, a blocking call): ``forward``, ``backward``, ``optimizer``, ``nophase``
  (inside the step after the optimizer), ``input`` (its batches take longer to arrive);
* ``--burn-rank R --burn-phase P --burn-factor F``: rank R *computes* F x compute more per step
  in P (``forward``, ``backward``, ``optimizer``, ``nophase``, ``outside``: between steps);
  rank-only work (metrics, logging, an extra loss on one rank);
* ``--batch-rank R --batch-factor F``: rank R's batches are F x the others' (an uneven sampler);
  ``--seq-rank R --seq-factor F``: rank R's sequences are F x longer (same samples, more
  elements: no bucketing); ``--tokens T`` makes every batch ``[batch, T, features]``;
* ``--leak-rank R --leak-kib K``: rank R keeps K KiB per step (a tensor appended to a list, as a
  loss kept without ``.item()`` would) until ``--leak-until``; ``--leak-touch`` reads every kept
  tensor each step (a growing cache that is scanned);
* ``--eval-every K --eval-factor F [--eval-rank R]``: every K steps an evaluation (forward passes
  over an evaluation batch under ``no_grad``) costing F x the compute of those K steps, on every
  rank or on rank R only; ``--every K --every-factor F`` is the same as a sleep (a checkpoint
  written to slow storage);
* ``--threads T``: ``torch.set_num_threads(T)`` on every rank;
* ``--accum K``: K micro-batches per step, the first K-1 under DDP's ``no_sync()``;
* ``--zero-code``: no ``trace_step`` (steps are found from the optimizer's steps);
* ``--sync``: ``loss.item()`` every step (a host sync; meaningful on CUDA only);
* ``--declare``: every rank declares its samples per step (``traceml.declare_work``);
* failures: ``--fail-mode exit|raise|mismatch|kill --fail-rank R --fail-step S`` (rank R leaves
  the loop cleanly, raises, calls one extra ``all_reduce``, or is killed by SIGKILL, at step S);
  ``--hang-rank R --hang-step S`` (rank R blocks forever at step S, outside any collective).

The control (no flag) is cause-free by construction: batches are made before the first step,
and the model's compute per step (an MLP of ``--width`` x ``--depth`` on ``--batch`` samples,
~10 k parameters) is tens of times the gradient all-reduce (~40 kB).

    traceml run --nproc-per-node=2 benchmarks/scenarios/train.py --steps 120 --batch-rank 1 \
        --batch-factor 1.6
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
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
BURN_PHASES = ("forward", "backward", "optimizer", "nophase", "outside")
#: untraced forward passes measured for the pace
CALIBRATION_PASSES = 7
#: the unit of real work: one product of two N x N matrices
UNIT_N = 96
UNIT_CALIBRATION = 200


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=0, help="0: [batch, features]; T: [batch, T, features]")
    ap.add_argument("--input", choices=("pre", "loader", "get_batch"), default="pre")
    ap.add_argument("--item-ms", type=float, default=0.0, help="DataLoader: fixed wait for one batch's records")
    ap.add_argument("--item-factor", type=float, default=0.0, help="DataLoader: wait for one batch, x compute")
    ap.add_argument("--item-cpu-factor", type=float, default=0.0, help="DataLoader: work of one batch, x compute")
    ap.add_argument("--chunk", type=int, default=256, help="DataLoader: samples per record")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    ap.add_argument("--fetch-ms", type=float, default=0.0, help="get_batch: fixed wait for one batch")
    ap.add_argument("--fetch-factor", type=float, default=0.0, help="get_batch: wait for one batch, x compute")
    ap.add_argument("--fetch-cpu-factor", type=float, default=0.0, help="get_batch: work of one batch, x compute")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-phase", choices=PHASES, default="forward")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--slow-factor", type=float, default=0.0)
    ap.add_argument("--burn-rank", type=int, default=-1)
    ap.add_argument("--burn-phase", choices=BURN_PHASES, default="forward")
    ap.add_argument("--burn-factor", type=float, default=0.0)
    ap.add_argument("--batch-rank", type=int, default=-1)
    ap.add_argument("--batch-factor", type=float, default=1.0)
    ap.add_argument("--seq-rank", type=int, default=-1)
    ap.add_argument("--seq-factor", type=float, default=1.0)
    ap.add_argument("--cause-from", type=int, default=0, help="slow/burn causes start at this step")
    ap.add_argument("--leak-rank", type=int, default=-1)
    ap.add_argument("--leak-kib", type=float, default=0.0)
    ap.add_argument("--leak-from", type=int, default=0)
    ap.add_argument("--leak-until", type=int, default=-1, help="-1: until the end")
    ap.add_argument("--leak-touch", action="store_true")
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--every-ms", type=float, default=0.0)
    ap.add_argument("--every-factor", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-factor", type=float, default=0.0)
    ap.add_argument("--eval-rank", type=int, default=-1, help="-1: every rank evaluates")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step (no_sync for all but the last)")
    ap.add_argument("--zero-code", action="store_true", help="no trace_step")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--declare", action="store_true", help="traceml.declare_work(samples_per_step=...)")
    ap.add_argument("--fail-mode", choices=("", "exit", "raise", "mismatch", "kill"), default="")
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--fail-step", type=int, default=-1)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=-1)
    return ap.parse_args(argv)


class Pace:
    """The run's compute per step in ms and the time of one unit of work (:func:`calibrate`),
    shared with DataLoader workers (forked: they read it)."""

    def __init__(self) -> None:
        self.shared = multiprocessing.Value("d", 0.0, lock=False)
        self.unit = multiprocessing.Value("d", 0.0, lock=False)

    @property
    def ms(self) -> float:
        return float(self.shared.value)

    def set(self, ms: float, unit_ms: float) -> None:
        self.shared.value = ms
        self.unit.value = unit_ms

    def sleep(self, fixed_ms: float, factor: float) -> None:
        """Wait ``fixed_ms + factor x compute`` (off the CPU)."""
        s = (fixed_ms + factor * self.ms) / 1000.0
        if s > 0:
            time.sleep(s)

    def units(self, factor: float) -> int:
        """Units of work that took ``factor x compute`` at the start."""
        u = float(self.unit.value)
        return max(0, round(factor * self.ms / u)) if u > 0 else 0

    def burn(self, factor: float) -> None:
        """Compute ``factor x compute`` worth of matrix products (real CPU work)."""
        burn_units(self.units(factor))


PACE = Pace()
_A = torch.randn(UNIT_N, UNIT_N)


def burn_units(n: int) -> None:
    with torch.no_grad():
        acc = _A
        for _ in range(n):
            acc = torch.mm(_A, acc).clamp_(-1.0, 1.0)


class _Delay(torch.autograd.Function):
    """Identity forward; its backward runs ``extra`` (extra time in backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, extra: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.extra = extra
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.extra()
        return grad, None


class Net(nn.Module):
    """An MLP (on the last dimension, so ``[batch, tokens, features]`` works too); ``extra`` (a
    callable) runs in forward or, through _Delay, in backward."""

    def __init__(self, features: int, width: int, depth: int) -> None:
        super().__init__()
        self.first = nn.Linear(features, width)
        self.body = nn.Sequential(*[m for _ in range(depth - 1) for m in (nn.ReLU(), nn.Linear(width, width))])
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(width, 1))
        self.extra_fwd: Any = None
        self.extra_bwd: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_fwd is not None:
            self.extra_fwd()
        h = self.first(x)
        if self.extra_bwd is not None and torch.is_grad_enabled():
            h = _Delay.apply(h, self.extra_bwd)
        return self.head(self.body(h))


def slow_sgd(extra: Any) -> type:
    class SlowSGD(torch.optim.SGD):
        """SGD whose step does extra work first (extra time in the optimizer)."""

        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            extra()
            return super().step(closure)

    return SlowSGD


class Records(Dataset):
    """Records of ``chunk`` samples each, made up front; producing the records of one batch waits
    ``item_ms + item_factor x compute`` (storage) and computes ``item_cpu x compute`` (decoding),
    shared out over the batch's records. A record of many samples keeps the DataLoader's own
    per-item overhead small against the cost it stands for."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, chunk: int, n: int, per_batch: int,
                 item_ms: float, item_factor: float, item_cpu: float) -> None:
        self.x, self.y, self.chunk, self.n = x, y, chunk, n
        self.per_batch, self.item_ms, self.item_factor, self.item_cpu = per_batch, item_ms, item_factor, item_cpu
        self.distinct = len(x) // chunk

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        PACE.sleep(self.item_ms / self.per_batch, self.item_factor / self.per_batch)
        if self.item_cpu:
            PACE.burn(self.item_cpu / self.per_batch)
        j = i % self.distinct  # a few distinct records, repeated: their cost is what matters
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        return self.x[s].clone(), self.y[s].clone()


def _shape(args: argparse.Namespace, rank: int, n: int) -> tuple[int, ...]:
    """A batch of ``n`` samples for ``rank``: ``[n, features]``, or ``[n, T, features]``."""
    if not args.tokens:
        return (n, args.features)
    t = args.tokens
    if rank == args.seq_rank:
        t = max(1, round(t * args.seq_factor))
    return (n, t, args.features)


def batch_of(args: argparse.Namespace, rank: int) -> int:
    return max(1, round(args.batch * (args.batch_factor if rank == args.batch_rank else 1.0)))


def batches(args: argparse.Namespace, rank: int, world: int, slow_input: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234 + rank)
    n = batch_of(args, rank)
    if args.input == "loader":
        chunk = min(args.chunk, args.batch)
        per_batch = max(1, n // chunk)
        steps = (args.steps + 2) * args.accum
        most = max(args.batch_factor, 1.0)
        shape = _shape(args, rank, chunk * 16)
        ds = Records(torch.randn(*shape, generator=gen), torch.randn(*shape[:-1], 1, generator=gen), chunk,
                     int(max(1, args.batch // chunk) * most * steps * world) + world, per_batch,
                     args.item_ms, args.item_factor, args.item_cpu_factor)
        sampler = DistributedSampler(ds, shuffle=False) if world > 1 else None
        loader = DataLoader(ds, batch_size=per_batch, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
        for x, y in loader:
            PACE.sleep(0.0, slow_input)
            yield x.reshape(-1, *shape[1:]), y.reshape(-1, *shape[1:-1], 1)
        return
    shape = _shape(args, rank, n)
    pool = [(torch.randn(*shape, generator=gen), torch.randn(*shape[:-1], 1, generator=gen)) for _ in range(8)]
    i = 0
    while True:
        if args.input == "get_batch":
            PACE.sleep(args.fetch_ms, args.fetch_factor)
            if args.fetch_cpu_factor:
                PACE.burn(args.fetch_cpu_factor)
        PACE.sleep(0.0, slow_input)
        yield pool[i % len(pool)]
        i += 1


def calibrate(net: Net, args: argparse.Namespace, device: torch.device, world: int) -> float:
    """The pace every injected magnitude is a multiple of: this machine's compute per step now,
    measured before the first traced step (a few untraced forward passes of the *common* batch;
    extra work is off meanwhile) and averaged over the ranks, so every rank injects the same
    amount; and the time of one unit of real work, averaged likewise. Returns the forward's
    time (ms) of one batch."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(*_shape(args, -1, args.batch), generator=gen).to(device)
    times = []
    with torch.no_grad():
        for _ in range(2):  # warm-up: the first passes allocate
            net(x)
        for _ in range(CALIBRATION_PASSES):
            t0 = time.perf_counter()
            net(x)
            times.append(time.perf_counter() - t0)
    units = []
    burn_units(UNIT_CALIBRATION)  # warm-up
    for _ in range(5):
        t0 = time.perf_counter()
        burn_units(UNIT_CALIBRATION)
        units.append((time.perf_counter() - t0) / UNIT_CALIBRATION)
    fwd = sorted(times)[len(times) // 2] * 1000.0
    # 3 x the forward's wall time: backward is about twice the forward
    pace = torch.tensor([3.0 * fwd, sorted(units)[len(units) // 2] * 1000.0, fwd])
    if world > 1:
        dist.all_reduce(pace)
        pace /= world
    PACE.set(float(pace[0]), float(pace[1]))
    return float(pace[2])


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

    step_now = [0]
    slow = rank == args.slow_rank and (args.slow_ms > 0 or args.slow_factor > 0)
    burn = rank == args.burn_rank and args.burn_factor > 0

    def on(active: bool) -> bool:
        return active and step_now[0] >= args.cause_from

    def slow_extra() -> None:
        if on(slow):
            PACE.sleep(args.slow_ms, args.slow_factor)

    def burn_extra() -> None:
        if on(burn):
            PACE.burn(args.burn_factor)

    torch.manual_seed(0)
    net = Net(args.features, args.width, args.depth).to(device)
    fwd_ms = calibrate(net, args, device, world)
    if slow and args.slow_phase == "forward":
        net.extra_fwd = slow_extra
    if slow and args.slow_phase == "backward":
        net.extra_bwd = slow_extra
    if burn and args.burn_phase == "forward":
        net.extra_fwd = burn_extra
    if burn and args.burn_phase == "backward":
        net.extra_bwd = burn_extra
    model: nn.Module = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(net, device_ids=[local] if cuda else None)
    opt_extra = (slow_extra if slow and args.slow_phase == "optimizer"
                 else burn_extra if burn and args.burn_phase == "optimizer" else None)
    opt_cls = slow_sgd(opt_extra) if opt_extra is not None else torch.optim.SGD
    opt = opt_cls(model.parameters(), lr=1e-3)
    slow_input = args.slow_factor if slow and args.slow_phase == "input" else 0.0

    leaking = rank == args.leak_rank and args.leak_kib > 0
    leak_until = args.leak_until if args.leak_until >= 0 else args.steps
    leak_floats = int(args.leak_kib * 1024 // 4)
    kept: list[torch.Tensor] = []

    evaluating = args.eval_every > 0 and args.eval_factor > 0 and args.eval_rank in (-1, rank)
    eval_passes = max(1, round(args.eval_factor * args.eval_every * PACE.ms / fwd_ms)) if fwd_ms > 0 else 1
    eval_x = torch.randn(*_shape(args, rank, args.batch), generator=torch.Generator().manual_seed(99)).to(device)

    if args.declare:
        traceml.declare_work(samples_per_step=batch_of(args, rank) * args.accum)
    source = batches(args, rank, world, slow_input)
    for step in range(args.steps):
        step_now[0] = step
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep(3600)  # blocked outside any collective: the others wait for it in theirs
        if rank == args.fail_rank and step == args.fail_step:
            if args.fail_mode == "exit":  # ran out of data: leaves the loop, finishes cleanly
                break
            if args.fail_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fail_mode == "mismatch" and world > 1:
                dist.all_reduce(torch.ones(3))  # one collective the other ranks never call
        # the first batch is fetched before the step, as `for batch in loader:` does; a further
        # micro-batch of gradient accumulation inside it
        first = next(source)
        step_ctx = contextlib.nullcontext() if args.zero_code else traceml.trace_step(model)
        with step_ctx:
            opt.zero_grad(set_to_none=True)
            for micro in range(args.accum):
                x, y = first if micro == 0 else next(source)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                sync = micro == args.accum - 1 or world == 1
                with (contextlib.nullcontext() if sync else model.no_sync()):  # type: ignore[operator]
                    loss = F.mse_loss(model(x), y)
                    (loss / args.accum).backward()
            opt.step()
            if rank == args.fail_rank and step == args.fail_step and args.fail_mode == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if args.sync:
                loss.item()
            if slow and args.slow_phase == "nophase":
                slow_extra()
            if burn and args.burn_phase == "nophase":
                burn_extra()
            if leaking and args.leak_from <= step < leak_until:
                kept.append(torch.ones(leak_floats))
            if leaking and args.leak_touch:
                for t in kept:
                    t.sum()
        if burn and args.burn_phase == "outside":
            burn_extra()
        if args.every and step % args.every == args.every - 1:
            PACE.sleep(args.every_ms, args.every_factor * args.every)
        if evaluating and step % args.eval_every == args.eval_every - 1:
            net.eval()
            with torch.no_grad():
                for _ in range(eval_passes):
                    net(eval_x)
            net.train()
    if world > 1 and args.fail_mode != "exit":
        dist.barrier()
    if world > 1:
        dist.destroy_process_group()
    if rank == 0:
        print(f"scenario: {args.steps} steps done", flush=True)


if __name__ == "__main__":
    main()
