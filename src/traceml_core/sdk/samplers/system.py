"""Node-level system sampler: CPU %, RAM, and per-GPU utilisation, memory, temperature, power.

Runs in the per-node launcher (one per node, not per rank) at a low rate (1 Hz by default), so its
cost never lands on a training step. Output follows the protocol's
:data:`~traceml_core.wire.protocol.SYSTEM_FIELDS` / :data:`~traceml_core.wire.protocol.GPU_FIELDS`;
a field that cannot be read on this machine is ``None`` (never a made-up zero).

Without a GPU or driver the sampler says so once (``gpu_note``, and one INFO log line) and keeps
sampling CPU and RAM. CPU and RAM come from ``/proc`` (no psutil dependency); elsewhere they are
``None``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from ...wire.protocol import GPU_FIELDS, SYSTEM_FIELDS
from .nvml import NvmlBackend, NvmlFieldError, NvmlUnavailable, PynvmlBackend

log = logging.getLogger("traceml")


def visible_gpus_from_env(environ: Mapping[str, str]) -> Optional[list[str]]:
    """The GPUs named by ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), or None for "all".

    Caveat: numeric entries are CUDA ordinals and are used as NVML indices; the two orders agree
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (and on most single-type nodes). UUID entries are exact.
    """
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip() and x.strip() != "-1"]


class _CpuTimes:
    def __init__(self, path: str) -> None:
        self.path = path
        self.prev = self._read()

    def _read(self) -> Optional[tuple[int, int]]:
        try:
            with open(self.path, "rb") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != b"cpu":
            return None
        values = [int(x) for x in fields[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)   # idle + iowait
        total = sum(values[:8])                                     # guest time is inside user
        return total, idle

    def percent(self) -> Optional[float]:
        cur = self._read()
        prev, self.prev = self.prev, cur
        if cur is None or prev is None:
            return None
        dt, di = cur[0] - prev[0], cur[1] - prev[1]
        if dt <= 0:
            return None
        return round(100.0 * (dt - di) / dt, 1)


def _meminfo(path: str) -> tuple[Optional[int], Optional[int]]:
    total = avail = None
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                if total is not None and avail is not None:
                    break
    except (OSError, ValueError, IndexError):
        return None, None
    if total is None:
        return None, None
    return (total - avail if avail is not None else None), total


class SystemSampler:
    """``sample()`` returns one ``{"ts", "cpu_pct", "ram_used", "ram_total", "gpus": [...]}``.

    ``nvml``: the backend (default :class:`PynvmlBackend`; tests pass a
    :class:`~.nvml.FakeNvml`); ``gpus``: which devices (NVML indices or UUIDs, e.g. from
    :func:`visible_gpus_from_env`), default all; ``use_gpus=False`` skips NVML entirely.
    """

    def __init__(
        self,
        nvml: Optional[NvmlBackend] = None,
        *,
        gpus: Optional[Sequence[str]] = None,
        use_gpus: bool = True,
        proc_root: str = "/proc",
    ) -> None:
        self._cpu = _CpuTimes(f"{proc_root}/stat")
        self._meminfo = f"{proc_root}/meminfo"
        self._nvml: Optional[NvmlBackend] = None
        self._handles: list[tuple[int, Any]] = []
        self.gpu_note = ""
        self.samples = 0
        self.errors = 0
        if not use_gpus:
            self.gpu_note = "GPU sampling disabled"
            return
        backend = nvml if nvml is not None else PynvmlBackend()
        try:
            backend.init()
        except NvmlUnavailable as exc:
            self._no_gpu(f"NVML unavailable ({exc})")
            return
        self._nvml = backend
        self._open_devices(gpus)

    def _no_gpu(self, why: str) -> None:
        self.gpu_note = f"no GPU telemetry on this node: {why}; sampling CPU and RAM only"
        log.info("traceml: %s", self.gpu_note)

    def _open_devices(self, gpus: Optional[Sequence[str]]) -> None:
        nv = self._nvml
        assert nv is not None
        skipped: list[str] = []
        try:
            wanted: Sequence[Any] = list(gpus) if gpus is not None else list(range(nv.device_count()))
        except NvmlFieldError as exc:
            self._no_gpu(f"cannot count devices ({exc})")
            return
        for ident in wanted:
            try:
                text = str(ident)
                handle = nv.handle_by_index(int(text)) if text.isdigit() else nv.handle_by_uuid(text)
                index = nv.index(handle) if not text.isdigit() else int(text)
            except (NvmlFieldError, ValueError) as exc:
                skipped.append(f"{ident} ({exc})")
                continue
            self._handles.append((index, handle))
        if not self._handles:
            self._no_gpu("NVML sees no usable device" + (f"; skipped {', '.join(skipped)}" if skipped else ""))
        else:
            self.gpu_note = f"{len(self._handles)} GPU(s) via NVML"
            if skipped:
                self.gpu_note += f"; skipped {', '.join(skipped)}"
                log.info("traceml: %s", self.gpu_note)

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def sample(self) -> dict[str, Any]:
        used, total = _meminfo(self._meminfo)
        out = {
            "ts": time.time(),
            "cpu_pct": self._cpu.percent(),
            "ram_used": used,
            "ram_total": total,
            "gpus": [self._gpu(index, h) for index, h in self._handles],
        }
        self.samples += 1
        return out

    def _gpu(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self._nvml
        assert nv is not None
        g: dict[str, Any] = dict.fromkeys(GPU_FIELDS)
        g["index"] = index
        for key, read in (
            ("util_pct", nv.utilization_pct), ("temp_c", nv.temperature_c), ("power_w", nv.power_w),
        ):
            try:
                g[key] = read(handle)
            except NvmlFieldError:
                self.errors += 1
        try:
            g["mem_used"], g["mem_total"] = nv.memory(handle)
        except NvmlFieldError:
            self.errors += 1
        return g

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.shutdown()
            self._nvml = None
            self._handles = []


assert SYSTEM_FIELDS == ("ts", "cpu_pct", "ram_used", "ram_total", "gpus"), \
    "system.py out of date with protocol.SYSTEM_FIELDS"


class SystemReporter:
    """Samples every ``interval`` s on a daemon thread and hands ``system`` frames to ``send``.

    What each node's launcher runs: ``send`` is its relay's non-blocking ``submit``. ``sampler``
    may be a factory, called on the reporter's thread (opening NVML can take a while; it never
    delays the launcher). ``samples_per_frame`` > 1 batches samples to cut frames at scale.
    """

    def __init__(
        self,
        sampler: Union[SystemSampler, Callable[[], SystemSampler]],
        send: Callable[[dict[str, Any]], Any],
        *,
        node: int,
        host: str,
        interval: float = 1.0,
        samples_per_frame: int = 1,
    ) -> None:
        self._make = sampler if not isinstance(sampler, SystemSampler) else None
        self.sampler: Optional[SystemSampler] = sampler if isinstance(sampler, SystemSampler) else None
        self.send = send
        self.node = node
        self.host = host
        self.interval = interval
        self.samples_per_frame = max(1, samples_per_frame)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._batch: list[dict[str, Any]] = []
        self.frames = 0
        self.failures = 0

    def start(self) -> "SystemReporter":
        self._thread = threading.Thread(target=self._run, name="traceml-system", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        if self.sampler is None:
            try:
                self.sampler = self._make()  # type: ignore[misc]
            except Exception as exc:  # never let sampling take its host process down
                log.warning("traceml: no system sampling on this node (%s: %s)", type(exc).__name__, exc)
                return
        while True:
            try:
                self._batch.append(self.sampler.sample())
            except Exception:
                self.failures += 1
            if len(self._batch) >= self.samples_per_frame:
                self._flush()
            if self._stop.wait(self.interval):
                break
        self._flush()
        self.sampler.close()

    def _flush(self) -> None:
        if not self._batch:
            return
        frame = {"t": "system", "node": self.node, "host": self.host, "samples": self._batch}
        self._batch = []
        try:
            self.send(frame)
            self.frames += 1
        except Exception:
            self.failures += 1

    def stop(self, timeout: float = 2.0) -> None:
        """Stop after sending what was sampled; waits at most ``timeout`` s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
