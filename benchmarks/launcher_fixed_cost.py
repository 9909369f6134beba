"""Launcher fixed cost: `traceml run` vs plain torchrun on the same tiny DDP script.

Paired and interleaved in one run (torchrun, traceml, torchrun, traceml, ...) so machine noise
hits both alike. Prints the median wall time of each, the difference and the ratio.

    python benchmarks/launcher_fixed_cost.py [--reps 5] [--nproc 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = """
import os, torch, torch.distributed as dist
import traceml_core as traceml
traceml.init()
dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
for _ in range(20):
    with traceml.trace_step(model):
        model(torch.randn(4, 8)).sum().backward()
dist.barrier()
dist.destroy_process_group()
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceml-bench-"))
    script = work / "tiny.py"
    script.write_text(TINY)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRACEML_RUN_INFO", None)
    traceml = str(Path(sys.executable).parent / "traceml")
    plain_cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}",
                 "--master-port=29611", str(script)]
    plain, ours = [], []
    for i in range(args.reps):
        plain.append(timed(plain_cmd, env))
        ours.append(timed([traceml, "run", f"--nproc-per-node={args.nproc}", "--master-port=29612",
                           "--aggregator-port=29613", f"--logs-dir={work}/logs", f"--run-name=r{i}",
                           str(script)], env))
    p, o = statistics.median(plain), statistics.median(ours)
    print(f"launcher fixed cost ({args.reps} paired runs, {args.nproc} workers, tiny script)")
    print(f"  plain torchrun  median {p:6.2f} s  (min {min(plain):.2f}, max {max(plain):.2f})")
    print(f"  traceml run     median {o:6.2f} s  (min {min(ours):.2f}, max {max(ours):.2f})")
    print(f"  fixed cost      {o - p:+6.2f} s   ratio {o / p:.2f}x   (target: at most about +1 s)")


if __name__ == "__main__":
    main()
