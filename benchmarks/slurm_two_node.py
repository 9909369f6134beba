"""Wall time of the same 2-node DDP job with and without TraceML on the local Slurm cluster.

Run inside the dev cluster's login namespace:

    scripts/dev-cluster exec .venv/bin/python benchmarks/slurm_two_node.py [--reps 3] [--steps 300]

Each pair submits the job once with plain torchrun (the recipe's per-node command, master from
`scontrol show hostnames`) and once with the zero-flag `traceml run`, interleaved, and measures
from the job's start to its end as Slurm records them (StartTime/EndTime have 1 s resolution, so
the wall time is also measured from submission to the job leaving the queue).
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

REPO = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)

PLAIN = """#!/bin/bash
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c 'python -m torch.distributed.run --nnodes=$SLURM_NNODES --node-rank=$SLURM_NODEID \\
  --nproc-per-node=$SLURM_GPUS_ON_NODE --master-addr=$MASTER_ADDR --master-port=29500 {script} --steps {steps}'
"""
TRACED = """#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun traceml run {script} --steps {steps}
"""


def run_job(text: str, env: dict[str, str], work: Path) -> float:
    path = work / f"job-{time.monotonic_ns()}.sh"
    path.write_text(text)
    t0 = time.monotonic()
    job = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2",
                          "--cpus-per-task=1", f"--output={work}/%j.out", str(path)], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.1)
    took = time.monotonic() - t0
    state = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
    if "JobState=COMPLETED" not in state:
        raise SystemExit(f"job {job} did not complete: {(work / f'{job}.out').read_text()[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceml-2node-", dir="/tmp"))
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1",
               TRACEML_LOGS_DIR=str(work / "logs"))
    script = REPO / "examples" / "ddp_minimal.py"
    plain, traced = [], []
    for _ in range(args.reps):
        plain.append(run_job(PLAIN.format(script=script, steps=args.steps), env, work))
        traced.append(run_job(TRACED.format(script=script, steps=args.steps), env, work))
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"2 nodes x 2 workers, ddp_minimal --steps {args.steps}, {args.reps} interleaved pairs "
          f"(submit to leaving the queue)")
    print(f"  plain torchrun  median {p:6.2f} s   runs: {', '.join(f'{x:.1f}' for x in plain)}")
    print(f"  traceml run     median {t:6.2f} s   runs: {', '.join(f'{x:.1f}' for x in traced)}")
    print(f"  difference      {t - p:+6.2f} s   ratio {t / p:.2f}x")


if __name__ == "__main__":
    main()
