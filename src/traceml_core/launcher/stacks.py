"""The launcher side of the hang autopsy on one node: make this node's ranks dump their stacks.

Every rank registered :mod:`faulthandler` for :func:`~traceml_core.sdk.stackdump.dump_signal`,
writing to its file in this node's private stack directory (made here, mode 0700, removed at the
end). :meth:`StackCollector.collect` truncates each file, signals each rank's process and reads the
dumps once they stop growing. It runs in the launcher, so it works whatever state the ranks are
in: faulthandler answers from inside the signal handler, without the GIL.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional

from ..rundir import fallback_root, private_dir
from ..sdk.stackdump import dump_signal, stack_file

#: a dump is complete when its file has not grown for this long
SETTLE_S = 0.15
#: the most a dump of all ranks of a node may take (a rank that never writes is reported as such)
COLLECT_S = 3.0
#: the most of one dump that is kept (a process with hundreds of threads): what one answer may carry
from ..wire.frames import MAX_STACK_TEXT as MAX_DUMP_BYTES  # noqa: E402


def node_dir(run_name: str, node: int) -> Path:
    """The stack directory of one node in the task layout (launcher/starters.py): there, each rank is
    started by the cluster, not by this node's launcher, so every task of the node computes the
    same path without talking; it lies in this user's private ``traceml-<uid>`` directory (made
    0700, refused when someone else planted it)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_name)[:96]
    return fallback_root() / f"stacks-{safe}-node{int(node)}"


class StackCollector:
    def __init__(self, directory: Optional[Path] = None) -> None:
        """A fresh private directory, or ``directory`` (:func:`node_dir`), made safely."""
        self.dir: Optional[Path] = None
        try:
            if directory is None:
                self.dir = Path(tempfile.mkdtemp(prefix="traceml-stacks-"))
                os.chmod(self.dir, 0o700)
            else:
                private_dir(directory.parent)
                private_dir(directory)
                self.dir = directory
        except OSError:     # (UnsafeDirError too) no stack dumps from this node; training goes on
            self.dir = None

    @property
    def path(self) -> str:
        return str(self.dir) if self.dir is not None else ""

    def collect(self, pids: Mapping[int, int], timeout: float = COLLECT_S) -> dict[int, dict]:
        """``{rank: {"text", "pid", "ok", "error"}}`` for the ranks given as ``{rank: pid}``."""
        sig = dump_signal()
        out: dict[int, dict] = {}
        if self.dir is None or sig is None:
            return {r: {"pid": p, "ok": False, "text": "", "error": "no stack directory on this node"}
                    for r, p in pids.items()}
        waiting: dict[int, Path] = {}
        for rank, pid in pids.items():
            path = stack_file(self.dir, rank)
            try:
                with open(path, "r+b") as f:
                    f.truncate(0)
            except FileNotFoundError:
                out[rank] = {"pid": pid, "ok": False, "text": "",
                             "error": "the rank registered no stack dump (it never called traceml.init())"}
                continue
            except OSError as exc:
                out[rank] = {"pid": pid, "ok": False, "text": "", "error": f"cannot reset {path}: {exc.strerror}"}
                continue
            if stopped(pid):
                # no signal: it would wait, and the dump would run the moment the rank is continued,
                # with every thread resuming at once (faulthandler reads the other threads' frames
                # without a lock: a rank SIGSTOPped, reported, then continued crashed with SIGSEGV
                # in CI); a stopped rank is reported as such, with no stack
                out[rank] = {"pid": pid, "ok": False, "text": "", "stopped": True, "error": STOPPED}
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                out[rank] = {"pid": pid, "ok": False, "text": "", "error": "the process is gone"}
                continue
            except OSError as exc:
                out[rank] = {"pid": pid, "ok": False, "text": "", "error": f"cannot signal it: {exc.strerror}"}
                continue
            waiting[rank] = path
            if stopped(pid):  # its dump comes when it runs again (the signal waits), not now
                out[rank] = {"pid": pid, "ok": False, "text": "", "stopped": True, "error": STOPPED}
                del waiting[rank]
        sizes: dict[int, tuple[int, float]] = {}
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            time.sleep(0.03)
            now = time.monotonic()
            for rank, path in list(waiting.items()):
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                prev = sizes.get(rank)
                if size > 0 and prev is not None and prev[0] == size and now - prev[1] >= SETTLE_S:
                    out[rank] = {"pid": pids[rank], "ok": True, "text": _read(path), "error": None}
                    del waiting[rank]
                elif prev is None or prev[0] != size:
                    sizes[rank] = (size, now)
        for rank, path in waiting.items():
            text = _read(path)
            halted = not text and stopped(pids[rank])
            out[rank] = {"pid": pids[rank], "ok": bool(text), "text": text, "stopped": halted,
                         "error": None if text else STOPPED if halted else f"no dump within {timeout:.0f} s"}
        return out

    def close(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


#: why a stopped rank has no dump
STOPPED = ("its process is stopped (state T: SIGSTOP, Ctrl-Z, or a debugger holds it), so it runs "
           "nothing, not even the dump")


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (``T``) or held by a tracer (``t``): it cannot run a signal
    handler, so it cannot dump its stack, and every collective waits for it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DUMP_BYTES)
    except OSError:
        return ""
    return data.replace(b"\0", b"").decode("utf-8", "replace")[:MAX_DUMP_BYTES]
