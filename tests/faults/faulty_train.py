"""A small DDP training script (gloo, CPU) that can misbehave on purpose, for the fault suite.

It records what *training itself* did, independently of TraceML, in ``$FAULT_PROGRESS_DIR``:
``rank<R>.txt`` gets ``pid <pid>`` at start, ``step <i> <wall time>`` after every step, ``sent <n>``
(records the SDK had handed to the network, from ``traceml.stats()``) just before a fault, and
``result <value>`` at the end (rank 0: a checksum of the trained weights, identical with and
without TraceML because the data and the seed are fixed).

    python -m torch.distributed.run --nproc-per-node=2 faulty_train.py --steps 50
    traceml run faulty_train.py --nproc-per-node=2 --fault=kill --fault-rank=1 --fault-step=20
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import traceml_core as traceml

FAULTS = ("none", "kill", "raise", "hang", "exit", "abort-at-exit", "oom", "hang-in-collective",
          "hang-in-loader", "hold-gil", "long-save", "leave", "mismatch")


class StuckDataset(torch.utils.data.Dataset):
    """A dataset whose loader worker never delivers a batch (a deadlocked loader); the worker
    leaves once its rank is gone, so a killed test run leaves no process behind."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> torch.Tensor:
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)


def busy(seconds: float, model: torch.nn.Module) -> None:
    """Real work for ``seconds``: forward passes of a large batch (an evaluation, a compilation)."""
    x = torch.randn(4096, 16)
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            model(x)


def save_checkpoint(seconds: float, model: torch.nn.Module, where: str, rank: int) -> None:
    """A long checkpoint save that really works for ``seconds``: serialising a large state and
    writing it, again and again (a slow shared file system, a huge model)."""
    state = {"model": model.state_dict(), "blob": torch.randn(1 << 20)}
    path = os.path.join(where, f"ckpt-rank{rank}.pt")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.save(state, path)
    os.unlink(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=0.0, help="extra sleep per step (a steady rate)")
    ap.add_argument("--fault", choices=FAULTS, default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-step", type=int, default=20)
    ap.add_argument("--settle", type=float, default=0.6,
                    help="seconds the faulty rank pauses (stepping is over) before its fault, so "
                         "the records it produced reach the network")
    ap.add_argument("--pause-at", type=int, default=-1, help="every rank pauses before this step")
    ap.add_argument("--pause-s", type=float, default=0.0, help="... for this long (an evaluation)")
    ap.add_argument("--fault-s", type=float, default=40.0,
                    help="long-save: seconds the faulty rank spends saving (real work and writes)")
    ap.add_argument("--pause-work", action="store_true",
                    help="the pause at --pause-at computes (an evaluation) instead of sleeping")
    ap.add_argument("--first-step-s", type=float, default=0.0,
                    help="seconds of real work before the first step (compilation, data set-up)")
    ap.add_argument("--slow-rank", type=int, default=-1, help="this rank does more work each step...")
    ap.add_argument("--slow-ms", type=float, default=0.0, help="... for this many ms (real compute)")
    ap.add_argument("--stop-file", default="",
                    help="train until this file exists (every rank stops at the same step)")
    args = ap.parse_args()

    # the truth the tests check the summary against; unset, it goes nowhere (it used to land in
    # the working directory: rank0.txt in the repository's root after a Slurm test)
    progress_dir = os.environ.get("FAULT_PROGRESS_DIR")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out = (open(os.path.join(progress_dir, f"rank{rank}.txt"), "a", buffering=1) if progress_dir
           else open(os.devnull, "w"))
    out.write(f"pid {os.getpid()}\n")

    traceml.init()
    side = None
    if world > 1:
        dist.init_process_group("gloo")
        if args.fault == "hang-in-collective":
            side = dist.new_group(list(range(world)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + rank)

    if args.first_step_s:
        busy(args.first_step_s, model)
    for step in range(args.steps):
        if args.stop_file:
            stop = torch.tensor([float(os.path.exists(args.stop_file))])
            if world > 1:
                dist.all_reduce(stop)
            if stop.item():
                break
        if args.fault != "none" and rank == args.fault_rank and step == args.fault_step:
            time.sleep(args.settle)
            out.write(f"sent {traceml.stats().get('sent', 0)}\n")
            # the truth of when the fault began, for the hang-latency figures (benchmarks/)
            out.write(f"fault_at {time.time():.6f}\n")
            if args.fault == "long-save":
                save_checkpoint(args.fault_s, model, progress_dir or ".", rank)
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fault == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if args.fault == "exit":
                sys.exit(7)
            if args.fault == "hang":
                while True:  # a deadlock that never returns
                    time.sleep(3600)
            if args.fault == "oom":
                hog = []
                while True:  # touched memory (a filled bytearray), until the OOM killer ends it
                    hog.append(bytearray(b"\1") * (64 << 20))
            if args.fault == "hang-in-collective" and side is not None:
                # a collective only this rank enters (on a second group, so gloo cannot pair it
                # with another one): it waits there for good, and the others wait for it in the
                # next step's gradient all-reduce -- the classic mismatched-collective hang
                dist.all_reduce(torch.ones(1), group=side)
            if args.fault == "leave":
                # this rank's data ran out first: it leaves the loop and ends cleanly, and the
                # others lose their peer in the next gradient all-reduce
                del model, opt
                gc.collect()
                out.close()
                return 0
            if args.fault == "mismatch":
                # a collective only this rank calls (a metric reduced on rank 0 alone): gloo pairs
                # it with the others' next gradient all-reduce, sees the sizes differ and aborts
                dist.all_reduce(torch.ones(3))
            if args.fault == "hold-gil":
                # C code that keeps the GIL while it waits (ctypes.PyDLL does not release it):
                # no other thread of the rank runs Python, not even TraceML's client
                import ctypes

                ctypes.PyDLL(None).sleep(3600)
            if args.fault == "hang-in-loader":
                # the batch never comes: the main thread waits in the DataLoader for good, and
                # the others wait for it in the next step's gradient all-reduce
                next(iter(torch.utils.data.DataLoader(StuckDataset(), num_workers=1)))
        if step == args.pause_at:
            out.write(f"pause {step}\n")
            if args.pause_work:
                busy(args.pause_s, model)
            else:
                time.sleep(args.pause_s)
        x = torch.randn(32, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        with traceml.trace_step(model):
            if rank == args.slow_rank:
                busy(args.slow_ms / 1000.0, model)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if args.step_ms:
            time.sleep(args.step_ms / 1000.0)
        out.write(f"step {step} {time.time():.6f}\n")

    if world > 1:
        dist.barrier()
    if rank == 0:
        with torch.no_grad():
            checksum = sum(float(p.double().sum()) for p in model.parameters())
        out.write(f"result {checksum:.10f}\n")
        print(f"faulty_train: {args.steps} steps, checksum {checksum:.10f}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    # free the DDP model now: left to interpreter exit (it sits in reference cycles), gloo aborts
    # the process now and then, which would make the plain-torchrun baseline flaky
    del model, opt
    gc.collect()
    if args.fault == "abort-at-exit":
        # training is over and every rank said goodbye; the faulty process then dies as gloo can
        # at interpreter exit. It waits (bounded) for the others' goodbyes first: torchrun stops
        # the other ranks as soon as it sees the abort, and a rank still exiting then is killed
        # with its last records (what the summary must count, but not what this fault is about)
        traceml.shutdown()
        out.write("bye\n")
        if rank == args.fault_rank:
            deadline = time.monotonic() + 10
            others = [os.path.join(progress_dir, f"rank{r}.txt") for r in range(world)
                      if r != rank] if progress_dir else []
            while time.monotonic() < deadline and not all(
                    os.path.exists(f) and "bye" in open(f).read().split() for f in others):
                time.sleep(0.02)
            out.close()
            os.abort()
    return 0


if __name__ == "__main__":
    sys.exit(main())
