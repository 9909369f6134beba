"""Per-node system evidence from ``system`` frames: CPU, RAM and, per GPU, util/memory/temp/power.

Samples arrive at about 1 Hz per node, so plain Python per sample is fine; what matters is that
memory stays fixed (running sums and maxima, no lists) and that a malformed sample raises
ProtocolError rather than corrupting the aggregate. ``None`` for a field means "not available"
(no NVML, no power sensor) and is skipped.
"""

from __future__ import annotations

from typing import Any, Optional

from ..wire.protocol import ProtocolError

MAX_SAMPLES_PER_FRAME = 10_000
MAX_GPUS = 64
_NUM = (int, float)


class Running:
    """count / sum / max of a stream of numbers."""

    __slots__ = ("n", "sum", "max")

    def __init__(self) -> None:
        self.n = 0
        self.sum = 0.0
        self.max: Optional[float] = None

    def add(self, x: Any) -> None:
        if x is None:
            return
        if type(x) not in _NUM or x != x:  # NaN too
            raise ProtocolError("system: a sample value is not a number")
        self.n += 1
        self.sum += x
        if self.max is None or x > self.max:
            self.max = x

    def to_data(self) -> dict[str, Any]:
        return {"n": self.n, "sum": self.sum, "max": self.max}


GPU_METRICS = ("util_pct", "mem_used", "mem_total", "temp_c", "power_w")


class NodeSystem:
    __slots__ = ("node", "host", "samples", "first_ts", "last_ts", "cpu", "ram_used", "ram_total", "gpus")

    def __init__(self, node: int) -> None:
        self.node = node
        self.host = ""
        self.samples = 0
        self.first_ts: Optional[float] = None
        self.last_ts: Optional[float] = None
        self.cpu = Running()
        self.ram_used = Running()
        self.ram_total = Running()
        self.gpus: dict[int, dict[str, Running]] = {}

    def ingest(self, host: Any, samples: Any) -> None:
        if type(samples) is not list or len(samples) > MAX_SAMPLES_PER_FRAME:
            raise ProtocolError("system: samples must be a list")
        # validate everything into plain tuples before touching state
        parsed = []
        for s in samples:
            if type(s) is not dict:
                raise ProtocolError("system: a sample is not a map")
            ts = s.get("ts")
            if type(ts) not in _NUM:
                raise ProtocolError("system: sample without a numeric ts")
            gpus = s.get("gpus") or []
            if type(gpus) is not list or len(gpus) > MAX_GPUS:
                raise ProtocolError("system: gpus must be a list")
            gp = []
            for g in gpus:
                if type(g) is not dict or type(g.get("index")) is not int or not 0 <= g["index"] < 4096:
                    raise ProtocolError("system: a GPU sample needs an integer index")
                vals = tuple(g.get(k) for k in GPU_METRICS)
                for v in vals:
                    if v is not None and (type(v) not in _NUM or v != v):
                        raise ProtocolError("system: a GPU value is not a number")
                gp.append((g["index"], vals))
            vals = (s.get("cpu_pct"), s.get("ram_used"), s.get("ram_total"))
            for v in vals:
                if v is not None and (type(v) not in _NUM or v != v):
                    raise ProtocolError("system: a sample value is not a number")
            parsed.append((float(ts), vals, gp))
        if isinstance(host, str) and host:
            self.host = host[:255]
        for ts, (cpu, ram_used, ram_total), gp in parsed:
            self.samples += 1
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts
            self.cpu.add(cpu)
            self.ram_used.add(ram_used)
            self.ram_total.add(ram_total)
            for index, vals in gp:
                per = self.gpus.get(index)
                if per is None:
                    if len(self.gpus) >= MAX_GPUS:
                        continue
                    per = self.gpus[index] = {k: Running() for k in GPU_METRICS}
                for k, v in zip(GPU_METRICS, vals):
                    per[k].add(v)

    def to_data(self) -> dict[str, Any]:
        return {
            "node": self.node, "host": self.host, "samples": self.samples,
            "first_ts": self.first_ts, "last_ts": self.last_ts,
            "cpu_pct": self.cpu.to_data(), "ram_used": self.ram_used.to_data(),
            "ram_total": self.ram_total.to_data(),
            "gpus": [{"index": i, **{k: r.to_data() for k, r in per.items()}}
                     for i, per in sorted(self.gpus.items())],
        }
