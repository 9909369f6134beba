"""An ordinary DDP training script that knows nothing of TraceML (gloo on CPU).

Knobs (environment): PLAIN_STEPS (optimizer steps, default 40), PLAIN_ACCUM (micro-batches per
optimizer step, default 1), PLAIN_FETCH_MS (sleep in __getitem__ per batch, default 0),
PLAIN_NO_OPTIMIZER=1 (updates parameters by hand: nothing to infer steps from).
Prints "plain: optimizer steps N" at the end on rank 0.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("PLAIN_STEPS", "40"))
ACCUM = int(os.environ.get("PLAIN_ACCUM", "1"))
FETCH_S = float(os.environ.get("PLAIN_FETCH_MS", "0")) / 1000.0
NO_OPT = os.environ.get("PLAIN_NO_OPTIMIZER") == "1"
BATCH = 16


class Synthetic(Dataset):
    def __len__(self):
        return STEPS * ACCUM * BATCH

    def __getitem__(self, i):
        if FETCH_S and i % BATCH == 0:
            time.sleep(FETCH_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Synthetic(), batch_size=BATCH)
    steps = 0
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            if NO_OPT:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
            else:
                opt.step()
                opt.zero_grad()
            steps += 1
    if dist.get_rank() == 0:
        print(f"plain: optimizer steps {steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
