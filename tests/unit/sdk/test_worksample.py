"""What a step consumed, measured without code (sdk/worksample.py): the batch the traced model was
given and the training thread's CPU time per phase, on sampled steps, with real torch on CPU and
the real CPU probe, client and loopback receiver. The steps that are not sampled are untouched."""

from __future__ import annotations

import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from sdk_helpers import tiny_mlp

from traceml_core.report.model import CpuThreads
from traceml_core.sdk import session as sessions
from traceml_core.sdk.recorder import C_FWD
from traceml_core.sdk.worksample import WorkSampler, batch_size

torch.set_num_threads(1)


def start(sdk, sink):
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run")


def _fact(sdk, sink) -> CpuThreads:
    sdk.shutdown()
    assert sink.wait_for(lambda s: 0 in s.ranks and s.ranks[0].bye is not None)
    events = [e for e in sink.ranks[0].events if e["kind"] == "cpu_threads"]
    assert events, "no cpu_threads event"
    fact = CpuThreads.of_event(events[-1]["text"])
    assert fact is not None
    return fact


def _steps(sdk, model, batches, opt, *, arm=True, extra=None):
    """Train on ``batches``; before each step, what the client thread does periodically (the CPU
    probe, and the sampler's arming)."""
    for x, y in batches:
        if arm:
            probe = sessions.current.cpu
            probe()
            probe.sampler.tick()
        with sdk.trace_step(model):
            out = model(x) if not isinstance(x, dict) else model(**x)
            loss = ((out - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            if extra is not None:
                extra()
            opt.step()


def test_a_dataloader_batch_and_the_cpu_of_each_phase_reach_node_0(sdk, sink):
    start(sdk, sink)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(48 * 60, 32), torch.randn(48 * 60, 1)), batch_size=48)
    _steps(sdk, model, loader, opt)
    work = _fact(sdk, sink).work
    assert work is not None and work.sampled >= 10, work
    assert work.samples == 48 and work.elements == 48 * 32 and work.tokens is None, work
    for phase in ("forward", "backward", "optimizer"):
        assert work.phase_cpu(phase) is not None and work.phase_cpu(phase) > 0, (phase, work)
    assert work.cpu_ms is not None and work.wall_ms is not None and 0 < work.cpu_ms <= work.wall_ms * 1.05, work


def test_cpu_work_outside_the_phases_shows_in_the_iteration_not_in_them(sdk, sink):
    """Extra matrix products between backward and the optimizer step (in no timed phase) add CPU
    time to the iteration, not to forward, backward or the optimizer."""
    start(sdk, sink)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a = torch.randn(128, 128)
    batches = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(40)]
    _steps(sdk, model, batches, opt, extra=lambda: [torch.mm(a, a) for _ in range(60)])
    heavy = _fact(sdk, sink).work
    assert heavy is not None
    # the products are outside every timed phase: in the iteration's CPU, far above the phases'
    assert heavy.cpu_ms > 3 * sum(heavy.phase_cpu(p) or 0.0 for p in ("forward", "backward", "optimizer")), heavy


def test_token_ids_given_by_keyword_are_counted_as_tokens(sdk, sink):
    class Lm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, input_ids=None, attention_mask=None):  # noqa: ANN001 - a HF-style signature
            return self.head(self.emb(input_ids)).mean(dim=1)

    start(sdk, sink)
    model = Lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [({"input_ids": torch.randint(0, 100, (4, 24)), "attention_mask": torch.ones(4, 24)},
                torch.randn(4, 1)) for _ in range(30)]
    _steps(sdk, model, batches, opt)
    work = _fact(sdk, sink).work
    assert work is not None and work.samples == 4 and work.tokens == 4 * 24, work


def test_the_sampler_leaves_the_slot_empty_between_samples(sdk, sink):
    """After a sampled step the hooks' device-event slot is empty again (a CPU run's steps that are
    not sampled call nothing); without arming, nothing is sampled."""
    start(sdk, sink)
    from traceml_core.sdk.tracer import TRACER

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(12)]
    _steps(sdk, model, batches, opt, arm=False)
    assert TRACER.events is None
    sampler = sessions.current.cpu.sampler
    assert sampler.n == 0
    sampler.arm()
    assert TRACER.events is sampler
    _steps(sdk, model, batches[:2], opt, arm=False)   # the first begins the sample, the second ends it
    assert TRACER.events is None and sampler.n == 1
    _steps(sdk, model, batches[:3], opt, arm=False)
    assert sampler.n == 1
    sdk.shutdown()


def test_what_a_batch_is_made_of():
    x = torch.randn(6, 5)
    assert batch_size(x) == (6, 30, False)
    assert batch_size((torch.zeros(3, 7, dtype=torch.long), x)) == (3, 21, True)
    assert batch_size({"pixel_values": torch.randn(2, 3, 4, 4)}) == (2, 96, False)
    assert batch_size([[{"a": x}]]) == (6, 30, False)
    assert batch_size("text") is None and batch_size(torch.tensor(3.0)) is None and batch_size(None) is None


def test_figures_are_sums_the_report_reads_back():
    class State:
        events = None
        timing = type("T", (), {"events": None})()

    st = State()
    s = WorkSampler(st)
    for _ in range(6):
        s.arm()
        s.begin_step()
        k = s.forward_start(torch.randn(10, 4))
        s.phase_stop(C_FWD, k)
        s.begin_step()
    raw = s.figures()
    assert raw["n"] == 6 and raw["samples"] == 60 and raw["elements"] == 240 and raw["measured"] == 6
    fact = CpuThreads.of_event(json.dumps({"threads": 1, "cpus": 1, "work": raw}))
    assert fact is not None and fact.work is not None and fact.work.samples == 10 and fact.work.sampled == 6
