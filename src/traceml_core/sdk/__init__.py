"""The rank side of the telemetry pipeline.

api.py (the public functions), hotpath.py (what a traced step touches), patches.py (installing
the torch hooks), cuda_timing.py (CUDA-event phase times), memory.py (mem_peak samples),
samplers/ (the node-level system sampler the launcher runs). Importing this package imports
nothing heavy; torch is imported by ``init()``.
"""
