"""The one NVML layer: an interface, the real pynvml backend, and a fake with the same interface.

Both readers of GPU facts use it: the launcher's system sampler (utilisation, memory, temperature,
power at 1 Hz) and ``traceml slurm doctor`` (device list with names, UUIDs and processes, driver
version). :class:`PynvmlBackend` is the real one (``pynvml`` from the ``nvidia-ml-py``
distribution, imported only when NVML is first used); :class:`FakeNvml` serves scripted devices to
tests and to anyone checking the GPU path on a machine without a GPU; product code never picks it
on its own.

Errors: starting NVML raises :class:`NvmlUnavailable` with a one-line reason (no pynvml, no
driver, init failure); one field of one device that cannot be read raises :class:`NvmlFieldError`
(power on some boards, temperature inside some VMs), and the caller reports that field as not
measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; ``str()`` says why (no driver, no pynvml, init error)."""


class NvmlFieldError(Exception):
    """One field of one device could not be read."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    #: None when NVML does not say (in containers, without permission)
    used_bytes: Optional[int] = None


@dataclass(frozen=True)
class GpuDevice:
    """One device as the doctor sees it (a snapshot)."""

    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    processes: tuple[GpuProcess, ...] = ()


class NvmlBackend(Protocol):
    def init(self) -> None:
        """Start NVML; raises :class:`NvmlUnavailable` with a one-line reason."""

    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle_by_index(self, index: int) -> Any: ...
    def handle_by_uuid(self, uuid: str) -> Any: ...
    def index(self, handle: Any) -> int: ...
    def name(self, handle: Any) -> str: ...
    def uuid(self, handle: Any) -> str: ...
    def utilization_pct(self, handle: Any) -> int: ...
    def memory(self, handle: Any) -> tuple[int, int]:
        """(used bytes, total bytes)"""

    def temperature_c(self, handle: Any) -> int: ...
    def power_w(self, handle: Any) -> float: ...
    def processes(self, handle: Any) -> tuple[GpuProcess, ...]: ...
    def devices(self) -> list[GpuDevice]: ...


class _Devices:
    """``devices()`` for any backend, from its per-field reads (one implementation for both)."""

    def devices(self: Any) -> list[GpuDevice]:
        out = []
        for i in range(self.device_count()):
            h = self.handle_by_index(i)
            used, total = self.memory(h)
            try:
                procs = self.processes(h)
            except NvmlFieldError:
                procs = ()
            out.append(GpuDevice(i, self.name(h), self.uuid(h), total, used, procs))
        return out


class PynvmlBackend(_Devices):
    """NVML through ``pynvml``; every call is a few microseconds, fine at 1 Hz."""

    def __init__(self) -> None:
        self._nv: Any = None

    def init(self) -> None:
        if self._nv is not None:
            return
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            raise NvmlUnavailable("the pynvml module (package nvidia-ml-py) is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise NvmlUnavailable("libnvidia-ml.so.1 is not found: no NVIDIA driver on this node") from None
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {_reason(exc)}") from None
        except OSError as exc:
            raise NvmlUnavailable(f"loading NVML failed: {_reason(exc)}") from None
        self._nv = pynvml

    def shutdown(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None

    def _call(self, fn: str, *args: Any) -> Any:
        if self._nv is None:
            raise NvmlFieldError("NVML is not initialised")
        try:
            return getattr(self._nv, fn)(*args)
        except Exception as exc:
            raise NvmlFieldError(_reason(exc)) from None

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle_by_index(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def handle_by_uuid(self, uuid: str) -> Any:
        return self._call("nvmlDeviceGetHandleByUUID", uuid)

    def index(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetIndex", handle))

    def name(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetName", handle))

    def uuid(self, handle: Any) -> str:
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def utilization_pct(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", handle).gpu)

    def memory(self, handle: Any) -> tuple[int, int]:
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return int(info.used), int(info.total)

    def temperature_c(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetTemperature", handle, self._nv.NVML_TEMPERATURE_GPU))

    def power_w(self, handle: Any) -> float:
        return float(self._call("nvmlDeviceGetPowerUsage", handle)) / 1000.0   # milliwatts

    def processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        return tuple(GpuProcess(int(p.pid), _mem(p.usedGpuMemory))
                     for p in self._call("nvmlDeviceGetComputeRunningProcesses", handle))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mem(value: Any) -> Optional[int]:
    # NVML reports "not available" (in containers, without permission) as None or a huge sentinel
    if value is None or value >= (1 << 63):
        return None
    return int(value)


def load_nvml() -> PynvmlBackend:
    """The real NVML, started; raises :class:`NvmlUnavailable` naming the reason."""
    backend = PynvmlBackend()
    backend.init()
    return backend


@dataclass
class FakeGpu:
    """One scripted device: values are returned as given; ``unsupported`` names failing fields."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    util_pct: int = 0
    mem_used: int = 0
    mem_total: int = 80 * 1024**3
    temp_c: int = 40
    power_w: float = 100.0
    processes: tuple[GpuProcess, ...] = ()
    unsupported: set[str] = field(default_factory=set)


class FakeNvml(_Devices):
    """Same interface as :class:`PynvmlBackend`, over :class:`FakeGpu` entries.

    ``FakeNvml(unavailable="NVML Shared Library Not Found")`` behaves like a machine without a
    driver. ``calls`` counts field reads, so a test can check the sampler's rate.
    """

    def __init__(self, gpus: Optional[Sequence[FakeGpu]] = None, *, unavailable: Optional[str] = None,
                 driver: str = "550.54.15") -> None:
        self.gpus = list(gpus or [])
        self.unavailable = unavailable
        self.driver = driver
        self.initialized = False
        self.calls = 0

    def init(self) -> None:
        if self.unavailable is not None:
            raise NvmlUnavailable(self.unavailable)
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def driver_version(self) -> str:
        return self.driver

    def device_count(self) -> int:
        return len(self.gpus)

    def handle_by_index(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise NvmlFieldError("Invalid Argument")
        return index

    def handle_by_uuid(self, uuid: str) -> Any:
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return i
        raise NvmlFieldError("Not Found")

    def index(self, handle: Any) -> int:
        return int(handle)

    def _get(self, handle: Any, name: str) -> Any:
        self.calls += 1
        gpu = self.gpus[handle]
        if name in gpu.unsupported:
            raise NvmlFieldError("Not Supported")
        return getattr(gpu, name)

    def name(self, handle: Any) -> str:
        return str(self.gpus[handle].name)

    def uuid(self, handle: Any) -> str:
        return str(self.gpus[handle].uuid)

    def utilization_pct(self, handle: Any) -> int:
        return int(self._get(handle, "util_pct"))

    def memory(self, handle: Any) -> tuple[int, int]:
        return int(self._get(handle, "mem_used")), int(self._get(handle, "mem_total"))

    def temperature_c(self, handle: Any) -> int:
        return int(self._get(handle, "temp_c"))

    def power_w(self, handle: Any) -> float:
        return float(self._get(handle, "power_w"))

    def processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        return tuple(self._get(handle, "processes"))


def fake_gpus(n: int, *, used: int = 0, processes: Sequence[Sequence[GpuProcess]] = ()) -> list[FakeGpu]:
    """``n`` identical 80 GB devices, optionally with memory used and processes on some of them."""
    return [FakeGpu(uuid=f"GPU-{i:08x}-fake", mem_used=used,
                    processes=tuple(processes[i]) if i < len(processes) else ()) for i in range(n)]
