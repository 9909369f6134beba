"""A small interface over NVML, so the system sampler does not care where GPU numbers come from.

:class:`PynvmlBackend` is the real one (``pynvml`` from the ``nvidia-ml-py`` distribution).
:class:`FakeNvml` implements the same interface with scripted devices: tests (and anyone checking
the GPU path on a machine without a GPU) use it; product code never picks it on its own.

Per-field reads raise :class:`NvmlFieldError` when a device does not support a field (power on
some boards, temperature inside some VMs); the sampler then reports that one field as ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (no library, no driver, no device)."""


class NvmlFieldError(Exception):
    """One field of one device could not be read."""


class NvmlBackend(Protocol):
    def init(self) -> None:
        """Start NVML; raises :class:`NvmlUnavailable` with a one-line reason."""

    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def handle_by_index(self, index: int) -> Any: ...
    def handle_by_uuid(self, uuid: str) -> Any: ...
    def index(self, handle: Any) -> int: ...
    def utilization_pct(self, handle: Any) -> int: ...
    def memory(self, handle: Any) -> tuple[int, int]:
        """(used bytes, total bytes)"""

    def temperature_c(self, handle: Any) -> int: ...
    def power_w(self, handle: Any) -> float: ...


class PynvmlBackend:
    """NVML through ``pynvml``; every call is a few microseconds, fine at 1 Hz."""

    def __init__(self) -> None:
        self._nv: Any = None

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            raise NvmlUnavailable(_reason(exc)) from None
        self._nv = pynvml

    def shutdown(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, fn)(*args)
        except Exception as exc:
            raise NvmlFieldError(_reason(exc)) from None

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle_by_index(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def handle_by_uuid(self, uuid: str) -> Any:
        return self._call("nvmlDeviceGetHandleByUUID", uuid)

    def index(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetIndex", handle))

    def utilization_pct(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", handle).gpu)

    def memory(self, handle: Any) -> tuple[int, int]:
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return int(info.used), int(info.total)

    def temperature_c(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetTemperature", handle, self._nv.NVML_TEMPERATURE_GPU))

    def power_w(self, handle: Any) -> float:
        return float(self._call("nvmlDeviceGetPowerUsage", handle)) / 1000.0   # milliwatts


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@dataclass
class FakeGpu:
    """One scripted device: values are returned as given; ``unsupported`` names failing fields."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util_pct: int = 0
    mem_used: int = 0
    mem_total: int = 80 * 1024**3
    temp_c: int = 40
    power_w: float = 100.0
    unsupported: set[str] = field(default_factory=set)


class FakeNvml:
    """Same interface as :class:`PynvmlBackend`, over :class:`FakeGpu` entries.

    ``FakeNvml(unavailable="NVML Shared Library Not Found")`` behaves like a machine without a
    driver. ``calls`` counts reads, so a test can check the sampler's rate.
    """

    def __init__(self, gpus: Optional[list[FakeGpu]] = None, *, unavailable: Optional[str] = None) -> None:
        self.gpus = list(gpus or [])
        self.unavailable = unavailable
        self.initialized = False
        self.calls = 0

    def init(self) -> None:
        if self.unavailable is not None:
            raise NvmlUnavailable(self.unavailable)
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

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

    def utilization_pct(self, handle: Any) -> int:
        return int(self._get(handle, "util_pct"))

    def memory(self, handle: Any) -> tuple[int, int]:
        return int(self._get(handle, "mem_used")), int(self._get(handle, "mem_total"))

    def temperature_c(self, handle: Any) -> int:
        return int(self._get(handle, "temp_c"))

    def power_w(self, handle: Any) -> float:
        return float(self._get(handle, "power_w"))
