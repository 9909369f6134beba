"""Filesystem checks: the logs dir is writable with free space on node 0; /dev/shm is big enough.

Whether the logs dir is the SAME directory on every node is a cross-node check (crossnode.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from traceml_core.errors import ConfigError

from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext
from .thresholds import LOGS_MIN_FREE_BYTES, SHM_MIN_BYTES_PER_CPU_WORKER, SHM_MIN_BYTES_PER_GPU


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def mount_of(path: str) -> tuple[Optional[str], Optional[str]]:
    """(mount point, filesystem type) holding ``path``, from /proc/self/mounts (longest prefix)."""
    best: tuple[str, str] | None = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (best is None or len(mnt) >= len(best[0])):
                    best = (mnt, parts[2])
    except OSError:
        return None, None
    return best if best else (None, None)


def logs_dir(ctx: NodeContext) -> tuple[str, str]:
    """(logs dir, where the value came from) as `traceml run` would use it."""
    c = ctx.launch().config
    if c is not None:
        return c.logs_dir, c.source("logs_dir")
    env = ctx.facts.env.traceml_vars
    if env.get("TRACEML_LOGS_DIR"):
        return env["TRACEML_LOGS_DIR"], "env:TRACEML_LOGS_DIR"
    try:
        submit_dir = ctx.facts.vars.submit_dir
    except ConfigError:
        submit_dir = None
    if submit_dir:
        return submit_dir.rstrip("/") + "/logs", "slurm:SLURM_SUBMIT_DIR"
    return "./logs", "default"


def absolute(ctx: NodeContext, path: str) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else Path(ctx.cwd) / p


def check_logs_dir(ctx: NodeContext) -> Outcome:
    raw, source = logs_dir(ctx)
    path = absolute(ctx, raw)
    rank = ctx.node_rank()
    writer = rank in (0, None)
    data = {"path": str(path), "source": source}
    probe = path / f".traceml-doctor-{ctx.hostname}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"traceml doctor write test\n")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        if not writer:
            return skipped(f"{path} is not writable here ({exc.strerror}); only node 0 writes the summary", **data)
        return failed(f"{path} (from {source}) is not writable on {ctx.hostname}: {exc.strerror or exc}",
                      "Point --logs-dir (TRACEML_LOGS_DIR) at a directory you can write, on shared storage.", **data)
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    mnt, fstype = mount_of(str(path.resolve()))
    data.update({"free_bytes": free, "mount": mnt, "fstype": fstype})
    where = f"{path} (from {source}; {fstype or '?'} on {mnt or '?'})"
    if writer and free < LOGS_MIN_FREE_BYTES:
        return warned(f"{where}: only {_gib(free)} free", "Free space there or point --logs-dir at another directory.", **data)
    return passed(f"{where} writable, {_gib(free)} free", **data)


def check_shm(ctx: NodeContext) -> Outcome:
    try:
        st = os.statvfs(ctx.shm_path)
    except OSError as exc:
        return warned(f"{ctx.shm_path} is missing ({exc.strerror}): DataLoader workers and NCCL need it",
                      "Ask the admins (or the container runtime: --shm-size / --ipc=host) for a /dev/shm.")
    total = st.f_blocks * st.f_frsize
    gpus = ctx.gpus_on_node()
    if gpus:
        units, what, need = gpus, "GPU", SHM_MIN_BYTES_PER_GPU
    else:
        c = ctx.launch().config
        units, what, need = (c.nproc_per_node if c else 1), "worker", SHM_MIN_BYTES_PER_CPU_WORKER
    per = total / max(1, units)
    data = {"total_bytes": total, "free_bytes": st.f_bavail * st.f_frsize, "per_unit_bytes": int(per), "units": units}
    line = f"{ctx.shm_path}: {_gib(total)} for {units} {what}{'s' if units != 1 else ''} ({_gib(per)} each)"
    if per < need:
        return warned(line + f", under the {_gib(need)} per {what} that DataLoader workers and NCCL want",
                      "Ask for a bigger /dev/shm (containers: --shm-size or --ipc=host), or use fewer DataLoader "
                      "workers.", **data)
    return passed(line, **data)


CHECKS = (
    CheckSpec("fs.logs-dir", "Logs dir writable", check_logs_dir),
    CheckSpec("fs.shm", "/dev/shm size", check_shm),
)
