"""What communication timing costs a DDP step with several gradient buckets, side by side with it off.

Two ranks (gloo on loopback, one CPU thread each) train the same DDP model: 8 linear layers of
256x256 with ``bucket_cap_mb=0.25``, so every backward all-reduces ~9 buckets, on a small batch so
the per-bucket cost is visible. Three loops alternate in short blocks, in a rotating order that
both ranks follow in lock step, so drift and neighbours hit them alike:

* ``untraced``: plain torch and DDP (its built-in C++ all-reduce), no TraceML;
* ``comm-off``: ``trace_step`` with every other phase timed and shipped, but no communication
  timing (DDP's built-in all-reduce, no torch.distributed patches, the host clock without the
  reducer's timings);
* ``comm-on``: what ships: the DDP reducer's own timings read at every step exit
  (``timing.ReducerPolling``), exposed wait taken out of backward.

Per block: the median per-step time (wall) and the process CPU time per step (all threads, so
gloo's threads count). Printed: each loop's median, and the paired per-block differences
``comm-on - comm-off`` per step and per bucket (median, IQR). Then the same with one rank, where
the all-reduce itself costs next to nothing (TraceML's own cost, measurable on a busy machine),
and the added cost of one timed explicit ``dist.all_reduce``.

    python benchmarks/comm_overhead.py            # ~3 minutes
    python benchmarks/comm_overhead.py --quick    # ~40 seconds

For the overhead model (a tiny MLP, no collectives), ``step_overhead.py --variants
traced,comm-off`` sets the same two loops side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_common import RUN, TOKEN, SinkProcess, machine, maybe_json, quantiles  # noqa: E402

LOOPS = ("untraced", "comm-off", "comm-on")


def child(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import traceml_core as traceml
    from step_overhead import _install
    from traceml_core.sdk.step import COMM_MEASURED, COMM_NO_GROUP
    from traceml_core.sdk.timing import HostClock
    from traceml_core.sdk.tracer import TRACER

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    assert traceml.init(aggregator=args.sink, token=TOKEN, run_name=RUN, connect_wait=10)
    dist.init_process_group("gloo")
    rec = TRACER.rec

    def net() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(256, 256), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(256, 1))

    hooked = DDP(net(), bucket_cap_mb=0.25)           # built with TraceML installed: watched
    polling = TRACER.timing                           # (its reducer's timings read at step exit)
    TRACER.patches.uninstall()
    plain = DDP(net(), bucket_cap_mb=0.25)            # built without: not watched
    assert getattr(plain, "_traceml_comm", None) is None and hooked._traceml_comm is not None
    x = torch.randn(args.batch, 256)
    opt_h = torch.optim.SGD(hooked.parameters(), lr=1e-4)
    opt_p = torch.optim.SGD(plain.parameters(), lr=1e-4)
    wall, cpu = time.perf_counter_ns, time.process_time_ns
    n = args.steps
    ticks = [0] * (n + 1)

    def run(loop: str) -> tuple[float, float]:
        TRACER.patches.uninstall()
        model, opt = (hooked, opt_h) if loop == "comm-on" else (plain, opt_p)
        if loop != "untraced":
            _install("traced" if loop == "comm-on" else "comm-off", model)
            if loop == "comm-off":
                TRACER.use_timing(HostClock())     # no reducer timings read at step exit
                TRACER.set_comm(COMM_NO_GROUP)     # no communication accounting at all
            else:
                TRACER.use_timing(polling)
                TRACER.set_comm(COMM_MEASURED)
        t0, c0 = wall(), cpu()
        for i in range(n):
            ticks[i] = wall()
            if loop == "untraced":
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with traceml.trace_step(model):
                    model(x).square().mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        ticks[n] = wall()
        c1 = cpu()
        return (statistics.median(ticks[i + 1] - ticks[i] for i in range(n)) / 1000,
                (c1 - c0) / n / 1000)

    for _ in range(2):
        for loop in LOOPS:
            run(loop)                                   # warm-up (and DDP's bucket rebuild)
    res = {loop: {"m": [], "c": []} for loop in LOOPS}
    for i in range(args.reps):
        k = i % len(LOOPS)
        order = list(LOOPS[k:] + LOOPS[:k])
        if (i // len(LOOPS)) % 2:
            order.reverse()
        for loop in order:
            m, c = run(loop)
            res[loop]["m"].append(m)
            res[loop]["c"].append(c)
    explicit = None
    if int(os.environ["WORLD_SIZE"]) == 1:
        explicit = explicit_calls(traceml, dist, torch, _install)
    buckets = hooked.reducer._get_zeros_like_grad_buckets()
    _install("traced")
    traceml.shutdown()
    if rank == 0:
        print("CHILD_RESULT " + json.dumps({"res": res, "buckets": len(buckets), "explicit": explicit,
                                            "params": sum(p.numel() for p in hooked.parameters())}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def explicit_calls(traceml, dist, torch, install) -> dict:  # noqa: ANN001
    """us per ``dist.all_reduce`` of 16 floats inside a traced step, wrapped (comm timing) or not;
    rounds alternate. World size 1: the collective itself costs next to nothing."""
    t = torch.ones(16)
    n = 500
    out: dict[str, list[float]] = {"off": [], "on": []}
    for rnd in range(20):
        for mode in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
            install("traced" if mode == "on" else "comm-off")
            with traceml.trace_step():
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    dist.all_reduce(t)
                out[mode].append((time.perf_counter_ns() - t0) / n / 1000)
    off, on = statistics.median(out["off"]), statistics.median(out["on"])
    return {"calls": n, "off_us": off, "on_us": on, "added_us": on - off}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per block")
    ap.add_argument("--reps", type=int, default=60, help="blocks of each loop")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="20 steps x 18 blocks")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sink", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.steps, args.reps = 20, 18
    figures = {}
    for world in (2, 1):
        got = measure(args, world)
        if got is None:
            return 1
        figures[f"world_{world}"] = got
    maybe_json(args.json, {"machine": machine(), "steps_per_block": args.steps, "blocks": args.reps,
                           "batch": args.batch, **figures})
    return 0


def measure(args: argparse.Namespace, world: int) -> Optional[dict]:
    """Run the loops on ``world`` ranks; print and return rank 0's figures."""
    sink = SinkProcess(expect_byes=world)
    port = free_port()
    procs = []
    try:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            env.pop("TRACEML_RUN_INFO", None)
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--child", "--sink", sink.address, "--steps", str(args.steps),
                 "--reps", str(args.reps), "--batch", str(args.batch)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800) for p in procs]
        totals = sink.totals()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        sink.kill()
    for p, (_out, err) in zip(procs, outs):
        if p.returncode != 0:
            print(err[-3000:], file=sys.stderr)
            return None
    line = next(x for x in outs[0][0].splitlines() if x.startswith("CHILD_RESULT "))
    data = json.loads(line[len("CHILD_RESULT "):])
    res, buckets = data["res"], data["buckets"]

    print(f"\nmachine: {machine()}")
    print(f"DDP, {world} rank(s) (gloo, loopback, 1 thread each), {data['params']:,} parameters in "
          f"{buckets} buckets, batch {args.batch}; {args.reps} blocks x {args.steps} steps per loop, "
          "rotating order; us per step (rank 0)"
          + ("; one rank: the all-reduce is trivial, so this isolates TraceML's own cost" if world == 1 else ""))
    print(f"{'loop':12}{'median step':>14}{'CPU/step':>12}")
    for loop in LOOPS:
        print(f"{loop:12}{quantiles(res[loop]['m'])[1]:14.1f}{quantiles(res[loop]['c'])[1]:12.1f}")
    figures = {"buckets": buckets, "loops": {loop: {"median_step_us": quantiles(res[loop]["m"])[1],
                                                    "cpu_us": quantiles(res[loop]["c"])[1]}
                                             for loop in LOOPS}}
    for a, b in (("comm-off", "comm-on"), ("untraced", "comm-on"), ("untraced", "comm-off")):
        for key, label in (("m", "median step"), ("c", "CPU per step")):
            d = [y - x for x, y in zip(res[a][key], res[b][key])]
            q1, med, q3 = quantiles(d)
            print(f"{b} - {a}, {label}: {med:+.1f} us per step (IQR {q1:+.1f} .. {q3:+.1f})"
                  + (f"; {med / buckets:+.2f} us per bucket" if a == "comm-off" else ""))
            figures[f"{b} - {a}, {label}"] = {"median_us": med, "iqr": [q1, q3],
                                             "per_bucket_us": med / buckets}
    ex = data.get("explicit")
    if ex:
        print(f"explicit dist.all_reduce (16 floats) in a traced step: {ex['off_us']:.1f} us a call "
              f"unwrapped, {ex['on_us']:.1f} us timed: {ex['added_us']:+.1f} us per collective")
        figures["explicit"] = ex
    rank0 = totals["ranks"].get("0", {})
    print(f"traced steps delivered to the receiver: rank 0 {rank0.get('records', 0)}, lost "
          f"{rank0.get('gaps', 0)} (gaps)")
    return figures


if __name__ == "__main__":
    sys.exit(main())
