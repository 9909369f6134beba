"""The doctor's view of NVML: a small interface, the real pynvml backend, and a fake for tests.

The GPU checks need four facts per device (index, UUID, memory, compute processes) and the driver
version. They read them through :class:`Nvml`, so unit tests run the same checks against
:class:`FakeNvml` on machines without GPUs. ``pynvml`` (package nvidia-ml-py) is imported only when
a check asks for NVML; a node without the driver raises :class:`NvmlUnavailable` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node; ``str()`` says why (no driver, no pynvml, init error)."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: Optional[int] = None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    processes: tuple[GpuProcess, ...] = ()


class Nvml(Protocol):
    def driver_version(self) -> str: ...

    def devices(self) -> list[GpuDevice]: ...


@dataclass
class FakeNvml:
    """An NVML with the devices you give it (for tests, and for machines without GPUs)."""

    gpus: Sequence[GpuDevice] = field(default_factory=list)
    driver: str = "550.54.15"

    def driver_version(self) -> str:
        return self.driver

    def devices(self) -> list[GpuDevice]:
        return list(self.gpus)


def fake_gpus(n: int, *, used: int = 0, processes: Sequence[Sequence[GpuProcess]] = ()) -> list[GpuDevice]:
    """``n`` identical 80 GB devices, optionally with memory used and processes on some of them."""
    out = []
    for i in range(n):
        procs = tuple(processes[i]) if i < len(processes) else ()
        out.append(GpuDevice(i, "NVIDIA H100 80GB HBM3", f"GPU-{i:08x}-fake", 80 * 1024**3, used, procs))
    return out


class PynvmlBackend:
    """The real NVML through pynvml. Created by :func:`load_nvml`."""

    def __init__(self, pynvml) -> None:  # type: ignore[no-untyped-def]
        self._nv = pynvml

    def driver_version(self) -> str:
        v = self._nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def devices(self) -> list[GpuDevice]:
        nv = self._nv
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                procs = tuple(GpuProcess(int(p.pid), _mem(p.usedGpuMemory))
                              for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
            except nv.NVMLError:
                procs = ()
            out.append(GpuDevice(i, name.decode() if isinstance(name, bytes) else str(name),
                                 uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                                 int(mem.total), int(mem.used), procs))
        return out


def _mem(value) -> Optional[int]:  # type: ignore[no-untyped-def]
    # NVML reports "not available" (in containers, without permission) as None or a huge sentinel
    if value is None or value >= (1 << 63):
        return None
    return int(value)


def load_nvml() -> PynvmlBackend:
    """Initialise the real NVML or raise :class:`NvmlUnavailable` naming the reason."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise NvmlUnavailable("the pynvml module (package nvidia-ml-py) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise NvmlUnavailable("libnvidia-ml.so.1 is not found: no NVIDIA driver on this node") from None
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    except OSError as exc:
        raise NvmlUnavailable(f"loading NVML failed: {exc}") from None
    return PynvmlBackend(pynvml)
