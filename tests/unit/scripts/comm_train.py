"""Traced steps with known communication, for the communication-timing tests (gloo on CPU; with
``COMM_DEVICE=cuda``, NCCL on the GPUs: benchmarks/gpu_check.py).

Run as several ranks (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and TRACEML_RUN_INFO in the
environment). ``COMM_MODE`` picks the scenario; every rank prints one JSON line of facts the test
compares the telemetry against (``COMM_FACTS {...}``):

``explicit``   per step: one blocking all_reduce of COMM_NUMEL floats, one all_gather, one
               broadcast, a barrier, and one async all_reduce waited on; no DDP
``ddp``        DDP over a model of COMM_LAYERS linear layers (several buckets with a small
               bucket_cap_mb), one backward per step
``nosync``     the same DDP model, COMM_ACCUM micro-batches per step: all but the last under
               ``no_sync()`` (gradient accumulation), so only the last backward communicates
``user_hook``  DDP with a user comm hook registered after construction (fp16 compression)
``grads``      DDP for COMM_STEPS steps; prints a checksum of the final parameters (the test runs
               it with and without TraceML: the gradients must be bit-identical)
``bitwise``    ``grads`` three times in one launch, each on a fresh model with the same seeds: first
               before ``traceml.init()`` (nothing patched: the reference), then traced (CPU: DDP's
               reducer timings), then traced through TraceML's comm hook (CUDA's path, forced on
               CPU); prints the three checksums
``fsdp``       FSDP2 ``fully_shard`` on CPU, if gloo can run it
``prehooked``  a DDP model with a built-in comm hook, built *before* ``traceml.init()`` (on CPU
               DDP's own reducer timer still times it), plus a small explicit all_reduce
Sizes: ``COMM_LAYERS`` x ``COMM_WIDTH`` (model), ``COMM_BATCH`` (DDP batch), ``COMM_BUCKET_MB``
(DDP's bucket_cap_mb, default 0.25 so several buckets), ``COMM_NUMEL`` (explicit collectives).

``inflight``   rank 0 enters an all_reduce that rank 1 joins 1.5 s late; a thread on rank 0
               samples ``TRACER.inflight.oldest()`` meanwhile and reports what it saw
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

MODE = os.environ.get("COMM_MODE", "explicit")
STEPS = int(os.environ.get("COMM_STEPS", "12"))
NUMEL = int(os.environ.get("COMM_NUMEL", "65536"))
LAYERS = int(os.environ.get("COMM_LAYERS", "6"))
WIDTH = int(os.environ.get("COMM_WIDTH", "256"))
ACCUM = int(os.environ.get("COMM_ACCUM", "4"))
BATCH = int(os.environ.get("COMM_BATCH", "32"))
BUCKET_MB = float(os.environ.get("COMM_BUCKET_MB", "0.25"))
TRACE = os.environ.get("COMM_TRACE", "1") == "1"
CUDA = os.environ.get("COMM_DEVICE", "cpu") == "cuda"


def model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def train_ddp(dev: torch.device, step_ctx, rank: int) -> dict:  # noqa: ANN001
    """DDP on a fresh seeded model for STEPS steps (MODE picks the variant); its facts: gradient
    bytes, buckets and a checksum of the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model().to(dev), bucket_cap_mb=BUCKET_MB, device_ids=[dev.index] if CUDA else None)
    if MODE == "user_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    accum = ACCUM if MODE == "nosync" else 1
    g = torch.Generator().manual_seed(1234 + rank)
    for _ in range(STEPS):
        with step_ctx(ddp):
            for micro in range(accum):
                x = torch.randn(BATCH, WIDTH, generator=g).to(dev)
                if micro < accum - 1:
                    with ddp.no_sync():
                        ddp(x).square().mean().backward()
                else:
                    ddp(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    facts: dict = {"grad_bytes": 4 * sum(p.numel() for p in ddp.parameters())}
    facts["buckets"] = len(ddp.reducer._get_zeros_like_grad_buckets()) if hasattr(
        ddp.reducer, "_get_zeros_like_grad_buckets") else None
    digest = hashlib.sha256()
    for p in ddp.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    facts["checksum"] = digest.hexdigest()
    #: which path timed it: TraceML's comm hook leaves its state on the model (sdk/comm.py)
    facts["comm_hook"] = type(getattr(ddp, "_traceml_comm", None)).__name__
    del ddp, opt
    return facts


def main() -> None:
    dev = torch.device("cpu")
    if CUDA:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if MODE == "prehooked":
        dist.init_process_group("gloo")
        from torch.nn.parallel import DistributedDataParallel as DDP

        early = DDP(model(), bucket_cap_mb=0.25)
        early._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    if MODE == "bitwise":      # the untraced reference, before TraceML patches anything
        from contextlib import nullcontext

        dist.init_process_group("gloo")
        plain = train_ddp(dev, lambda model=None: nullcontext(), dist.get_rank())
        gc.collect()
    if TRACE:
        import traceml_core as traceml

        traceml.init()
        step_ctx = traceml.trace_step
    else:
        from contextlib import nullcontext

        def step_ctx(model=None):  # noqa: ANN001
            return nullcontext()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if CUDA else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    facts: dict = {"rank": rank, "world": world, "mode": MODE}
    torch.manual_seed(rank)
    if MODE == "explicit":
        t = torch.ones(NUMEL, device=dev)
        outs = [torch.empty(NUMEL // 4, device=dev) for _ in range(world)]
        for _ in range(STEPS):
            with step_ctx():
                dist.all_reduce(t)
                dist.all_gather(outs, torch.ones(NUMEL // 4, device=dev))
                dist.broadcast(t, src=0)
                dist.barrier()
                work = dist.all_reduce(torch.ones(NUMEL, device=dev), async_op=True)
                work.wait()
            t.fill_(1.0)
        facts["bytes_per_step"] = 4 * (NUMEL + world * (NUMEL // 4) + NUMEL + NUMEL)
        facts["calls_per_step"] = 5
        # outside any traced step: must not be counted
        dist.all_reduce(torch.ones(NUMEL, device=dev))
    elif MODE in ("ddp", "nosync", "user_hook", "grads"):
        facts.update(train_ddp(dev, step_ctx, rank))
    elif MODE == "bitwise":
        facts["checksum_plain"] = plain["checksum"]
        traced = train_ddp(dev, step_ctx, rank)
        facts["checksum_traced"], facts["comm_hook_traced"] = traced["checksum"], traced["comm_hook"]
        from traceml_core.sdk import comm

        # the test hook (TRACEML_TEST_DDP_COMM_HOOK=1, read at import) for the models built from now on
        comm._HOOK_ON_CPU = True
        hooked = train_ddp(dev, step_ctx, rank)
        facts["checksum_hooked"], facts["comm_hook_hooked"] = hooked["checksum"], hooked["comm_hook"]
    elif MODE == "prehooked":
        opt = torch.optim.SGD(early.parameters(), lr=0.01)
        for _ in range(STEPS):
            with step_ctx(early):
                early(torch.randn(32, WIDTH)).square().mean().backward()
                dist.all_reduce(torch.ones(16))
                opt.step()
        facts["grad_bytes"] = 4 * sum(p.numel() for p in early.parameters())
        facts["buckets"] = len(early.reducer._get_zeros_like_grad_buckets())
        del early, opt
    elif MODE == "inflight":
        import threading

        from traceml_core.sdk.tracer import TRACER

        seen: list = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                c = TRACER.inflight.oldest()
                if c is not None:
                    seen.append([c.op, c.nbytes, c.seq, c.started_ns, c.group_size])
                time.sleep(0.05)

        with step_ctx():
            dist.barrier()
            sampler = threading.Thread(target=sample)
            sampler.start()
            if rank == 1:
                time.sleep(1.5)
            dist.all_reduce(torch.ones(1000))
            stop.set()
            sampler.join()
        facts["seen"] = seen[:3]
        facts["seen_n"] = len(seen)
        facts["after"] = TRACER.inflight.oldest()
    elif MODE == "fsdp":
        from torch.distributed.fsdp import fully_shard

        m = model()
        try:
            for layer in m:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(m)
            opt = torch.optim.SGD(m.parameters(), lr=0.01)
            for _ in range(STEPS):
                with step_ctx(m):
                    m(torch.randn(8, WIDTH)).sum().backward()
                    opt.step()
                    opt.zero_grad()
            facts["fsdp"] = "ran"
        except Exception as exc:      # gloo may lack a collective FSDP2 needs
            facts["fsdp"] = f"{type(exc).__name__}: {exc}"[:300]
    print("COMM_FACTS " + json.dumps(facts), flush=True)
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.05)


if __name__ == "__main__":
    main()
