"""The framework integrations used directly (no `traceml run`), in one process, against a real
loopback receiver: the public callbacks and attach(), step counts, phases that do not overlap,
and a step left open by an exception."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)

PHASES = ("input_ns", "forward_ns", "backward_ns", "optimizer_ns")


def start(sdk, sink):
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run")


def finish(sdk, sink):
    sdk.shutdown()
    assert sink.wait_for(lambda s: 0 in s.ranks and s.ranks[0].bye is not None)
    return sink.ranks[0]


def step_source(log):
    import json

    found = [json.loads(e["text"]) for e in log.events if e.get("kind") == "step_source"]
    return found[-1] if found else None


def assert_rows_consistent(cols):
    for i in range(len(cols["step_ns"])):
        parts = [cols[k][i] for k in PHASES if cols[k][i] != -1]    # -1: not measured
        assert all(p >= 0 for p in parts), (i, parts)
        assert sum(parts) <= cols["step_ns"][i], (i, parts, cols["step_ns"][i])


def data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g))


# ---- Lightning -------------------------------------------------------------------------------------

def _lightning_module(L, fail_at=None):
    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))

        def training_step(self, batch, i):
            if fail_at is not None and i == fail_at:
                raise RuntimeError("bad batch")
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return M()


def _trainer(L, cb, **kw):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[cb], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def test_lightning_callback_one_step_per_optimizer_step_without_overlap(sdk, sink):
    L = pytest.importorskip("lightning.pytorch")
    from traceml_core.integrations.lightning import TraceMLCallback

    start(sdk, sink)
    trainer = _trainer(L, TraceMLCallback(), accumulate_grad_batches=3)
    trainer.fit(_lightning_module(L), DataLoader(data(16 * 30), batch_size=16))
    log = finish(sdk, sink)
    assert trainer.global_step == 10
    assert log.records == 10, "30 batches, accumulate_grad_batches=3: 10 steps"
    cols = log.columns
    assert_rows_consistent(cols)
    # optimizer.step(closure) runs forward and backward inside it; they are not optimizer time
    assert sum(cols["optimizer_ns"]) < sum(cols["forward_ns"]) + sum(cols["backward_ns"])
    assert all(v > 0 for v in cols["forward_ns"]) and all(v > 0 for v in cols["backward_ns"])
    src = step_source(log)
    assert src["source"] == "lightning" and src["accumulation"] == 3


def test_lightning_exception_closes_the_open_step_and_never_raises_from_the_callback(sdk, sink):
    L = pytest.importorskip("lightning.pytorch")
    from traceml_core.integrations.lightning import TraceMLCallback
    from traceml_core.sdk.tracer import TRACER

    start(sdk, sink)
    trainer = _trainer(L, TraceMLCallback())
    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.fit(_lightning_module(L, fail_at=7), DataLoader(data(16 * 20), batch_size=16))
    r = TRACER
    assert r.on and r.active == 0 and r.opt_owner is None, "no step left open"
    # the loop goes on after the exception: a plain traced step records normally
    model = nn.Linear(4, 1)
    with sdk.trace_step(model):
        model(torch.randn(2, 4)).sum().backward()
    log = finish(sdk, sink)
    assert log.records == 7 + 1, "7 completed Lightning steps, the broken one dropped, then 1 traced"


def test_a_wait_between_micro_batches_is_charged_to_no_phase_while_lightning_owns_the_optimizer(sdk, sink):
    """Lightning's driver holds the optimizer for the whole step (to keep torch's optimizer timer
    out of ``optimizer.step(closure)``); a collective outside forward and the optimizer window
    (Lightning broadcasts at every batch start, also on the second micro-batch of an accumulated
    step) is exposed communication of the step, not optimizer time: charged there, its wait of
    milliseconds zeroed the optimizer phase of every step on a 2-rank CI run."""
    from traceml_core.sdk import comm
    from traceml_core.sdk.driven import StepDriver
    from traceml_core.sdk.recorder import C_FWD, C_OPT
    from traceml_core.sdk.source import StepSource
    from traceml_core.sdk.tracer import TRACER

    start(sdk, sink)
    d = StepDriver("Lightning", owns_optimizer=True, owns_forward=True)
    assert d.claim(StepSource("lightning", accumulation=2))
    r = TRACER
    phases = []
    for _micro in range(2):
        d.open()
        phases.append(comm.phase_of(r))        # the batch-start broadcast
        d.forward_begin()
        phases.append(comm.phase_of(r))
        d.forward_end()
    d.optimizer_begin()
    phases.append(comm.phase_of(r))
    d.optimizer_end()
    phases.append(comm.phase_of(r))
    d.close()
    assert phases == [0, C_FWD, 0, C_FWD, C_OPT, 0]
    d.release()
    log = finish(sdk, sink)
    assert log.records == 1


def test_legacy_pytorch_lightning_callback(sdk, sink):
    PL = pytest.importorskip("pytorch_lightning")
    from traceml_core.integrations.lightning import callback_class

    start(sdk, sink)
    cb = callback_class("pytorch_lightning")()
    assert isinstance(cb, PL.Callback)
    trainer = _trainer(PL, cb)
    trainer.fit(_lightning_module(PL), DataLoader(data(16 * 12), batch_size=16))
    log = finish(sdk, sink)
    assert log.records == trainer.global_step == 12
    assert step_source(log)["framework"].startswith("pytorch_lightning")


# ---- Hugging Face ---------------------------------------------------------------------------------

def test_huggingface_callback_used_directly(sdk, sink, tmp_path):
    tf = pytest.importorskip("transformers")
    from traceml_core.integrations.huggingface import TraceMLCallback

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8 * 12

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}

    start(sdk, sink)
    cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    args = tf.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                                gradient_accumulation_steps=2, max_steps=12, save_strategy="no",
                                report_to=[], disable_tqdm=True, use_cpu=True, logging_steps=100)
    trainer = tf.Trainer(model=tf.BertForSequenceClassification(cfg), args=args,
                         train_dataset=Tokens(), callbacks=[TraceMLCallback()])
    trainer.train()
    log = finish(sdk, sink)
    assert log.records == trainer.state.global_step == 12
    cols = log.columns
    assert_rows_consistent(cols)
    assert all(v > 0 for v in cols["forward_ns"]) and all(v > 0 for v in cols["optimizer_ns"])
    src = step_source(log)
    assert src["source"] == "huggingface" and src["accumulation"] == 2


# ---- Accelerate -----------------------------------------------------------------------------------

def test_accelerate_attach_used_directly(sdk, sink):
    accelerate = pytest.importorskip("accelerate")
    from traceml_core.integrations.accelerate import attach

    start(sdk, sink)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(16 * 20), batch_size=16))
    assert attach(acc)
    steps = 0
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
        steps += int(acc.sync_gradients)
    log = finish(sdk, sink)
    assert steps == 10
    # the first inferred step opens at the first backward (its input and forward are not in it)
    assert log.records == steps
    cols = log.columns
    assert_rows_consistent(cols)
    assert all(v > 0 for v in cols["forward_ns"][1:])
    src = step_source(log)
    assert src["source"] == "accelerate" and src["accumulation"] == 2 and src["backward_per_step"] == 2
