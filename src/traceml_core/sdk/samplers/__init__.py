"""Node-level samplers: system (CPU, RAM, GPUs through NVML). Run by the per-node launcher.

``nvml`` is also the doctor's NVML layer (one interface, one real backend, one fake)."""

from .nvml import (FakeGpu, FakeNvml, GpuDevice, GpuProcess, NvmlBackend, NvmlFieldError, NvmlUnavailable,
                   PynvmlBackend, fake_gpus, load_nvml)
from .system import SystemReporter, SystemSampler

__all__ = [
    "FakeGpu", "FakeNvml", "GpuDevice", "GpuProcess", "NvmlBackend", "NvmlFieldError", "NvmlUnavailable",
    "PynvmlBackend", "SystemReporter", "SystemSampler", "fake_gpus", "load_nvml",
]
