"""Unmodified Lightning, Hugging Face Trainer and Accelerate scripts under `traceml run` (2 ranks,
gloo DDP on CPU): one step per optimizer step, gradient accumulation folded in and said so,
phases that add up to at most the step, a verdict. (The integrations used directly, in one
process: tests/unit/sdk/test_integrations.py.)"""

from __future__ import annotations

import pytest

from zc import assert_real_steps, optimizer_steps, traceml_run

pytest.importorskip("lightning")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _optimizer_share(data):
    """The optimizer's share of forward+backward+optimizer: Lightning runs forward and backward
    inside optimizer.step(closure); counted there too, the optimizer would hold most of it."""
    r = data["ranks"][0]["phases"]
    return r["optimizer"]["mean_ms"] / (r["forward"]["mean_ms"] + r["backward"]["mean_ms"] + r["optimizer"]["mean_ms"])


def test_lightning_unmodified(tmp_path):
    res = traceml_run(tmp_path, "lightning_ddp.py", env={"ZC_STEPS": "30"})
    n = optimizer_steps(res["out"], "lightning")
    assert n == 30
    data = assert_real_steps(res, steps=n, source="lightning")
    assert data["steps"]["framework"].startswith("lightning ")
    assert _optimizer_share(data) < 0.5
    assert "Steps: from Lightning's hooks" in res["text"]


def test_lightning_gradient_accumulation_and_validation_with_the_callback_given_explicitly(tmp_path):
    """The user passes TraceMLCallback and `traceml run` adds its own: one of them records."""
    res = traceml_run(tmp_path, "lightning_ddp.py",
                      env={"ZC_STEPS": "24", "ZC_ACCUM": "2", "ZC_VALIDATE": "1", "ZC_CALLBACK": "1"})
    n = optimizer_steps(res["out"], "lightning")
    assert n == 24
    data = assert_real_steps(res, steps=n, source="lightning")
    assert data["steps"]["accumulation"] == 2
    assert "gradient accumulation 2: each step holds 2 micro-batches" in res["text"]
    assert _optimizer_share(data) < 0.5


def test_legacy_pytorch_lightning_unmodified(tmp_path):
    res = traceml_run(tmp_path, "lightning_ddp.py", env={"ZC_STEPS": "25", "ZC_PACKAGE": "pytorch_lightning"})
    n = optimizer_steps(res["out"], "lightning")
    data = assert_real_steps(res, steps=n, source="lightning")
    assert data["steps"]["framework"].startswith("pytorch_lightning ")


def test_huggingface_trainer_unmodified_with_gradient_accumulation(tmp_path):
    res = traceml_run(tmp_path, "hf_trainer.py", env={"ZC_STEPS": "26", "ZC_ACCUM": "2"})
    n = optimizer_steps(res["out"], "huggingface")
    assert n == 26
    data = assert_real_steps(res, steps=n, source="huggingface")
    assert data["steps"]["framework"].startswith("transformers ")
    assert data["steps"]["accumulation"] == 2
    assert "gradient accumulation 2: each step holds 2 micro-batches" in res["text"]
    assert all(r["phases"]["forward"]["mean_ms"] > 0 for r in data["ranks"])


def test_accelerate_loop_unmodified_with_gradient_accumulation(tmp_path):
    res = traceml_run(tmp_path, "accelerate_loop.py", env={"ZC_STEPS": "30", "ZC_ACCUM": "2"})
    n = optimizer_steps(res["out"], "accelerate")
    assert n == 30
    data = assert_real_steps(res, steps=n, source="accelerate")
    assert data["steps"]["accumulation"] == 2 and data["steps"]["forward_measured"] is True
    assert "gradient accumulation 2" in res["text"]
