"""Node-level samplers: system (CPU, RAM, GPUs through NVML). Run by the per-node launcher."""

from .nvml import FakeGpu, FakeNvml, NvmlBackend, NvmlUnavailable, PynvmlBackend
from .system import SystemReporter, SystemSampler

__all__ = [
    "FakeGpu", "FakeNvml", "NvmlBackend", "NvmlUnavailable", "PynvmlBackend", "SystemReporter",
    "SystemSampler",
]
