"""The rank side of the telemetry pipeline.

api.py (the public functions), tracer.py (the process's tracer: step state, timing strategy,
patches, step ownership; its docstring draws the module layout), samplers/ (the node-level
system sampler the launcher runs). Importing this package imports nothing heavy; torch is
imported by ``init()``.
"""
