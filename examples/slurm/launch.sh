#!/bin/bash
# Runs once per node (srun starts it). `traceml run` reads the node count, this node's rank, the
# GPUs, the master address and the run name from Slurm itself: no flags needed.
# If traceml is not found on the compute nodes, activate your environment here.
exec traceml run examples/ddp_minimal.py "$@"
