"""Steps inferred from optimizer steps (a script without trace_step), in one process, with real
torch and a real loopback receiver; and trace_step taking the steps over."""

from __future__ import annotations

import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
PHASES = ("input_ns", "forward_ns", "backward_ns", "optimizer_ns")


def start(sdk, sink):
    from traceml_core.sdk.tracer import TRACER

    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run")
    assert TRACER.start_inference()


def finish(sdk, sink):
    from traceml_core.sdk.tracer import TRACER

    sdk.shutdown()
    assert sink.wait_for(lambda s: 0 in s.ranks and s.ranks[0].bye is not None)
    TRACER.inference.stop()
    return sink.ranks[0]


def sources(log):
    return [json.loads(e["text"]) for e in log.events if e.get("kind") == "step_source"]


def loader(n=16 * 12):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=16)


def test_one_step_per_optimizer_step_with_accumulation_counted(sdk, sink):
    start(sdk, sink)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader()):
        nn.functional.mse_loss(model(x), y).backward()
        if i % 3 == 2:
            opt.step()
            opt.zero_grad()
    model(torch.randn(4, 32))     # work after the last optimizer step: never a step
    log = finish(sdk, sink)
    assert log.records == 4, "12 batches, 3 per optimizer step"
    cols = log.columns
    for i in range(4):
        assert sum(cols[k][i] for k in PHASES if cols[k][i] > 0) <= cols["step_ns"][i]
    assert all(v == -1 for v in cols["forward_ns"]), "no DDP model: forward is not measured"
    assert all(v > 0 for v in cols["backward_ns"]) and all(v > 0 for v in cols["optimizer_ns"])
    assert all(v > 0 for v in cols["input_ns"][1:]), "fetches inside the inferred step are input"
    final = sources(log)[-1]
    assert final["source"] == "inferred" and final["backward_per_step"] == 3
    assert final["backward_steps"] == [4, 4] and final["forward"] is False


def test_a_second_optimizer_does_not_split_the_step(sdk, sink):
    start(sdk, sink)
    g, d = nn.Linear(8, 8), nn.Linear(8, 1)
    og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    for _ in range(6):
        d(g(torch.randn(4, 8))).mean().backward()
        og.step()
        od.step()
    log = finish(sdk, sink)
    assert log.records == 6


def test_trace_step_takes_the_steps_over(sdk, sink):
    from traceml_core.sdk.tracer import TRACER

    start(sdk, sink)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):                       # inferred
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    for _ in range(5):                       # the script's own steps from here on
        with sdk.trace_step(model):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.step()                       # two optimizer steps inside one traced step
    assert not TRACER.infer and TRACER.owners.owner is None
    log = finish(sdk, sink)
    assert log.records == 3 + 5
    assert [s["source"] for s in sources(log)][-1] == "trace_step"
    assert all(v > 0 for v in log.columns["forward_ns"][3:]), "the traced model's forward"


def test_closure_forward_and_backward_are_not_optimizer_time(sdk, sink):
    """optimizer.step(closure) (LBFGS) runs forward and backward inside the optimizer call."""
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run")
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(64, 32), torch.randn(64, 1)

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(5):
        with sdk.trace_step(model):
            opt.step(closure)
    log = finish(sdk, sink)
    cols = log.columns
    for i in range(5):
        parts = [cols[k][i] for k in PHASES if cols[k][i] != -1]    # -1: not measured (input)
        assert all(p >= 0 for p in parts) and sum(parts) <= cols["step_ns"][i], parts
        assert cols["forward_ns"][i] > 0 and cols["backward_ns"][i] > 0
