"""Messages on stderr while the doctor waits: every wait is bounded and, once it takes longer than
:data:`FIRST_NOTICE_S`, says what it waits for and for how long at most. stdout stays clean for the
report and the JSON.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterator, Optional

#: a healthy `import torch` takes 1-1.5 s; saying "waiting" for it every time would be noise
FIRST_NOTICE_S = 2.0
REPEAT_S = 5.0


class Progress:
    def __init__(self, stream: Optional[IO[str]] = None, verbose: bool = False, prefix: str = "traceml doctor") -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.verbose = verbose
        self.prefix = prefix
        self._lock = threading.Lock()

    def log(self, msg: str) -> None:
        with self._lock:
            try:
                self.stream.write(f"{self.prefix}: {msg}\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def debug(self, msg: str) -> None:
        if self.verbose:
            self.log(msg)

    @contextmanager
    def waiting(self, what: str, bound: float) -> Iterator[None]:
        """Say "waiting for WHAT (at most N s)" if the block takes over FIRST_NOTICE_S, then every few seconds."""
        t0 = time.monotonic()
        stop = threading.Event()

        def tick() -> None:
            if stop.wait(FIRST_NOTICE_S):
                return
            self.log(f"waiting for {what} (at most {bound:.0f} s)")
            while not stop.wait(REPEAT_S):
                self.log(f"still waiting for {what}: {time.monotonic() - t0:.0f} s of at most {bound:.0f} s")

        th = threading.Thread(target=tick, name="doctor-progress", daemon=True)
        th.start()
        try:
            yield
        finally:
            stop.set()


class Quiet(Progress):
    """For unit tests and in-process use: says nothing."""

    def __init__(self) -> None:
        super().__init__(stream=None)

    def log(self, msg: str) -> None:
        pass

    @contextmanager
    def waiting(self, what: str, bound: float) -> Iterator[None]:
        yield
