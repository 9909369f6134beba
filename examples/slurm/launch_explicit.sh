#!/bin/bash
# The same launch with every value passed explicitly, for sites that want to see or pin them.
# Flags beat what Slurm says. This script runs once per node, so $SLURM_NODEID is expanded on
# each node (never write these flags directly on the srun line in the sbatch file).
MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"
# The ports TraceML derives from the job id when none is given: different for each job, so two jobs
# sharing a node never clash (fixed ports such as 29500/29765 would).
PORT0=$(( 61440 + 4 * (SLURM_JOB_ID % 1024) ))
exec traceml run \
  --mode=summary \
  --run-name="${RUN_NAME:-ddp-${SLURM_JOB_ID}}" \
  --nnodes="${SLURM_NNODES}" \
  --node-rank="${SLURM_NODEID}" \
  --nproc-per-node="${SLURM_GPUS_ON_NODE:-1}" \
  --master-addr="${MASTER_ADDR}" \
  --master-port="${PORT0}" \
  --aggregator-port=$(( PORT0 + 1 )) \
  examples/ddp_minimal.py "$@"
