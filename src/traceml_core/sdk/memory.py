"""Memory samples for the ``mem_peak`` column, taken off the training thread.

The hot path never reads memory itself: the client thread calls a :class:`MemoryProbe` every
:data:`MEMORY_INTERVAL_S` (10 Hz) and the step exit reads the highest sample taken since the
previous step (two attribute accesses). So ``mem_peak`` is a sampled peak: exact for steps longer
than 100 ms, and for faster steps the value of the latest sample (consecutive steps share it).

* CPU: process resident set size from ``/proc/self/statm`` (one ``pread`` on a descriptor opened
  once); where ``/proc`` is missing, the lifetime peak from ``getrusage``.
* CUDA: the caching allocator's *reserved* bytes on the model's device. The allocator keeps freed
  blocks reserved, so reserved memory includes the step's activation peak even when sampled after
  it; and unlike ``max_memory_allocated`` it needs no ``reset_peak_memory_stats()``, which would
  change numbers the user's own code may be logging.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any, Callable, Optional

from .step import StepState

MEMORY_INTERVAL_S = 0.1


class RssReader:
    """Current RSS in bytes; cheap enough for 10 Hz."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._fd: Optional[int] = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None

    def __call__(self) -> int:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def cuda_reserved_reader(device: Any) -> Callable[[], int]:
    import torch

    def read() -> int:
        return int(torch.cuda.memory_reserved(device))

    return read


class MemoryProbe:
    """Called periodically by the client thread; writes the step state's memory fields."""

    def __init__(self, state: StepState, reader: Optional[Callable[[], int]] = None) -> None:
        self.state = state
        self._rss = RssReader()
        self.reader: Callable[[], int] = reader or self._rss
        self.failures = 0
        self._cuda = False

    def use_cuda(self, device: Any) -> None:
        """Switch to the CUDA allocator (once the tracer times phases on ``device``)."""
        try:
            self.reader = cuda_reserved_reader(device)
        except Exception:
            pass

    def __call__(self) -> None:
        ev = self.state.timing.events   # (state.events may hold the CPU work sampler)
        if ev is not None and not self._cuda:   # phases are timed on a GPU: sample its memory
            self._cuda = True
            self.use_cuda(ev.device)
        try:
            v = self.reader()
        except Exception:
            self.failures += 1
            return
        t = self.state
        t.mem_last = v
        if v > t.mem:
            t.mem = v

    def close(self) -> None:
        self._rss.close()
