"""An ordinary Lightning script (LightningModule + Trainer(strategy="ddp")) that knows nothing of
TraceML. Knobs (environment): ZC_STEPS (optimizer steps, default 30), ZC_ACCUM (accumulate_grad_batches,
default 1), ZC_PACKAGE ("lightning" or "pytorch_lightning"), ZC_CALLBACK=1 (pass TraceMLCallback
explicitly), ZC_NODES (num_nodes, default 1), ZC_DEVICES (devices per node, default 2),
ZC_VALIDATE=1 (a validation loop every 10 batches). Prints "lightning: optimizer steps N" on rank 0.
"""

import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("ZC_PACKAGE") == "pytorch_lightning":
    import pytorch_lightning as L
else:
    import lightning.pytorch as L

STEPS = int(os.environ.get("ZC_STEPS", "30"))
ACCUM = int(os.environ.get("ZC_ACCUM", "1"))
BATCH = 16


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data(n):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))


def main():
    torch.manual_seed(0)
    devices = int(os.environ.get("ZC_DEVICES", "2"))
    nodes = int(os.environ.get("ZC_NODES", "1"))
    world = devices * nodes
    callbacks = []
    if os.environ.get("ZC_CALLBACK") == "1":
        from traceml_core.integrations.lightning import callback_class

        callbacks.append(callback_class("pytorch_lightning" if os.environ.get("ZC_PACKAGE") == "pytorch_lightning"
                                        else "lightning.pytorch")())
    validate = os.environ.get("ZC_VALIDATE") == "1"
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp", max_epochs=1,
        accumulate_grad_batches=ACCUM, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=2 if validate else 0, val_check_interval=10 * ACCUM if validate else None,
        num_sanity_val_steps=0,
    )
    model = Regressor()
    train = DataLoader(data(STEPS * ACCUM * BATCH * world), batch_size=BATCH)
    val = DataLoader(data(4 * BATCH), batch_size=BATCH) if validate else None
    trainer.fit(model, train, val)
    if trainer.global_rank == 0:
        print(f"lightning: optimizer steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
