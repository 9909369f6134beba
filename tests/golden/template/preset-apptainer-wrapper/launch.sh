#!/bin/bash
# launch.sh: runs once per node inside the srun step of traceml-train.sbatch (written by
# traceml slurm template, traceml 0.1.0). Regenerate with:
#   traceml slurm template --preset apptainer --apptainer-image /images/train.sif --wrapper --container-mount /data --nodes 2 --gpu-type a100 train.py
# Each node's `traceml run` reads its own node rank, the node count, its GPUs and the master from
# Slurm here, on its own node: never pass --node-rank=$SLURM_NODEID from the batch shell.
set -eo pipefail
exec apptainer exec --nv --bind /data /images/train.sif traceml run --mode=summary train.py
