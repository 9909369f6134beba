"""Per-step overhead of ``trace_step`` with every phase timed, over an untraced loop.

Paired in one run, as issue 3 asks: a tiny CPU MLP, ``torch.set_num_threads(1)``, the same model,
optimizer and DataLoader; many short blocks of the untraced and the traced loop alternate (ABBA
order) so drift and noisy neighbours hit both alike, and the overhead is the median of the paired
per-step differences. Three estimates, all printed: per block the *median* per-step time (the
headline: a step preempted by other load on a shared machine does not move a median), and the
block's mean step on the wall clock and in process CPU time (all threads, so the client thread's
encoding and sending count). The traced loop is the real thing: ``traceml.init()`` connected to a
receiver in another process, input wait / forward / backward / optimizer / memory all recorded
and shipped. For the untraced repetitions every torch patch is removed, so the baseline is plain
torch, not torch with pass-through wrappers.

    python benchmarks/step_overhead.py            # ~1 minute
    python benchmarks/step_overhead.py --quick    # ~15 seconds
    python benchmarks/step_overhead.py --variants traced,closures,comm-off   # side by side
    python benchmarks/step_overhead.py --breakdown --variants traced,bare    # per hooked call

``--variants`` sets other traced loops beside the shipped one in the same run (same rotating
block order): ``closures`` (the same hook bodies compiled over ``*args, **kwargs`` instead of the
wrapped function's own parameters: what codegen.py saves), ``comm-off`` (no communication
timing) and ``bare`` (the floor: the same wrappers with nothing in them but their clock reads;
traced minus bare is what the tracer's own bookkeeping costs).

Target: at most 5 us per step.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import traceml_core as traceml  # noqa: E402
from _bench_common import RUN, TOKEN, SinkProcess, machine, maybe_json, quantiles  # noqa: E402
from traceml_core.sdk import hooks  # noqa: E402
from traceml_core.sdk.recorder import StepRecorder  # noqa: E402
from traceml_core.sdk.tracer import TRACER, Tracer  # noqa: E402

TARGET_US = 5.0


VARIANTS = {
    "traced": "what ships: wrappers compiled with the wrapped function's parameters (codegen.py), "
              "communication timing on",
    "closures": "the same hook bodies compiled over *args/**kwargs (what codegen.py saves)",
    "comm-off": "as traced, without communication timing (no torch.distributed patches)",
    "no-sampler": "as traced, with the work sampler never armed (sdk/worksample.py: what measuring "
                  "the batch and the CPU per phase on sampled steps costs, traced minus this)",
    "bare": "the floor: the same calls wrapped (the same generated wrappers) with nothing but "
            "two clock reads each, trace_step one read at entry and one at exit; nothing recorded",
}

#: a bare wrapper (codegen.py fills in the wrapped function's parameters): its two clock reads
_BARE = """
    def _tm_wrapper({params}):
        _tm_t0 = _tm_pc()
        _tm_out = _tm_orig({call})
        _tm_t.ns += _tm_pc() - _tm_t0
        return _tm_out"""


class Bare:
    """The ``bare`` loop: DataLoader fetch, the model's forward, ``torch.autograd.backward`` and
    the optimizer's step wrapped with two clock reads each, and a step context that reads the
    clock at entry and exit. What any Python-level tracer of these phases pays at least."""

    __slots__ = ("ns", "t0", "undo")

    def __init__(self) -> None:
        self.ns = self.t0 = 0
        self.undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> "Bare":
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> bool:
        self.ns += time.perf_counter_ns() - self.t0
        return False

    def install(self, model: "torch.nn.Module", opt: "torch.optim.Optimizer") -> None:
        from torch.utils.data import dataloader as dl

        from traceml_core.sdk import codegen

        names = {"_tm_pc": time.perf_counter_ns}
        for owner, attr, method in ((dl._BaseDataLoaderIter, "__next__", True),
                                    (torch.autograd, "backward", False),
                                    (type(model), "forward", True), (type(opt), "step", True)):
            orig = getattr(owner, attr)
            self.undo.append((owner, attr, orig))
            setattr(owner, attr, codegen.build(orig, _BARE, names, self, method=method))

    def uninstall(self) -> None:
        while self.undo:
            owner, attr, orig = self.undo.pop()
            setattr(owner, attr, orig)


BARE = Bare()


def _sampler(on: bool) -> None:
    """The work sampler armed as it ships (``on``), or held off (``armed`` stays set, so its
    periodic tick never puts it in the hooks' slot)."""
    from traceml_core.sdk import session

    s = session.current
    sampler = getattr(getattr(s, "cpu", None), "sampler", None)
    if sampler is None:
        return
    if on:
        if sampler.armed and TRACER.events is not sampler:
            sampler.armed = False
    else:
        if TRACER.events is sampler:
            TRACER.events = None
            sampler.recording = False
        sampler.armed = True


def _install(variant: str, model: "torch.nn.Module | None" = None) -> None:
    """Install the torch patches the way ``variant`` wants them, and time ``model``'s forward."""
    _sampler(variant != "no-sampler")
    p = TRACER.patches
    p.uninstall()
    p.specialise = variant != "closures"
    p.comm = variant != "comm-off"
    try:
        p.install_global()
        if model is not None:
            TRACER.models.discard(id(model))
            TRACER.register_model(model)
    finally:
        p.specialise = p.comm = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="steps per block")
    ap.add_argument("--reps", type=int, default=300, help="blocks of each loop (even)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="100 steps x 60 blocks")
    ap.add_argument("--variants", default="traced",
                    help="traced loops to set side by side against the untraced one, comma-"
                         "separated: " + "; ".join(f"{k}: {v}" for k, v in VARIANTS.items()))
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--breakdown", action="store_true",
                    help="instead: where the overhead goes, per hooked call (clock reads around "
                         "each call, traced vs untraced, medians)")
    ap.add_argument("--calls", action="store_true",
                    help="instead: the cost of one wrapped call (forward, backward, optimizer step "
                         "around a function that does nothing), generated wrappers against plain "
                         "closures, in a tight loop: the floor of what each wrapper adds")
    args = ap.parse_args()
    if args.breakdown:
        return breakdown(args)
    if args.calls:
        return calls(args)
    if args.quick:
        args.steps, args.reps = 100, 60
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sink = SinkProcess()
    try:
        assert traceml.init(aggregator=sink.address, token=TOKEN, run_name=RUN, connect_wait=10)
        assert traceml.stats()["connected"], "benchmark receiver not reachable"
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(args.steps * args.batch, 32),
                             torch.randn(args.steps * args.batch, 1))
        loader = DataLoader(data, batch_size=args.batch)
        rec = TRACER.rec

        wall, cpu = time.perf_counter_ns, time.process_time_ns
        n = args.steps
        ticks = [0] * (n + 1)       # the same per-iteration clock reads in both loops

        def per_step(t_end: int) -> float:
            ticks[n] = t_end
            return statistics.median([ticks[i + 1] - ticks[i] for i in range(n)])

        def untraced() -> tuple[float, float, float]:
            TRACER.patches.uninstall()
            BARE.uninstall()
            it = iter(loader)
            i = 0
            t0, c0 = wall(), cpu()
            for x, y in it:
                ticks[i] = wall()
                loss = F.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                i += 1
            t1, c1 = wall(), cpu()
            return (t1 - t0) / n, (c1 - c0) / n, per_step(t1)

        def traced(variant: str) -> tuple[float, float, float]:
            BARE.uninstall()
            if variant == "bare":
                TRACER.patches.uninstall()
                BARE.install(model, opt)
                step = lambda m: BARE  # noqa: E731
            else:
                _install(variant, model)
                step = traceml.trace_step
            it = iter(loader)
            i = 0
            t0, c0 = wall(), cpu()
            for x, y in it:
                ticks[i] = wall()
                with step(model):
                    loss = F.mse_loss(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                i += 1
            t1, c1 = wall(), cpu()
            return (t1 - t0) / n, (c1 - c0) / n, per_step(t1)

        loops = [("untraced", untraced)] + [(v, functools.partial(traced, v)) for v in variants]
        for _ in range(3):
            for _name, fn in loops:
                fn()                                 # warm-up, not counted
        res: dict[str, dict[str, list[float]]] = {name: {"w": [], "c": [], "m": []} for name, _ in loops}
        gc.collect()
        for i in range(args.reps):
            # rotate the order every block (ABBA for two loops) so drift hits every loop alike
            k = i % len(loops)
            order = loops[k:] + loops[:k]
            if (i // len(loops)) % 2:
                order = order[::-1]
            for name, fn in order:
                w, c, m = fn()
                res[name]["w"].append(w / 1000)
                res[name]["c"].append(c / 1000)
                res[name]["m"].append(m / 1000)
        BARE.uninstall()
        _install("traced", model)
        steps_traced = rec.count
        traceml.shutdown()
        st = traceml.stats()
        totals = sink.totals()
    finally:
        sink.kill()

    rank = totals["ranks"].get("0", {})
    print(f"machine: {machine()}, torch {torch.__version__}")
    print(f"tiny MLP 32-64-1, batch {args.batch}, 1 thread; {args.reps} blocks x {args.steps} steps "
          f"per loop, loops in rotating order; us per step")
    for v in variants:
        print(f"  {v}: {VARIANTS[v]}")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'':24}{'untraced':>10}{'traced':>10}{'overhead':>12}{'IQR of pairs':>18}{'relative':>11}")
    for v in variants:
        figures[v] = {}
        for key, label in (("m", "median step"), ("w", "wall, mean"), ("c", "CPU, mean")):
            a, b = res["untraced"][key], res[v][key]
            d = [y - x for x, y in zip(a, b)]
            q1, med, q3 = quantiles(d)
            am, bm = quantiles(a)[1], quantiles(b)[1]
            figures[v][key] = {"untraced_us": am, "traced_us": bm, "overhead_us": med, "iqr": [q1, q3]}
            print(f"{v + ', ' + label:24}{am:10.2f}{bm:10.2f}{med:12.2f}{f'{q1:.2f} .. {q3:.2f}':>18}"
                  f"{100 * med / am:9.2f} %")
    if len(variants) > 1 and "traced" in variants:
        print("side by side (median of paired per-block differences, median step):")
        for v in variants:
            if v == "traced":
                continue
            d = [y - x for x, y in zip(res["traced"]["m"], res[v]["m"])]
            q1, med, q3 = quantiles(d)
            print(f"  {v} - traced: {med:+.2f} us per step (IQR {q1:+.2f} .. {q3:+.2f})")
            figures[v]["minus_traced_us"] = {"median": med, "iqr": [q1, q3]}
    print("  median step: per block, the median of per-step times (robust to preemption by other "
          "load); mean: block time / steps, wall clock and process CPU time (all threads)")
    print(f"traced loops record every phase (input wait, forward, backward, optimizer, memory) and "
          f"ship it: {rank.get('records', 0)} of {steps_traced} traced steps reached the receiver "
          f"(lost {st['lost']}, sequence gaps {rank.get('gaps')})")
    head_variant = "traced" if "traced" in variants else variants[0]
    head = figures[head_variant]["m"]["overhead_us"]
    met = head <= TARGET_US
    print(f"per-step overhead ({head_variant}) {head:.2f} us (median step); target <= {TARGET_US:.0f} "
          f"us: {'MET' if met else 'NOT MET'}")
    maybe_json(args.json, {
        "machine": machine(), "torch": torch.__version__, "steps_per_block": args.steps,
        "blocks": args.reps, "median_step": figures[head_variant]["m"],
        "wall_mean": figures[head_variant]["w"], "cpu_mean": figures[head_variant]["c"],
        "variants": figures, "delivered": rank.get("records", 0),
        "traced_steps": steps_traced, "lost": st["lost"], "target_us": TARGET_US, "met": met,
    })
    return 0


def calls(args: argparse.Namespace) -> int:
    """ns per call of each wrapper, codegen against closures, rounds alternating (ABAB)."""

    class Net:
        def forward(self, x):  # noqa: ANN001
            return x

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,  # noqa: ANN001
                 grad_variables=None, inputs=None):
        return None

    class Opt:
        def step(self, closure=None):  # noqa: ANN001
            return None

    net, opt = Net(), Opt()
    t = Tracer(StepRecorder(max_batches=1 << 30))
    t.models.add(id(net))
    t.time_forward(True)
    kinds = {
        kind: (hooks.forward(Net.forward, t, spec), hooks.backward(backward, t, spec),
               hooks.step(Opt.step, t, spec))
        for kind, spec in (("codegen", True), ("closures", False))
    }
    n = 20_000 if args.quick else 100_000
    pc = time.perf_counter_ns
    res: dict[tuple[str, str], list[float]] = {}
    t.active = 1
    try:
        for rnd in range(10 if args.quick else 30):
            for kind in (("codegen", "closures") if rnd % 2 == 0 else ("closures", "codegen")):
                fwd, bwd, step = kinds[kind]
                for name, call in (("forward", lambda: fwd(net, 1)), ("backward", lambda: bwd(1)),
                                   ("optimizer step", lambda: step(opt))):
                    t0 = pc()
                    for _ in range(n):
                        call()
                    res.setdefault((name, kind), []).append((pc() - t0) / n)
                t0 = pc()
                for _ in range(n):
                    (lambda: None)()
                res.setdefault(("(empty lambda)", kind), []).append((pc() - t0) / n)
    finally:
        t.active = 0
    print(f"machine: {machine()}; ns per call (median of rounds; each includes calling a lambda, "
          "shown last), codegen vs closures")
    print(f"{'wrapper':18}{'codegen':>10}{'closures':>10}{'difference':>12}")
    total = 0.0
    for name in ("forward", "backward", "optimizer step", "(empty lambda)"):
        a = statistics.median(res[(name, "codegen")])
        b = statistics.median(res[(name, "closures")])
        if not name.startswith("("):
            total += b - a
        print(f"{name:18}{a:10.0f}{b:10.0f}{b - a:+12.0f}")
    print(f"closures cost {total:+.0f} ns per traced step (three wrapped calls) in a hot loop")
    return 0


def breakdown(args: argparse.Namespace) -> int:
    """Per hooked call: median time of the call traced minus untraced, clock reads around each
    (per ``--variants`` loop, all in one run)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from traceml_core.sdk import session as sdk_session

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = 50
    loader = DataLoader(TensorDataset(torch.randn(n * args.batch, 32), torch.randn(n * args.batch, 1)),
                        batch_size=args.batch)
    rec = StepRecorder(max_batches=1 << 30)         # no client: the hot path alone
    sdk_session.current = sdk_session.Session(sdk_session.InitArgs())
    TRACER.start(rec, patch=False)
    pc = time.perf_counter_ns
    samples: dict[tuple[str, str], list[int]] = {}
    names = ("fetch", "trace_step+enter", "forward", "backward", "opt.step", "exit", "whole step")
    reps = 30 if args.quick else 80
    loops = ["untraced"] + variants
    for rep in range(reps):
        k = rep % len(loops)
        order = loops[k:] + loops[:k]
        for loop in (order if (rep // len(loops)) % 2 == 0 else order[::-1]):
            TRACER.patches.uninstall()
            BARE.uninstall()
            TRACER.stop()                            # trace_step hands out the no-op context
            step = traceml.trace_step
            if loop == "bare":
                BARE.install(model, opt)
                step = lambda m: BARE  # noqa: E731
            elif loop != "untraced":
                TRACER.on, TRACER.trace_ctx = True, TRACER.step
                _install(loop, model)
            it = iter(loader)
            while True:
                a = pc()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                b = pc()
                with step(model):
                    c = pc()
                    out = model(x)
                    d = pc()
                    loss = F.mse_loss(out, y)
                    opt.zero_grad()
                    e = pc()
                    loss.backward()
                    f = pc()
                    opt.step()
                    g = pc()
                h = pc()
                for name, v in zip(names, (b - a, c - b, d - c, f - e, g - f, h - g, h - a)):
                    samples.setdefault((name, loop), []).append(v)
            rec.sealed.clear()
    BARE.uninstall()
    TRACER.stop()
    print(f"machine: {machine()}, torch {torch.__version__}; {reps} x {n} steps per loop")
    print(f"{'call':18}{'untraced ns':>13}" + "".join(f"{v + ' +ns':>16}" for v in variants))
    totals = {v: 0.0 for v in variants}
    for name in names:
        off = statistics.median(samples[(name, "untraced")])
        row = f"{name:18}{off:13,.0f}"
        for v in variants:
            added = statistics.median(samples[(name, v)]) - off
            if name != "whole step":
                totals[v] += added
            row += f"{added:16,.0f}"
        print(row)
    print(f"{'sum of calls':18}{'':13}" + "".join(f"{totals[v]:16,.0f}" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
