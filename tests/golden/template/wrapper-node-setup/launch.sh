#!/bin/bash
# launch.sh: runs once per node inside the srun step of traceml-train.sbatch (written by
# traceml slurm template, traceml 0.1.0). Regenerate with:
#   traceml slurm template --nodes 2 --gpus-per-node 2 --setup 'source ~/venv/bin/activate' --node-setup 'module load cuda/12.4' -o jobs train.py
# Each node's `traceml run` reads its own node rank, the node count, its GPUs and the master from
# Slurm here, on its own node: never pass --node-rank=$SLURM_NODEID from the batch shell.
set -eo pipefail
# Per-node setup, inside the step on every node:
module load cuda/12.4
exec traceml run --mode=summary train.py
