"""DDP training (gloo, CPU) in which one rank is slower because of what *it* does, not where it runs:
a cause that follows the rank to whichever node it lands on (benchmarks/node_health.py
``--rank-following``).

``RF_CAUSE`` picks the cause on rank ``RF_RANK`` (default 1):

``batch``  its batches are ``RF_FACTOR`` (1.6) times the others' (an uneven sampler): real
           compute in forward and backward, every step
``eval``   it alone evaluates (``RF_EVAL_BATCHES`` forward passes without gradients) after every
           ``RF_EVAL_EVERY``-th step: work only that rank does, between steps
``none``   every rank the same (a control)

Sizes: ``RF_WIDTH`` (512) x 2 layers, ``RF_BATCH`` (256), ``RF_STEPS`` (40).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import traceml_core as traceml

CAUSE = os.environ.get("RF_CAUSE", "batch")
HEAVY = int(os.environ.get("RF_RANK", "1"))
FACTOR = float(os.environ.get("RF_FACTOR", "1.6"))
WIDTH = int(os.environ.get("RF_WIDTH", "512"))
BATCH = int(os.environ.get("RF_BATCH", "256"))
STEPS = int(os.environ.get("RF_STEPS", "40"))
EVAL_EVERY = int(os.environ.get("RF_EVAL_EVERY", "5"))
EVAL_BATCHES = int(os.environ.get("RF_EVAL_BATCHES", "6"))


def main() -> None:
    torch.set_num_threads(1)
    traceml.init()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = int(BATCH * FACTOR) if CAUSE == "batch" and rank == HEAVY else BATCH
    x, y = torch.randn(batch, WIDTH), torch.randn(batch, 1)
    held_out = torch.randn(BATCH, WIDTH)
    for step in range(STEPS):
        with traceml.trace_step(model):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if CAUSE == "eval" and rank == HEAVY and step % EVAL_EVERY == EVAL_EVERY - 1:
            with torch.no_grad():
                for _ in range(EVAL_BATCHES):
                    net(held_out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
