"""An ordinary Accelerate training loop that knows nothing of TraceML. Knobs (environment):
ZC_STEPS (optimizer steps, default 30), ZC_ACCUM (gradient_accumulation_steps, default 1),
ZC_ATTACH=1 (call traceml_core.integrations.accelerate.attach explicitly).
Prints "accelerate: optimizer steps N" on the main process.
"""

import os

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

STEPS = int(os.environ.get("ZC_STEPS", "30"))
ACCUM = int(os.environ.get("ZC_ACCUM", "1"))
BATCH = 16


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n = STEPS * ACCUM * BATCH * accelerator.num_processes
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if os.environ.get("ZC_ATTACH") == "1":
        from traceml_core.integrations.accelerate import attach

        attach(accelerator)
    steps = 0
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
    if accelerator.is_main_process:
        print(f"accelerate: optimizer steps {steps}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
