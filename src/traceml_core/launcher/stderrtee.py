"""Each worker's stderr passes through the torchrun process, which keeps its last lines.

Why: what explains many failures is only ever written on a worker's stderr. A collective library
that gives up aborts the process from native code (gloo: ``terminate called after throwing an
instance of 'gloo::EnforceNotMet' ... Is there a distributed collective mismatch in your code?``,
then SIGABRT; NCCL's watchdog after a timeout), with no Python exception for TraceML to see; a
script that exits in ``argparse`` prints ``prog: error: unrecognized arguments`` and calls
``sys.exit(2)``. torchrun starts the workers with the terminal's stderr, so nothing keeps those
words. Here (in :mod:`.agent`, the torchrun process) each worker gets its own pipe for stderr, a
thread copies it to the real stderr at once and keeps the last lines, and torchrun's record of a
failed worker carries them to the summary (``ranks[].exit.stderr``; read by
``report/stderr.py``).

What the user sees does not change: every byte is written to the same stderr as soon as it is
read (only stderr passes through here: stdout stays the terminal's), and where that stderr is a
terminal the worker gets a pseudo-terminal instead of a pipe, raw (no ``\\n`` -> ``\\r\\n``) and
of the terminal's size, so ``isatty()``, colours and progress bars behave as under plain
torchrun. A destination that fails (a closed terminal) only stops the copy, never the reading,
so a worker never blocks on its stderr. Used only where every worker dies with the torchrun
process (:mod:`.ownership`): no worker outlives the reader of its pipe.

How: torchrun starts each worker through ``SubprocessHandler._popen`` (torch >= 2.2), which this
wraps to pass the pipe as the worker's stderr when torchrun itself does not redirect it
(``--redirects``/``--tee`` keep theirs). On a torch without it nothing is kept (best effort).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

#: lines kept of each worker's stderr (the end), and characters kept of each line
TAIL_LINES = 60
LINE_MAX = 600
#: characters of a worker's stderr sent with torchrun's record of it (wire/frames.py keeps as many)
SEND_MAX = 2000
#: earlier lines that name a collective library, kept apart: a library's sentence comes first and a
#: long dump (faulthandler's stacks, a C++ stack trace) may follow it. A broad net, on purpose:
#: report/stderr.py decides what a line means
LIBRARY_WORDS = (b"gloo", b"NCCL", b"nccl", b"MPI", b"c10d", b"ProcessGroup", b"collective")
LIBRARY_LINES = 4
#: the capacity asked for each worker's pipe (an unprivileged process may ask up to
#: /proc/sys/fs/pipe-max-size, 1 MiB by default)
PIPE_BYTES = 1 << 20
#: bytes of the end of each worker's stderr kept (the last lines are cut from it)
KEEP_BYTES = 32768
#: seconds the record of a failed run waits for the copies of its workers' stderr to reach the end
DRAIN_S = 1.0


class Tail:
    """The end of one stream (its last :data:`KEEP_BYTES` bytes), and the last lines that named a
    collective library. Feeding costs a copy and a substring test of the bytes (about 3 us of CPU
    per write measured): lines are split only when :meth:`text` is asked (once, after a failure), so a worker that
    logs a line per step is not slowed by a Python loop per line here."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.library: deque[str] = deque(maxlen=LIBRARY_LINES)
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._buf += data
            if len(self._buf) > 2 * KEEP_BYTES:   # trimmed now and then, not per write
                del self._buf[:len(self._buf) - KEEP_BYTES]
            if _names_a_library(data):   # rare: the lines that name a library, kept apart
                for raw in data.split(b"\n"):
                    if _names_a_library(raw):
                        line = _line(raw)
                        if line:
                            self.library.append(line)

    def text(self, limit: int = SEND_MAX) -> str:
        """The end of the stream in at most ``limit`` characters: library lines that fell out of
        the last lines first, then the last lines (the unfinished one too)."""
        with self._lock:
            raw = bytes(self._buf[-KEEP_BYTES:])
            library = list(self.library)
        last = [ln for ln in map(_line, raw.split(b"\n")[-TAIL_LINES:]) if ln]
        kept = [ln for ln in library if ln not in last]
        budget = limit - sum(len(ln) + 1 for ln in kept)
        out: list[str] = []
        for ln in reversed(last):
            if budget - len(ln) - 1 < 0:
                break
            out.append(ln)
            budget -= len(ln) + 1
        return "\n".join(kept + out[::-1])[-limit:]


def _names_a_library(data: bytes) -> bool:
    return any(word in data for word in LIBRARY_WORDS)


def _line(raw: bytes) -> str:
    """A line as text: a progress bar redraws one line with \\r, so its last state is the line."""
    return raw.decode("utf-8", "replace").rsplit("\r", 1)[-1].rstrip()[:LINE_MAX]


class WorkerStderr:
    """One worker's stderr: the pipe (or pseudo-terminal) it writes, and the thread that copies
    it to ``dest`` and keeps its :class:`Tail`."""

    def __init__(self, dest: int = 2) -> None:
        self.dest = dest
        self.tail = Tail()
        self.done = threading.Event()
        if _isatty(dest):
            self.read_fd, write_fd = os.openpty()
            _raw_like(dest, write_fd)
        else:
            self.read_fd, write_fd = os.pipe()
            _roomy(write_fd)
        os.set_inheritable(self.read_fd, False)
        self.writer = os.fdopen(write_fd, "wb", buffering=0)
        self._thread = threading.Thread(target=self._copy, name="traceml-stderr", daemon=True)

    def started(self) -> None:
        """The worker has its copy of the write end: close ours (its end of file is then the
        worker's, and its children's) and start copying."""
        self.writer.close()
        self._thread.start()

    def failed_to_start(self) -> None:
        self.writer.close()
        os.close(self.read_fd)
        self.done.set()

    def _copy(self) -> None:
        """Copy until the worker's end of the stream closes. Nothing here may stop the reading
        while the worker lives (its writes would then fail or block): a destination that fails
        stops the writing, a tail that fails stops the keeping, the reading goes on."""
        writing = keeping = True
        try:
            while True:
                try:
                    data = os.read(self.read_fd, 65536)
                except InterruptedError:
                    continue
                except OSError:   # EIO: a pseudo-terminal whose last writer closed it
                    break
                if not data:
                    break
                if writing:
                    writing = _write_all(self.dest, data)
                if keeping:
                    try:
                        self.tail.feed(data)
                    except Exception:  # noqa: BLE001
                        keeping = False
        finally:
            try:
                os.close(self.read_fd)
            except OSError:
                pass
            self.done.set()


def _write_all(fd: int, data: bytes) -> bool:
    """Write all of ``data``; False once the destination fails (then the copy stops)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False
        view = view[n:]
    return True


def _roomy(fd: int) -> None:
    """A pipe of :data:`PIPE_BYTES` (Linux; 64 KiB by default): a worker that logs in a burst while
    the copying thread waits for a core writes on instead of waiting for it."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _raw_like(terminal: int, slave: int) -> None:
    """The pseudo-terminal writes bytes as they are (no output processing) and has the size of
    the real terminal (progress bars size themselves by it)."""
    try:
        import fcntl
        import termios

        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        attrs[3] &= ~(termios.ECHO | termios.ICANON)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except Exception:  # noqa: BLE001 - a plain pseudo-terminal still works
        pass


class StderrTees:
    """Every worker's :class:`WorkerStderr`, by local rank (the latest, after a restart)."""

    def __init__(self, dest: int = 2) -> None:
        self.dest = dest
        self.workers: dict[int, WorkerStderr] = {}
        self._lock = threading.Lock()

    def install(self) -> bool:
        """Wrap torchrun's worker start (True when it could be wrapped)."""
        try:
            from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as sh
        except Exception:  # noqa: BLE001 - an older torch: nothing is kept
            return False
        cls = getattr(sh, "SubprocessHandler", None)
        original = getattr(cls, "_popen", None)
        if cls is None or original is None:
            return False
        tees = self

        def _popen(handler: Any, *args: Any, **kwargs: Any) -> Any:
            # torchrun redirects it itself (--redirects, --tee): leave it so
            if getattr(handler, "_stderr", False) is not None:
                return original(handler, *args, **kwargs)
            try:
                tee = WorkerStderr(tees.dest)
            except OSError:
                return original(handler, *args, **kwargs)
            handler._stderr = tee.writer
            try:
                proc = original(handler, *args, **kwargs)
            except BaseException:
                handler._stderr = None
                tee.failed_to_start()
                raise
            handler._stderr = None
            tee.started()
            with tees._lock:
                tees.workers[int(getattr(handler, "local_rank_id", len(tees.workers)))] = tee
            return proc

        cls._popen = _popen
        return True

    def texts(self, local_ranks: Any, wait: float = DRAIN_S) -> dict[int, str]:
        """The end of each worker's stderr, by local rank (those not kept are missing), after
        waiting up to ``wait`` seconds in all for their copies to reach the end (the workers
        have exited; a child that inherited the stream may still hold it open)."""
        import time

        with self._lock:
            tees = {lr: self.workers[lr] for lr in local_ranks if lr in self.workers}
        end = time.monotonic() + wait
        for tee in tees.values():
            tee.done.wait(max(0.0, end - time.monotonic()))
        return {lr: tee.tail.text() for lr, tee in tees.items()}
