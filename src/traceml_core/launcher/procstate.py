"""What the kernel knows of a rank's process, read by its node's launcher without touching it.

The hang autopsy asks each rank's interpreter where it is (sdk/stackdump.py); that answer needs
the rank to run Python. This module is the other half, read from ``/proc`` by the relay of the
rank's node, so it is there whatever the rank is doing: whether the process is stopped (``T``,
``t``: SIGSTOP, Ctrl-Z, a debugger) or gone, where its main thread sleeps in the kernel, and the
counters that say whether it makes progress: the CPU time of its main thread (the one that
trains), that of its child processes (DataLoader workers), and the bytes it read and wrote.
Nothing here sends a signal or reads the process's memory.

All counters are cumulative; the hang rules (report/hang.py) compare two readings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True)
class ProcState:
    """One reading of a process; None where the kernel would not say (another user's process,
    a kernel without the file)."""

    pid: int
    #: the process is gone (it ended, or never was)
    gone: bool
    #: state letter of its main thread: R running, S sleeping, D in uninterruptible I/O, T/t
    #: stopped or traced, Z zombie
    state: Optional[str] = None
    #: the kernel function its main thread sleeps in (``/proc/PID/wchan``), when the kernel says
    wchan: Optional[str] = None
    #: CPU time of the main thread (user + system), in ns
    main_cpu_ns: Optional[int] = None
    #: CPU time of the whole process (every thread), in ns
    proc_cpu_ns: Optional[int] = None
    #: CPU time of its live child processes (DataLoader workers), in ns
    children_cpu_ns: Optional[int] = None
    #: bytes read and written (``rchar + wchar``: files, pipes and sockets)
    io_bytes: Optional[int] = None

    @property
    def stopped(self) -> bool:
        """Stopped or held by a tracer: it runs nothing, not even a signal handler, and every
        collective waits for it."""
        return self.state in ("T", "t")


def _stat_fields(path: str) -> Optional[list[bytes]]:
    """The fields after the command name of a ``stat`` file (the name may hold spaces and
    parentheses: split at the last ``)``)."""
    try:
        with open(path, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_ns(fields: list[bytes]) -> Optional[int]:
    try:  # utime, stime: fields 14 and 15 of stat; 11 and 12 after the name and state
        return (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (IndexError, ValueError):
        return None


def _read_text(path: str, limit: int = 4096) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("ascii", "replace")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    text = _read_text(f"/proc/{pid}/task/{pid}/children", 65536) or ""
    return [int(p) for p in text.split() if p.isdigit()]


def _io_bytes(pid: int) -> Optional[int]:
    text = _read_text(f"/proc/{pid}/io")
    if not text:
        return None
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            try:
                values[key] = int(value)
            except ValueError:
                return None
    return sum(values.values()) if len(values) == 2 else None


def read(pid: int) -> ProcState:
    """One reading of ``pid`` (never raises)."""
    main = _stat_fields(f"/proc/{pid}/task/{pid}/stat")
    if main is None:
        return ProcState(pid, gone=True)
    state = main[0].decode("ascii", "replace") if main else None
    if state in ("Z", "X"):
        return ProcState(pid, gone=True, state=state)
    whole = _stat_fields(f"/proc/{pid}/stat")
    kids: Optional[int] = 0
    for child in _children(pid):
        fields = _stat_fields(f"/proc/{child}/stat")
        ns = _cpu_ns(fields) if fields else None
        if ns is not None and kids is not None:
            kids += ns
    wchan = (_read_text(f"/proc/{pid}/wchan", 128) or "").strip()
    return ProcState(pid, gone=False, state=state, wchan=wchan if wchan not in ("", "0") else None,
                     main_cpu_ns=_cpu_ns(main), proc_cpu_ns=_cpu_ns(whole) if whole else None,
                     children_cpu_ns=kids, io_bytes=_io_bytes(pid))
