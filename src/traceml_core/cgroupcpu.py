"""The CPU controller of this process's cgroup, v2 or v1: where its counters are, the CPU quota it
sets, and how often it throttled. A quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` of
``cpu.cfs_period_us``) holds a process back whatever cores it may run on; a throttled thread stays
runnable, so the scheduler's run-queue wait counts it like other processes' load. These counters
tell the two apart: the SDK's per-rank CPU facts (sdk/threads.py) and the doctor's CPU matmul
(traceml_slurm's torchprobe) read them. Plain file reads; None wherever the kernel keeps no such
file (no cpu controller, a container that hides it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


def read_small(path: str, limit: int = 4096) -> Optional[str]:
    """The start of a small kernel file (/proc, /sys) as text, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("ascii", "replace")
    except OSError:
        return None


_read = read_small


@dataclass(frozen=True)
class CpuCgroup:
    """This process's cpu cgroup directory and its hierarchy's version (1 or 2)."""

    dir: str
    version: int

    @property
    def stat_path(self) -> str:
        return os.path.join(self.dir, "cpu.stat")

    @property
    def throttled_key(self) -> str:
        """cpu.stat's key of the time throttled: µs on v2, ns on v1."""
        return "throttled_usec" if self.version == 2 else "throttled_time"

    def quota_cpus(self) -> Optional[float]:
        """The quota in CPUs (0.2: 20 ms of CPU per 100 ms), or None: no quota, or not readable."""
        if self.version == 2:
            parts = (_read(os.path.join(self.dir, "cpu.max")) or "").split()
            quota, period = (parts + ["", ""])[:2]
        else:
            quota = (_read(os.path.join(self.dir, "cpu.cfs_quota_us")) or "").strip()
            period = (_read(os.path.join(self.dir, "cpu.cfs_period_us")) or "").strip()
        try:
            q, p = int(quota), int(period)
        except ValueError:
            return None   # "max" (v2) or unreadable
        return q / p if q > 0 and p > 0 else None   # -1 (v1): no quota

    def periods(self) -> Optional[tuple[int, int]]:
        """(enforcement periods the cgroup was active in, periods it was throttled in), or None."""
        stat = dict(line.split(" ", 1) for line in (_read(self.stat_path) or "").splitlines() if " " in line)
        try:
            return int(stat["nr_periods"]), int(stat["nr_throttled"])
        except (KeyError, ValueError):
            return None


def cpu_cgroup(pid: str = "self") -> Optional[CpuCgroup]:
    """The cgroup whose CPU controller governs ``pid``: the v1 ``cpu`` hierarchy where it is
    mounted (a hybrid layout keeps the controller there), else the v2 unified one."""
    text = _read(f"/proc/{pid}/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            where = CpuCgroup(f"/sys/fs/cgroup{parts[2]}", 2)
        elif "cpu" in parts[1].split(","):
            where = CpuCgroup(f"/sys/fs/cgroup/{parts[1]}{parts[2]}", 1)
        else:
            continue
        if os.path.exists(where.stat_path):
            return where
    return None

