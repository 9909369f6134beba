"""The skips CI expects (tests/conftest.py fails the run on any other with TRACEML_STRICT_SKIPS=1):
``(test id pattern, a piece of the skip's reason, why it is right in CI)``."""

from __future__ import annotations

EXPECTED: list[tuple[str, str, str]] = [
    ("tests/slurm/test_doctor_pyslurm.py::*", "pyslurm runs only on the Slurm 25.11 cluster",
     "the real pyslurm exists only for Slurm 25.11; CI runs these on its 25.11 cluster"),
    ("tests/unit/test_benchmarks_smoke.py::*", "a CUDA device is present",
     "gpu_check.py is a device run (only on a machine with a GPU)"),
]
