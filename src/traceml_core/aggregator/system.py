"""Per-node system evidence from ``system`` frames: CPU, RAM and, per GPU, util/memory/temp/power.

Samples arrive at about 1 Hz per node, so plain Python per sample is fine; what matters is that
memory stays fixed (running sums and maxima, and :class:`TimeBuckets` over time, no lists). The
samples were checked where they entered (wire/frames.check_system: every value a number within its
field's physical bound); ``None`` for a field means "not available" (no NVML, no power sensor, or
a value refused there) and is skipped.
"""

from __future__ import annotations

from array import array
from typing import Any, Optional

from ..rundata import GpuData, OverTime, Running, SystemData
from ..statistics.series import BUCKETS
from ..wire.frames import GPU_LIMITS, MAX_GPUS


GPU_METRICS = tuple(GPU_LIMITS)


class TimeBuckets:
    """Node metrics over wall-clock time in at most :data:`~.series.BUCKETS` buckets.

    Bucket ``i`` covers ``[t0 + i*width_s, t0 + (i+1)*width_s)``; past the last bucket, pairs merge
    and the width doubles (like the per-rank step series), so a week-long run costs the same
    memory as a minute: per metric 256 x 12 bytes (mean) or 256 x 8 bytes (max).
    """

    __slots__ = ("t0", "width_s", "used", "sums", "cnts", "maxes")

    def __init__(self) -> None:
        self.t0: Optional[float] = None
        self.width_s = 1.0
        self.used = 0
        self.sums: dict[str, array] = {}
        self.cnts: dict[str, array] = {}
        self.maxes: dict[str, array] = {}

    def _double(self) -> None:
        half = BUCKETS // 2
        for arrs, fn in ((self.sums, float.__add__), (self.maxes, max)):
            for k, a in arrs.items():
                merged = array("d", map(fn, a[0::2], a[1::2]))
                a[:half] = merged
                a[half:] = array("d", [0.0 if fn is not max else -1.0]) * half
        for k, a in self.cnts.items():
            a[:half] = array("i", map(int.__add__, a[0::2], a[1::2]))
            a[half:] = array("i", bytes(4 * half))
        self.width_s *= 2
        self.used = (self.used + 1) // 2

    def add(self, ts: float, means: dict[str, Any], maxes: dict[str, Any]) -> None:
        if self.t0 is None:
            self.t0 = ts
        i = int(max(0.0, ts - self.t0) // self.width_s)
        while i >= BUCKETS:
            self._double()
            i = int(max(0.0, ts - self.t0) // self.width_s)
        for k, v in means.items():
            if v is None:
                continue
            if k not in self.sums:
                self.sums[k] = array("d", bytes(8 * BUCKETS))
                self.cnts[k] = array("i", bytes(4 * BUCKETS))
            self.sums[k][i] += v
            self.cnts[k][i] += 1
        for k, v in maxes.items():
            if v is None:
                continue
            a = self.maxes.get(k)
            if a is None:
                a = self.maxes[k] = array("d", [-1.0]) * BUCKETS
            if v > a[i]:
                a[i] = v
        if i + 1 > self.used:
            self.used = i + 1

    def now(self) -> OverTime:
        u = self.used
        return OverTime(self.t0, self.width_s, u,
                        {k: [round(s / c, 2) if c else None for s, c in zip(a[:u], self.cnts[k][:u])]
                         for k, a in self.sums.items()},
                        {k: [v if v >= 0 else None for v in a[:u]] for k, a in self.maxes.items()})


class NodeSystem:
    __slots__ = ("node", "host", "samples", "first_ts", "last_ts", "cpu", "ram_used", "ram_total", "gpus",
                 "over_time")

    def __init__(self, node: int) -> None:
        self.node = node
        self.host = ""
        self.samples = 0
        self.first_ts: Optional[float] = None
        self.last_ts: Optional[float] = None
        self.cpu = Running()
        self.ram_used = Running()
        self.ram_total = Running()
        self.gpus: dict[int, GpuData] = {}
        self.over_time = TimeBuckets()

    def ingest(self, host: Any, samples: list[dict[str, Any]]) -> None:
        """Add the samples of one ``system`` frame, checked by wire/frames.check_system (every
        value a number within its field's bound, or None)."""
        parsed = [(s["ts"], (s["cpu_pct"], s["ram_used"], s["ram_total"]),
                   [(g["index"], tuple(g[k] for k in GPU_METRICS)) for g in s["gpus"]]) for s in samples]
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
            means: dict[str, Any] = {"cpu_pct": cpu}
            maxes: dict[str, Any] = {"ram_used": ram_used}
            for index, vals in gp:
                per = self.gpus.get(index)
                if per is None:
                    if len(self.gpus) >= MAX_GPUS:
                        continue
                    per = self.gpus[index] = GpuData(index)
                for k, v in zip(GPU_METRICS, vals):
                    getattr(per, k).add(v)
                means[f"gpu{index}.util_pct"] = vals[0]
                maxes[f"gpu{index}.mem_used"] = vals[1]
            self.over_time.add(ts, means, maxes)

    def now(self, over_time: bool = True) -> SystemData:
        """The samples so far as the run data's type (without those over time: the live views')."""
        return SystemData(self.node, self.host, self.samples, self.first_ts, self.last_ts, self.cpu,
                          self.ram_used, self.ram_total, [g for _, g in sorted(self.gpus.items())],
                          self.over_time.now() if over_time else OverTime())
