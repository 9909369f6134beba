"""The one NVML layer: an interface, the real pynvml backend, and a fake with the same interface.

Both readers of GPU facts use it: the launcher's system sampler (utilisation, memory, temperature,
power at 1 Hz) and ``traceml slurm doctor`` (device list with names, UUIDs and processes, driver
version). :class:`PynvmlBackend` is the real one (``pynvml`` from the ``nvidia-ml-py``
distribution, imported only when NVML is first used); :class:`FakeNvml` serves scripted devices to
tests and to anyone checking the GPU path on a machine without a GPU; product code never picks it
on its own.

Health (the doctor's ``gpu.health`` and the node store): :meth:`_Devices.health` reads, through the
same backend interface, the reasons the clocks are held back (thermal and power slowdowns), the
ECC error counts, a failed row remapping, and the XID errors the driver logged for the device;
:class:`GpuHealth` says which of them are hardware faults and which slowdowns, one rule for the
real NVML and the fake.

Errors: starting NVML raises :class:`NvmlUnavailable` with a one-line reason (no pynvml, no
driver, init failure); one field of one device that cannot be read raises :class:`NvmlFieldError`
(power on some boards, temperature inside some VMs), and the caller reports that field as not
measured.
"""

from __future__ import annotations

import os
import re
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


#: NVML's clock event reasons (``nvmlClocksEventReason*``, formerly ``...ThrottleReason*``): bit -> name
CLOCK_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks",
}
#: the reasons that mean the GPU is held back by heat or power (a cooling or power-supply problem
#: of the node): idle, application clocks and the software power cap under full load are normal
SLOWDOWNS = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
#: XIDs that are the hardware's (NVIDIA's XID catalog): double-bit ECC (48), micro-controller
#: halts (61, 62), row remapping failure (64), NVLink (74), fallen off the bus (79), high
#: single-bit ECC rate (92), uncontained ECC (95), GSP errors (119, 120), unrecovered ECC (140).
#: The others (13, 31, 43, 45, ...: an application's fault, a process killed) are shown, not blamed.
HARDWARE_XIDS = frozenset({48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140})


@dataclass(frozen=True)
class GpuHealth:
    """One device's health facts (None: not measured: the board or the driver does not say)."""

    index: int
    uuid: str
    clock_reasons: Optional[tuple[str, ...]] = None
    ecc_corrected: Optional[int] = None
    ecc_uncorrected: Optional[int] = None
    #: a row remapping failed (A100 and later: the memory cannot repair itself any more)
    remap_failed: Optional[bool] = None
    #: XID errors the driver logged for this device since boot (the kernel log)
    xids: Optional[tuple[int, ...]] = None
    #: why a field is not measured ("xids": "the kernel log is not readable: ...")
    unmeasured: tuple[tuple[str, str], ...] = ()

    @property
    def faults(self) -> list[str]:
        """Hardware faults: each enough on its own to distrust the device."""
        out = []
        hw = sorted({x for x in self.xids or () if x in HARDWARE_XIDS})
        if hw:
            out.append("XID " + ", ".join(str(x) for x in hw))
        if self.ecc_uncorrected:
            out.append(f"{self.ecc_uncorrected} uncorrectable ECC error(s)")
        if self.remap_failed:
            out.append("a failed memory row remapping")
        return out

    @property
    def slowdowns(self) -> list[str]:
        return [r for r in self.clock_reasons or () if r in SLOWDOWNS]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "clock_reasons": list(self.clock_reasons or ())
                if self.clock_reasons is not None else None, "ecc_corrected": self.ecc_corrected,
                "ecc_uncorrected": self.ecc_uncorrected, "remap_failed": self.remap_failed,
                "xids": list(self.xids) if self.xids is not None else None, "faults": self.faults,
                "slowdowns": self.slowdowns, "unmeasured": dict(self.unmeasured)}


def clock_reasons(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_REASONS.items() if mask & bit)


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
    def clock_reason_mask(self, handle: Any) -> int:
        """The bit mask of why the clocks are below their maximum now (:data:`CLOCK_REASONS`)."""

    def ecc_errors(self, handle: Any) -> tuple[int, int]:
        """(corrected, uncorrected) ECC errors since the driver loaded (volatile)."""

    def remap_failed(self, handle: Any) -> bool: ...
    def xids(self, handle: Any) -> tuple[int, ...]:
        """XID errors logged for this device since boot."""

    def devices(self) -> list[GpuDevice]: ...
    def health(self, handle: Any) -> GpuHealth: ...


class _Devices:
    """``devices()`` and ``health()`` for any backend, from its per-field reads (one
    implementation for both)."""

    def health(self: Any, handle: Any) -> GpuHealth:
        missing: list[tuple[str, str]] = []

        def read(name: str, fn: Any) -> Any:
            try:
                return fn(handle)
            except NvmlFieldError as exc:
                missing.append((name, str(exc)))
                return None

        mask = read("clock_reasons", self.clock_reason_mask)
        ecc = read("ecc", self.ecc_errors)
        remap = read("remap_failed", self.remap_failed)
        xids = read("xids", self.xids)
        return GpuHealth(self.index(handle), self.uuid(handle), clock_reasons(mask) if mask is not None else None,
                         ecc[0] if ecc else None, ecc[1] if ecc else None, remap,
                         tuple(xids) if xids is not None else None, tuple(missing))

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

    def clock_reason_mask(self, handle: Any) -> int:
        fn = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons")
              else "nvmlDeviceGetCurrentClocksThrottleReasons")
        return int(self._call(fn, handle))

    def ecc_errors(self, handle: Any) -> tuple[int, int]:
        nv = self._nv
        corrected = self._call("nvmlDeviceGetTotalEccErrors", handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                               nv.NVML_VOLATILE_ECC)
        uncorrected = self._call("nvmlDeviceGetTotalEccErrors", handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                 nv.NVML_VOLATILE_ECC)
        return int(corrected), int(uncorrected)

    def remap_failed(self, handle: Any) -> bool:
        _corr, _unc, _pending, failure = self._call("nvmlDeviceGetRemappedRows", handle)
        return bool(failure)

    def xids(self, handle: Any) -> tuple[int, ...]:
        bus = _pci_key(_text(self._call("nvmlDeviceGetPciInfo", handle).busId))
        if bus is None:
            raise NvmlFieldError("the device's PCI bus id is not known")
        return tuple(kernel_xids().get(bus, ()))


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


#: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\): (\d+)")
#: how much of the kernel log is read at most (its ring buffer is usually 256 KiB to a few MiB)
KMSG_MAX_BYTES = 8 << 20
_kernel_xids: Optional[dict[tuple[int, int, int], list[int]]] = None


def _pci_key(bus_id: str) -> Optional[tuple[int, int, int]]:
    """(domain, bus, device) of ``00000000:3B:00.0`` (NVML) or ``0000:3b:00`` (the kernel log)."""
    m = re.match(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)", bus_id.strip())
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def kernel_xids(path: str = "/dev/kmsg") -> dict[tuple[int, int, int], list[int]]:
    """XID errors in the kernel log by PCI device, read once per process. NVML keeps no history
    of XIDs; the driver logs each one. Raises :class:`NvmlFieldError` when the log is not readable
    (``kernel.dmesg_restrict`` for a user that is not root)."""
    global _kernel_xids
    if _kernel_xids is not None and path == "/dev/kmsg":
        return _kernel_xids
    out: dict[tuple[int, int, int], list[int]] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise NvmlFieldError(f"the kernel log ({path}) is not readable: {exc.strerror or exc}") from None
    try:
        if path == "/dev/kmsg":
            os.lseek(fd, 0, os.SEEK_SET)  # from the oldest record kept
        seen = 0
        while seen < KMSG_MAX_BYTES:
            try:
                chunk = os.read(fd, 8192)  # /dev/kmsg: one record per read
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: records overwritten while reading; go on
                    continue
                raise NvmlFieldError(f"the kernel log ({path}) cannot be read: {exc.strerror or exc}") from None
            if not chunk:
                break
            seen += len(chunk)
            for m in _XID.finditer(chunk.decode("utf-8", "replace")):
                out.setdefault((int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)), []).append(int(m.group(4)))
    finally:
        os.close(fd)
    if path == "/dev/kmsg":
        _kernel_xids = out
    return out


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
    #: health facts, raw as NVML gives them: the clock event reason bits, volatile ECC counts,
    #: a failed row remapping, and the XIDs logged for the device
    clock_reasons: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remap_failed: bool = False
    xids: tuple[int, ...] = ()
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

    def clock_reason_mask(self, handle: Any) -> int:
        return int(self._get(handle, "clock_reasons"))

    def ecc_errors(self, handle: Any) -> tuple[int, int]:
        return int(self._get(handle, "ecc_corrected")), int(self._get(handle, "ecc_uncorrected"))

    def remap_failed(self, handle: Any) -> bool:
        return bool(self._get(handle, "remap_failed"))

    def xids(self, handle: Any) -> tuple[int, ...]:
        return tuple(self._get(handle, "xids"))


def fake_gpus(n: int, *, used: int = 0, processes: Sequence[Sequence[GpuProcess]] = ()) -> list[FakeGpu]:
    """``n`` identical 80 GB devices, optionally with memory used and processes on some of them."""
    return [FakeGpu(uuid=f"GPU-{i:08x}-fake", mem_used=used,
                    processes=tuple(processes[i]) if i < len(processes) else ()) for i in range(n)]
