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

Target: at most 5 us per step.
"""

from __future__ import annotations

import argparse
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
from traceml_core.sdk import hotpath, patches  # noqa: E402

TARGET_US = 5.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="steps per block")
    ap.add_argument("--reps", type=int, default=300, help="blocks of each loop (even)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="100 steps x 60 blocks")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--breakdown", action="store_true",
                    help="instead: where the overhead goes, per hooked call (clock reads around "
                         "each call, traced vs untraced, medians)")
    args = ap.parse_args()
    if args.breakdown:
        return breakdown(args)
    if args.quick:
        args.steps, args.reps = 100, 60

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
        rec = hotpath.REC

        wall, cpu = time.perf_counter_ns, time.process_time_ns
        n = args.steps
        ticks = [0] * (n + 1)       # the same per-iteration clock reads in both loops

        def per_step(t_end: int) -> float:
            ticks[n] = t_end
            return statistics.median([ticks[i + 1] - ticks[i] for i in range(n)])

        def untraced() -> tuple[float, float, float]:
            hotpath.set_recorder(None)
            patches.uninstall()
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

        def traced() -> tuple[float, float, float]:
            patches.install_global()
            patches.register_model(rec, model)
            hotpath.set_recorder(rec)
            it = iter(loader)
            i = 0
            t0, c0 = wall(), cpu()
            for x, y in it:
                ticks[i] = wall()
                with traceml.trace_step(model):
                    loss = F.mse_loss(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                i += 1
            t1, c1 = wall(), cpu()
            return (t1 - t0) / n, (c1 - c0) / n, per_step(t1)

        for _ in range(3):
            traced()
            untraced()                               # warm-up, not counted
        res: dict[str, list[float]] = {k: [] for k in ("wa", "wb", "ca", "cb", "ma", "mb")}
        gc.collect()
        for i in range(args.reps):
            if i % 2 == 0:
                a = untraced()
                b = traced()
            else:
                b = traced()
                a = untraced()
            for key, va, vb in (("w", a[0], b[0]), ("c", a[1], b[1]), ("m", a[2], b[2])):
                res[key + "a"].append(va / 1000)
                res[key + "b"].append(vb / 1000)
        patches.install_global()
        hotpath.set_recorder(rec)
        steps_traced = rec.count
        traceml.shutdown()
        st = traceml.stats()
        totals = sink.totals()
    finally:
        sink.kill()

    rank = totals["ranks"].get("0", {})
    rows = []
    figures: dict[str, dict[str, float]] = {}
    for key, label in (("m", "median step"), ("w", "wall, mean"), ("c", "CPU, mean")):
        a, b = res[key + "a"], res[key + "b"]
        d = [y - x for x, y in zip(a, b)]
        q1, med, q3 = quantiles(d)
        am, bm = quantiles(a)[1], quantiles(b)[1]
        figures[key] = {"untraced_us": am, "traced_us": bm, "overhead_us": med, "iqr": [q1, q3]}
        rows.append(f"{label:14}{am:10.2f}{bm:10.2f}{med:12.2f}{f'{q1:.2f} .. {q3:.2f}':>18}"
                    f"{100 * med / am:9.2f} %")
    print(f"machine: {machine()}, torch {torch.__version__}")
    print(f"tiny MLP 32-64-1, batch {args.batch}, 1 thread; {args.reps} blocks x {args.steps} steps "
          f"per loop, alternating; us per step")
    print(f"{'':14}{'untraced':>10}{'traced':>10}{'overhead':>12}{'IQR of pairs':>18}{'relative':>11}")
    for row in rows:
        print(row)
    print("  median step: per block, the median of per-step times (robust to preemption by other "
          "load); mean: block time / steps, wall clock and process CPU time (all threads)")
    print(f"traced loop records every phase (input wait, forward, backward, optimizer, memory) and "
          f"ships it: {rank.get('records', 0)} of {steps_traced} traced steps reached the receiver "
          f"(lost {st['lost']}, sequence gaps {rank.get('gaps')})")
    head = figures["m"]["overhead_us"]
    met = head <= TARGET_US
    print(f"per-step overhead {head:.2f} us (median step); target <= {TARGET_US:.0f} us: "
          f"{'MET' if met else 'NOT MET'}")
    maybe_json(args.json, {
        "machine": machine(), "torch": torch.__version__, "steps_per_block": args.steps,
        "blocks": args.reps, "median_step": figures["m"], "wall_mean": figures["w"],
        "cpu_mean": figures["c"], "delivered": rank.get("records", 0),
        "traced_steps": steps_traced, "lost": st["lost"], "target_us": TARGET_US, "met": met,
    })
    return 0


def breakdown(args: argparse.Namespace) -> int:
    """Per hooked call: median time of the call traced minus untraced, clock reads around each."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from traceml_core.sdk import api
    from traceml_core.sdk.hotpath import NULL_CONTEXT, StepContext, StepRecorder

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = 50
    loader = DataLoader(TensorDataset(torch.randn(n * args.batch, 32), torch.randn(n * args.batch, 1)),
                        batch_size=args.batch)
    rec = StepRecorder(max_batches=1 << 30)         # no client: the hot path alone
    api._session = api._Session()
    pc = time.perf_counter_ns
    samples: dict[tuple[str, bool], list[int]] = {}
    names = ("fetch", "trace_step+enter", "forward", "backward", "opt.step", "exit", "whole step")
    reps = 30 if args.quick else 80
    for rep in range(reps):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            hotpath.set_recorder(None)
            patches.uninstall()
            api._CTX = NULL_CONTEXT
            if on:
                patches.install_global()
                patches.register_model(rec, model)
                hotpath.set_recorder(rec)
                api._CTX = StepContext(rec)
            it = iter(loader)
            while True:
                a = pc()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                b = pc()
                with traceml.trace_step(model):
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
                    samples.setdefault((name, on), []).append(v)
            rec.sealed.clear()
    hotpath.set_recorder(None)
    print(f"machine: {machine()}, torch {torch.__version__}; {reps} x {n} steps each way")
    print(f"{'call':18}{'untraced ns':>13}{'traced ns':>11}{'added ns':>10}")
    total = 0.0
    for name in names:
        off = statistics.median(samples[(name, False)])
        on_ = statistics.median(samples[(name, True)])
        if name != "whole step":
            total += on_ - off
        print(f"{name:18}{off:13,.0f}{on_:11,.0f}{on_ - off:10,.0f}")
    print(f"{'sum of calls':18}{'':24}{total:10,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
