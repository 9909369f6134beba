"""Shared set-up for the examples: process group, device, a small model and synthetic data.

Every example runs three ways: ``traceml run --nproc-per-node=2 ex.py`` (telemetry on),
``torchrun --nproc-per-node=2 ex.py`` (telemetry off, says so once) and ``python ex.py`` (one
process, no process group). CPU uses gloo, GPU uses nccl.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class Dist:
    rank: int
    local_rank: int
    world: int
    device: torch.device
    distributed: bool


def setup() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    distributed = world > 1
    if distributed:
        dist.init_process_group(backend=backend)
    return Dist(rank, local_rank, world, device, distributed)


def teardown(d: Dist) -> None:
    if d.distributed:
        dist.barrier()
        dist.destroy_process_group()


def mlp(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def wrap(model: nn.Module, d: Dist) -> Any:
    model = model.to(d.device)
    if not d.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
