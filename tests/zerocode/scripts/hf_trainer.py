"""An ordinary Hugging Face Trainer script (a tiny random-init BERT built from a config, no
download) that knows nothing of TraceML. Knobs (environment): ZC_STEPS (optimizer steps, default
30), ZC_ACCUM (gradient_accumulation_steps, default 1), ZC_CALLBACK=1 (pass TraceMLCallback
explicitly), ZC_OUT (output dir). Prints "huggingface: optimizer steps N" on rank 0.
"""

import os

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

STEPS = int(os.environ.get("ZC_STEPS", "30"))
ACCUM = int(os.environ.get("ZC_ACCUM", "1"))
BATCH = 8


class Tokens(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 500, (n, 32), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(
        output_dir=os.environ.get("ZC_OUT", "hf_out"), per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM, max_steps=STEPS, learning_rate=1e-3,
        logging_steps=10, save_strategy="no", report_to=[], disable_tqdm=True,
        use_cpu=True, dataloader_num_workers=0, ddp_backend="gloo",
    )
    callbacks = []
    if os.environ.get("ZC_CALLBACK") == "1":
        from traceml_core.integrations.huggingface import TraceMLCallback

        callbacks.append(TraceMLCallback())
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(STEPS * ACCUM * BATCH * world),
                      callbacks=callbacks)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"huggingface: optimizer steps {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
