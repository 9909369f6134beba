"""What one traced step records, with real torch on CPU and a real loopback receiver."""

from __future__ import annotations

import copy
import inspect
import time

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from sdk_helpers import tiny_mlp

torch.set_num_threads(1)


class SlowDataset(Dataset):
    """Each item takes ``delay`` seconds to produce (an input-bound loader)."""

    def __init__(self, n: int, delay: float) -> None:
        self.x = torch.randn(n, 32)
        self.y = torch.randn(n, 1)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def train(traceml, model, loader, opt, *, between=None):
    for x, y in loader:
        with traceml.trace_step(model):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if between is not None:
            between()


def finish(sdk, sink, rank=0):
    sdk.shutdown()
    assert sink.wait_for(lambda s: rank in s.ranks and s.ranks[rank].bye is not None)
    return sink.ranks[rank]


def start(sdk, sink, **kw):
    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run", **kw)


def test_phases_are_timed_and_records_arrive_in_order(sdk, sink):
    start(sdk, sink)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(640, 32), torch.randn(640, 1)), batch_size=16)
    for _ in range(3):
        train(sdk, model, loader, opt)
    log = finish(sdk, sink)
    cols = log.columns
    n = 3 * len(loader)
    assert cols["step"] == list(range(n)), "every step arrives once, in order"
    assert log.gaps == 0 and log.duplicates == 0 and log.dropped == 0
    assert log.bye["status"] == "clean" and log.bye["steps"] == n and log.bye["dropped"] == 0
    for name in ("forward_ns", "backward_ns", "optimizer_ns", "input_ns"):
        assert all(v > 0 for v in cols[name]), name
    assert all(v == -1 for v in cols["h2d_ns"]), "no CUDA: h2d is 'not measured'"
    for i in range(n):
        parts = sum(cols[k][i] for k in ("input_ns", "forward_ns", "backward_ns", "optimizer_ns"))
        assert cols["step_ns"][i] >= parts
    assert cols["t_end_ns"] == sorted(cols["t_end_ns"])
    assert abs(cols["t_end_ns"][-1] / 1e9 - time.time()) < 60
    # RSS is sampled at 10 Hz from the start; a run this long has samples
    assert max(cols["mem_peak"]) > 10 * 2**20


def test_input_wait_is_credited_from_a_slow_loader(sdk, sink):
    start(sdk, sink)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(16, 0.025), batch_size=4)    # >= 100 ms per batch
    train(sdk, model, loader, opt)
    cols = finish(sdk, sink).columns
    assert len(cols["step"]) == 4
    for inp, step in zip(cols["input_ns"], cols["step_ns"]):
        assert inp >= 100e6 and step >= inp, "the fetch before each step is its input wait, inside the step"
    # the fetch is not charged to forward (which would then hold >= 100 ms a step): a tiny MLP's
    # forward takes well under a millisecond, and a few ms a step on a loaded machine (CI: 4.4 ms)
    assert sum(cols["forward_ns"]) < sum(cols["input_ns"]) / 4, (cols["forward_ns"], cols["input_ns"])


def test_work_between_steps_is_not_credited(sdk, sink):
    start(sdk, sink)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_loader = DataLoader(TensorDataset(torch.randn(32, 32), torch.randn(32, 1)), batch_size=8)
    eval_loader = DataLoader(SlowDataset(4, 0.1), batch_size=2)   # 200 ms per eval batch
    pause_s, eval_s = 0.3, 0.4

    def evaluate():
        with torch.no_grad():
            for x, _ in eval_loader:
                model(x)

    for _epoch in range(2):
        # checkpoint-like pause after every step, and an evaluation after every epoch
        train(sdk, model, train_loader, opt, between=lambda: time.sleep(pause_s))
        evaluate()
    cols = finish(sdk, sink).columns
    assert len(cols["step"]) == 8
    # On the step clock (what the SDK recorded): the time between one step's end and the next
    # one's start (its end minus its duration, which holds its own fetch) is at least the pause,
    # and the pause plus the evaluation at the epoch boundary. Load only lengthens steps, never
    # this gap, so it holds on any machine; crediting the pause or the eval fetches to a step
    # shrinks it to ~0. (20 ms: t_end_ns moves to the wall clock once per batch.)
    t_end, step_ns = cols["t_end_ns"], cols["step_ns"]
    gaps = [t_end[i] - step_ns[i] - t_end[i - 1] for i in range(1, 8)]
    for i, gap in enumerate(gaps, start=1):
        least = pause_s + (eval_s if i == 4 else 0.0)
        assert gap >= (least - 0.02) * 1e9, (i, gaps, step_ns, cols["input_ns"])
    # and directly: no step after a pause or an evaluation (all but the first) nor its input holds
    # one (300 ms; an eval batch is 200 ms); a warm step of this tiny MLP takes ~1 ms, so the
    # bounds leave room for a loaded machine's stalls (the first, cold, one took 200 ms under load)
    assert max(step_ns[1:]) < 150e6, (step_ns, "300 ms pauses and 400 ms evaluations are outside every step")
    assert max(cols["input_ns"][1:]) < 150e6, (cols["input_ns"], "eval-loader fetches are not the next step's input wait")


def test_fetch_inside_the_step_counts_too(sdk, sink):
    start(sdk, sink)
    loader = DataLoader(SlowDataset(6, 0.01), batch_size=2)
    it = iter(loader)
    for _ in range(3):
        with sdk.trace_step():
            next(it)
    cols = finish(sdk, sink).columns
    assert all(v >= 20e6 for v in cols["input_ns"])
    assert cols["forward_ns"] == [-1, -1, -1], "no model given: forward not measured"


def test_dataloader_iterators_keep_type_and_len(sdk, sink):
    start(sdk, sink)
    ds = TensorDataset(torch.randn(40, 32), torch.randn(40, 1))
    single = DataLoader(ds, batch_size=8)
    it = iter(single)
    assert type(it).__name__ == "_SingleProcessDataLoaderIter"
    assert len(it) == len(single) == 5
    multi = DataLoader(SlowDataset(8, 0.01), batch_size=4, num_workers=1)
    it2 = iter(multi)
    assert type(it2).__name__ == "_MultiProcessingDataLoaderIter" and len(it2) == 2
    with sdk.trace_step():
        next(it2)
    with sdk.trace_step():
        next(it2)
    cols = finish(sdk, sink).columns
    assert sum(cols["input_ns"]) >= 40e6, "worker-process fetches are timed in the parent"
    assert sdk.wrap_dataloader(single) is single


def test_wrapped_plain_iterable_keeps_len_and_times_fetches(sdk, sink):
    start(sdk, sink)

    class Stream:
        def __init__(self):
            self.name = "stream"

        def __len__(self):
            return 3

        def __iter__(self):
            for i in range(3):
                time.sleep(0.01)
                yield i

    wrapped = sdk.wrap_dataloader(Stream())
    assert len(wrapped) == 3 and wrapped.name == "stream"
    for item in wrapped:
        with sdk.trace_step():
            pass
    cols = finish(sdk, sink).columns
    assert len(cols["input_ns"]) == 3 and all(v >= 9e6 for v in cols["input_ns"])


def test_traced_model_still_behaves_like_the_model(sdk, sink):
    start(sdk, sink)
    model = tiny_mlp()
    x = torch.randn(4, 32)
    before = inspect.signature(model.forward)
    with sdk.trace_step(model):
        y = model(x)
    twin = copy.deepcopy(model)            # e.g. an EMA copy
    with torch.no_grad():
        twin[0].weight.add_(1.0)
    assert torch.equal(model(x), y), "the original is unchanged"
    assert not torch.equal(twin(x), y), "the copy runs its own weights"
    assert inspect.signature(model.forward) == before
    other = nn.Sequential(nn.Linear(32, 1))     # same class, never traced
    with sdk.trace_step(model):
        other(x)
    cols = finish(sdk, sink).columns
    assert cols["forward_ns"][0] > 0
    assert cols["forward_ns"][1] == 0, "an untraced module of the same class is not counted"


def test_nested_trace_step_is_one_step(sdk, sink):
    start(sdk, sink)
    with sdk.trace_step():
        with sdk.trace_step():
            time.sleep(0.005)
    with sdk.trace_step():
        pass
    cols = finish(sdk, sink).columns
    assert cols["step"] == [0, 1] and cols["step_ns"][0] >= 5e6


class Flaky(nn.Module):
    """Raises in forward and in its optimizer's step the first time (e.g. a skipped OOM batch)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            raise ValueError("bad batch")
        return self.lin(x)


class FlakySGD(torch.optim.SGD):
    calls = 0

    def step(self, closure=None):
        FlakySGD.calls += 1
        if FlakySGD.calls == 1:
            raise RuntimeError("bad step")
        return super().step(closure)


def test_exceptions_inside_a_step_propagate_and_later_steps_are_still_timed(sdk, sink):
    start(sdk, sink)
    model = Flaky()
    opt = FlakySGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    with pytest.raises(ValueError):
        with sdk.trace_step(model):
            model(x)
    with pytest.raises(RuntimeError):
        with sdk.trace_step(model):
            model(x).sum().backward()
            opt.step()
    with sdk.trace_step(model):
        model(x).sum().backward()
        opt.step()
    cols = finish(sdk, sink).columns
    assert cols["step"] == [0], "a step whose block raised is not a step: only the third is recorded"
    assert cols["forward_ns"][0] > 0 and cols["optimizer_ns"][0] > 0


@pytest.mark.parametrize("torch_hook", ["profile_hook_step", "absent"])
def test_optimizers_created_before_and_after_init_are_timed(sdk, sink, monkeypatch, torch_hook):
    """``absent``: a torch whose Optimizer has no ``profile_hook_step`` staticmethod to go through
    (the same function as a plain attribute): every optimizer class's step is wrapped directly,
    classes defined after init() too, and the optimizer's own step hooks still run."""
    from torch.optim.optimizer import Optimizer

    from traceml_core.sdk.tracer import TRACER

    TRACER.patches.uninstall()                        # a fresh process: nothing patched yet
    if torch_hook == "absent":
        import functools

        monkeypatch.setattr(Optimizer, "profile_hook_step",
                            functools.partial(Optimizer.profile_hook_step))

    class EarlyOpt(torch.optim.SGD):
        pass

    class LateOpt(torch.optim.SGD):
        pass

    model = tiny_mlp()
    early = EarlyOpt(model.parameters(), lr=0.01)     # torch wraps EarlyOpt.step now
    start(sdk, sink)
    late = LateOpt(model.parameters(), lr=0.01)       # and LateOpt.step after init

    class NewOpt(Optimizer):                          # a user's optimizer, defined after init
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])

    new = NewOpt(model.parameters(), lr=0.01)
    hook_calls = []
    for opt in (early, late, new):
        opt.register_step_post_hook(lambda o, a, k: hook_calls.append(type(o).__name__))
    x, y = torch.randn(8, 32), torch.randn(8, 1)
    for opt in (early, late, early, new):
        with sdk.trace_step(model):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with sdk.trace_step(model):       # a step without an optimizer step
        model(x)
    cols = finish(sdk, sink).columns
    assert all(v > 0 for v in cols["optimizer_ns"][:4]) and cols["optimizer_ns"][4] == 0
    assert cols["backward_ns"][4] == 0
    assert hook_calls == ["EarlyOpt", "LateOpt", "EarlyOpt", "NewOpt"], "the optimizers' hooks run"
    TRACER.patches.uninstall()
    assert "__init_subclass__" not in Optimizer.__dict__, "uninstall puts Optimizer back"


def test_tracing_a_model_does_not_keep_it_alive(sdk, sink):
    """The SDK remembers traced models by id only. Holding the model would keep its memory, and a
    DDP model's process group, alive until interpreter exit, where gloo's threads can abort the
    rank ("terminate called without an active exception") after training succeeded."""
    import gc
    import weakref

    start(sdk, sink)
    x = torch.randn(4, 32)
    model = tiny_mlp()
    with sdk.trace_step(model):
        model(x)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None, "the traced model was freed once the script dropped it"
    second = tiny_mlp()                  # may reuse the freed address: still registered and timed
    with sdk.trace_step(second):
        second(x)
    cols = finish(sdk, sink).columns
    assert cols["forward_ns"][0] > 0 and cols["forward_ns"][1] > 0


def test_steps_without_a_loader_say_input_is_not_measured(sdk, sink):
    """A get_batch() function is no DataLoader: input_ns is -1 ("not measured"), never 0; the
    same fetches through wrap_dataloader are timed."""
    start(sdk, sink)
    model = tiny_mlp()

    def batches():
        while True:
            time.sleep(0.005)
            yield torch.randn(4, 32)

    plain = batches()
    for _ in range(3):
        x = next(plain)
        with sdk.trace_step(model):
            model(x)
    wrapped = iter(sdk.wrap_dataloader(range(3)))
    for _ in range(3):
        next(wrapped)
        time.sleep(0.005)
        with sdk.trace_step(model):
            model(torch.randn(4, 32))
    cols = finish(sdk, sink).columns
    assert cols["input_ns"][:3] == [-1, -1, -1]
    assert all(v > 0 for v in cols["input_ns"][3:])
