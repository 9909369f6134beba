"""A traced training loop fed by a DataLoader whose workers compute or sleep (the input-bound CPU cause).

Environment variables:

``LOADER_WORKERS`` (4)    DataLoader num_workers
``LOADER_WORK`` (cpu)     what producing a batch costs: ``cpu`` (arithmetic in the worker: it
                          needs a CPU) or ``sleep`` (the same time asleep: storage or a remote
                          dataset, no CPU)
``LOADER_MS`` (40)        the cost of one batch, ms of one CPU (or asleep)
``LOADER_STEPS`` (60)     steps
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

import traceml_core as traceml

WORKERS = int(os.environ.get("LOADER_WORKERS", "4"))
WORK = os.environ.get("LOADER_WORK", "cpu")
COST_S = float(os.environ.get("LOADER_MS", "40")) / 1000.0
STEPS = int(os.environ.get("LOADER_STEPS", "60"))


class Batches(Dataset):
    def __len__(self) -> int:
        return STEPS + 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if WORK == "sleep":
            time.sleep(COST_S)
        else:  # CPU time, not wall time: the same work whatever the machine's load
            end = time.thread_time() + COST_S
            x = 0
            while time.thread_time() < end:
                x += sum(j * j for j in range(200))
        return torch.randn(32, 64)


def main() -> None:
    torch.set_num_threads(1)
    traceml.init()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Batches(), batch_size=None, num_workers=WORKERS, persistent_workers=WORKERS > 0)
    for step, x in enumerate(loader):
        if step >= STEPS:
            break
        with traceml.trace_step(model):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
