"""Checkpoint saves timed in the worker (sdk/spans.py): one span per save, the outermost of nested
ones, with the rank's step and whether it ran inside a traced step; the script's global step from
``trace_step(step=...)`` marked only when it stops following the rank's own count."""

from __future__ import annotations

import io

import torch

from traceml_core.sdk import spans
from traceml_core.sdk.tracer import TRACER


def test_a_save_is_one_span_and_nested_saves_are_not_counted_twice(monkeypatch):
    got = []
    monkeypatch.setattr(spans, "own_steps", lambda: 0)   # no steps yet (whatever tests ran before)
    spans.install(lambda kind, payload: got.append((kind, payload)) or True)
    assert got == [("progress", {"step": 0, "gstep": None, "start": None, "end": None})]
    monkeypatch.setattr(TRACER, "on", True)
    outer = spans.timed(lambda: torch.save({"w": torch.zeros(4)}, io.BytesIO()), "framework.save")
    outer()                                       # a framework's saver calling torch.save: one span
    torch.save({"w": torch.zeros(4)}, io.BytesIO())
    kinds = [(k, p["api"]) for k, p in got[1:]]
    assert kinds == [("span", "framework.save"), ("span", "torch.save")]
    span = got[-1][1]
    assert span["span"] == "checkpoint" and span["dur_ns"] > 0 and span["in_step"] is False
    assert span["step"] == 0 and span["gstep"] is None
    # the global step: marked once while it follows the rank's count, again when it jumps
    got.clear()
    spans.PROGRESS.step(40)
    monkeypatch.setattr(spans, "own_steps", lambda: 1)
    spans.PROGRESS.step(41)
    assert [p["gstep"] for _, p in got] == [40]
    torch.save({}, io.BytesIO())
    assert got[-1][1]["gstep"] == 41                 # the save after step 41 carries it
    monkeypatch.setattr(spans, "own_steps", lambda: 2)
    spans.PROGRESS.step(10)                          # the script went back: a new mark
    assert [p["gstep"] for k, p in got if k == "progress"] == [40, 10]
    monkeypatch.setattr(spans, "own_steps", lambda: 5)
    spans.PROGRESS.final()                           # the last step (the rank's 5th), at shutdown
    assert got[-1][1]["step"] == 4 and got[-1][1]["gstep"] == 12 and got[-1][1]["end"] > 0
