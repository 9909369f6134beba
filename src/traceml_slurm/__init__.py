"""Slurm plugin for TraceML: environment resolver, doctor, sbatch templates."""
