"""The memory cgroup of this node's workers: how many processes the OOM killer took, and the limit.

A worker killed by the kernel's OOM killer dies of SIGKILL like one killed by ``kill -9``; the
difference is recorded only by its memory cgroup. The launcher reads the cgroup's OOM-kill counter
before torchrun starts and after it ends (the workers inherit the launcher's cgroup: under Slurm
that is the step's or task's cgroup), so the summary can say "killed by the OOM killer" instead of
"killed by SIGKILL", and which limit was hit.

Both hierarchies are read: cgroup v2 (``memory.events``: ``oom_kill``, hierarchical; limit in
``memory.max``) and v1 (``memory.oom_control``: ``oom_kill``, counted in the victim's own cgroup;
limit in ``memory.limit_in_bytes``). The effective limit is the smallest one on the path up to the
root. Where nothing is readable (no memory controller, a container hiding it) the answer is None
and the summary says so; nothing here ever raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: v1 reports "no limit" as a page-rounded LONG_MAX; anything this large is no limit
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int
    #: the mount point of the hierarchy (limits are looked up to here)
    root: Path

    @property
    def source(self) -> str:
        return str(self.path / ("memory.events" if self.version == 2 else "memory.oom_control"))

    def oom_kills(self) -> Optional[int]:
        """Processes of this cgroup the OOM killer took so far; None when unreadable."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    def limit_bytes(self) -> Optional[int]:
        """The smallest memory limit from this cgroup up to the hierarchy's root; None if none."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        best: Optional[int] = None
        p = self.path
        while True:
            try:
                text = (p / name).read_text().strip()
                if text != "max":
                    value = int(text)
                    if value < _UNLIMITED and (best is None or value < best):
                        best = value
            except (OSError, ValueError):
                pass
            if p == self.root or p.parent == p:
                return best
            p = p.parent


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fstype, super options) of the cgroup mounts, from mountinfo."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[3], fields[4], tail[0], tail[2]))
    return out


def find(pid: int | str = "self") -> Optional[MemoryCgroup]:
    """The memory cgroup of ``pid`` (default: this process), or None when it cannot be found."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    for root, point, fstype, opts in _mounts():
        if v1 is not None and fstype == "cgroup" and "memory" in opts.split(","):
            path = _join(point, root, v1)
            if path is not None and (path / "memory.oom_control").exists():
                return MemoryCgroup(path, 1, Path(point))
    for root, point, fstype, _opts in _mounts():
        if v2 is not None and fstype == "cgroup2":
            path = _join(point, root, v2)
            if path is not None and (path / "memory.events").exists():
                return MemoryCgroup(path, 2, Path(point))
    return None


def _join(point: str, root: str, cg: str) -> Optional[Path]:
    """Where cgroup ``cg`` lives under a mount of the hierarchy rooted at ``root``."""
    if root != "/" and not (cg == root or cg.startswith(root.rstrip("/") + "/")):
        return None
    rel = cg[len(root):] if root != "/" else cg
    return Path(point) / rel.lstrip("/")


@dataclass
class OomWatch:
    """OOM kills counted between :meth:`start` and :meth:`report`."""

    cgroup: Optional[MemoryCgroup] = None
    before: Optional[int] = None

    def start(self) -> "OomWatch":
        try:
            self.cgroup = find(os.getpid())
            self.before = self.cgroup.oom_kills() if self.cgroup is not None else None
        except Exception:
            self.cgroup, self.before = None, None
        return self

    def report(self) -> Optional[dict]:
        """``{"kills", "limit_bytes", "source"}`` for the wire, or None when unreadable."""
        try:
            if self.cgroup is None or self.before is None:
                return None
            after = self.cgroup.oom_kills()
            if after is None:
                return None
            return {"kills": max(0, after - self.before), "limit_bytes": self.cgroup.limit_bytes(),
                    "source": self.cgroup.source}
        except Exception:
            return None
