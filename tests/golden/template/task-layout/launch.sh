#!/bin/bash
# launch.sh: runs once per task inside the srun step of traceml-train.sbatch (written by
# traceml slurm template, traceml 0.1.0). Regenerate with:
#   traceml slurm template --layout task --nodes 2 --gpus-per-node 2 --cpus-per-task 8 --time 1:00:00 --wrapper train.py
# Each task's `traceml run` reads its own rank, local rank, the world size and the master from
# Slurm here, in its own task: never pass rank values from the batch shell.
set -eo pipefail
exec traceml run --mode=summary train.py
