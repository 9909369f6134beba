"""The launcher owns its workers: no worker outlives the run, whatever dies first.

torchrun starts each worker in its own session, so signalling torchrun's process group never
reaches them, and a worker whose torchrun died keeps training. Three layers close that, each
covering a death the others cannot see:

1. **The torchrun process dies with the launcher.** It is started with a parent-death signal
   (``PR_SET_PDEATHSIG`` = SIGTERM, set between fork and exec): when the launcher dies, even by
   SIGKILL, the kernel sends torchrun SIGTERM, and torchrun stops its workers as it does on any
   SIGTERM (SIGTERM, then SIGKILL after its own grace).
2. **Workers die with torchrun.** Inside the torchrun process (:mod:`.agent`), the function that
   starts each worker gets the same treatment with SIGKILL: a worker whose torchrun died (say, it
   was SIGKILLed, or the OOM killer chose it) is killed by the kernel at once. This patches one
   private torch function; where a torch version lacks it the launcher logs that and layer 3 still
   holds.
3. **The launcher adopts what is orphaned.** It makes itself a child subreaper
   (``PR_SET_CHILD_SUBREAPER``): a worker orphaned by torchrun's death becomes the launcher's child
   instead of init's, and when torchrun has ended the launcher stops every such adopted process
   (SIGTERM, then SIGKILL after a grace) and reaps it, before it writes the summary. Adopted
   workers are told from the launcher's own children (the aggregator) by the run info in their
   environment (``TRACEML_RUN_INFO``), which only the workers and their children have.

Under Slurm with ``proctrack/cgroup`` the step's cgroup is a fourth layer we do not rely on: these
hold on a laptop, in a container and with ``proctrack/pgid`` too. Linux only; elsewhere every
function here is a no-op that says so.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any, Callable, Iterable, Optional

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc: Any = None


def _prctl() -> Optional[Callable[..., int]]:
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    return getattr(_libc, "prctl", None) if _libc else None


def parent_death_signal(sig: int, parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` (runs in the child between fork and exec) that asks the kernel for ``sig``
    when ``parent`` dies, and sends it at once when ``parent`` is already gone (the race between
    fork and prctl). Resolved before the fork, so the child only makes two system calls."""
    prctl = _prctl()

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sig)

    return preexec


def become_subreaper() -> bool:
    """Orphaned descendants become our children (not init's). True when the kernel agreed."""
    prctl = _prctl()
    return bool(prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def children(of: Optional[int] = None) -> list[int]:
    """Direct children of ``of`` (default: this process), from /proc. Linear in the processes of
    the machine; called a handful of times per run."""
    me = os.getpid() if of is None else of
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == me:
                out.append(int(entry))
    return out


def session_children(of: int) -> list[int]:
    """Children of ``of`` that lead sessions of their own (torchrun starts each worker so): a
    signal to ``of``'s process group does not reach them."""
    out = []
    for pid in children(of):
        try:
            if os.getsid(pid) == pid:
                out.append(pid)
        except OSError:
            pass
    return out


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _has_var(pid: int, marker: bytes) -> bool:
    """Whether ``pid`` was started with the environment variable ``marker`` (readable for our own
    processes only; a zombie's environment is empty)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(item.startswith(marker) for item in f.read().split(b"\0"))
    except OSError:
        return False


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def stop_adopted(marker: str, grace: float = 5.0, log: Optional[Callable[[str], None]] = None) -> list[int]:
    """Stop and reap the workers we adopted as subreaper: our children started with the
    environment variable ``marker`` (the workers' run info, which the launcher's other children,
    such as the aggregator, never have), i.e. workers or their children whose torchrun is gone.
    SIGTERM first, SIGKILL after ``grace`` seconds. Returns the pids that were still running."""
    tag = marker.encode() + b"="
    running = [p for p in children() if _has_var(p, tag) and _running(p)]
    if not running:
        return []
    if log is not None:
        log(f"stopping {len(running)} worker process(es) left behind by torchrun (pids "
            f"{', '.join(map(str, running[:8]))}{', ...' if len(running) > 8 else ''})")
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = [p for p in running if _running(p)]
        if not live:
            break
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_running(p) for p in live):
            time.sleep(0.05)
    _reap(running)
    return running


def kill_workers_with_torchrun() -> bool:
    """Inside the torchrun process: every worker torchrun starts gets SIGKILL from the kernel when
    torchrun dies. Patches torch's worker ``Popen`` (private; True when patched)."""
    if _prctl() is None:
        return False
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as sh
    except Exception:
        return False
    original = getattr(sh.SubprocessHandler, "_popen", None)
    if original is None or getattr(original, "_traceml_owned", False):
        return original is not None
    popen_cls = sh.Popen

    def _popen(self: Any, args: Any, env: Any) -> Any:
        preexec = parent_death_signal(signal.SIGKILL, os.getpid())
        real = sh.Popen

        def owned(*a: Any, **kw: Any) -> Any:
            kw.setdefault("preexec_fn", preexec)
            return popen_cls(*a, **kw)

        sh.Popen = owned
        try:
            return original(self, args, env)
        finally:
            sh.Popen = real

    _popen._traceml_owned = True  # type: ignore[attr-defined]
    sh.SubprocessHandler._popen = _popen
    return True
