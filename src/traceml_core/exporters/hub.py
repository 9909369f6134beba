"""One thread per destination, each behind a small bounded queue: the aggregator never waits.

:meth:`ExportHub.offer` puts a batch on every destination's queue without blocking; a full queue
means that destination is slower than the run, and the batch is dropped there and counted.
:meth:`ExportHub.finish` hands over the final batch (making room by dropping the oldest waiting
one) and waits for the destinations up to a deadline. :meth:`ExportHub.report` says, per
destination, what was written, what was dropped and why (``exports.json``, the log).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from .batch import Batch, RunIdentity

#: batches waiting per destination; beyond that the newest is dropped (and counted). A batch is
#: small (at most 64 series x the buckets completed since the last one); 16 covers a destination
#: that takes ~15 s to start (wandb.init on a busy node) at the shortest interval
QUEUE_BATCHES = 16
#: seconds the destinations get at the end, together, for the rest and the files (node 0's
#: launcher stops the aggregator a few seconds after the summary; training is over by then)
FINAL_DEADLINE_S = 8.0
REPORT_NAME = "exports.json"


class Exporter(Protocol):
    """A destination. Called from its own thread only; may raise (the hub counts and stops it)."""

    def open(self, run: RunIdentity) -> None: ...

    def write(self, batch: Batch) -> None: ...

    def close(self, final: Batch) -> None:
        """Write the final batch (the rest of the series, the summary's files) and let go."""


@dataclass
class ExportStats:
    """What one destination did (``exports.json``)."""

    kind: str
    batches: int = 0
    points_written: int = 0
    points_dropped: int = 0
    batches_dropped: int = 0
    #: the final batch (the summary and the report) written
    finished: bool = False
    error: Optional[str] = None
    #: where it wrote (a directory, a URI), said by the destination
    target: str = ""

    def line(self) -> str:
        out = f"export {self.kind}: {self.points_written:,} points written"
        if self.target:
            out += f" to {self.target}"
        if self.points_dropped:
            out += (f"; {self.points_dropped:,} dropped ({self.batches_dropped:,} batches"
                    + (" after its error" if self.error else ": it was slower than the run") + ")")
        if self.error:
            out += f"; error: {self.error}"
        elif not self.finished:
            out += "; the final summary and report did not reach it in time"
        return out


_STOP = object()


class _Worker:
    def __init__(self, kind: str, make: Callable[[], Exporter], run: RunIdentity) -> None:
        self.stats = ExportStats(kind)
        self._make, self._run = make, run
        self._q: "queue.Queue[object]" = queue.Queue(QUEUE_BATCHES)
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name=f"traceml-export-{kind}", daemon=True)
        self.thread.start()

    def offer(self, batch: Batch) -> None:
        try:
            self._q.put_nowait(batch)
        except queue.Full:
            self._dropped(batch)

    def final(self, batch: Batch) -> None:
        while True:
            try:
                self._q.put_nowait(batch)
                return
            except queue.Full:
                try:
                    old = self._q.get_nowait()
                except queue.Empty:
                    continue
                if isinstance(old, Batch):
                    self._dropped(old)

    def _dropped(self, batch: Batch) -> None:
        with self._lock:
            self.stats.points_dropped += batch.size
            self.stats.batches_dropped += 1

    def _main(self) -> None:
        exporter: Optional[Exporter] = None
        try:
            exporter = self._make()
            exporter.open(self._run)
            self.stats.target = str(getattr(exporter, "target", "") or "")
        except Exception as exc:  # noqa: BLE001 - a destination must never take anything down
            self._fail(exc)
        while True:
            item = self._q.get()
            if item is _STOP or not isinstance(item, Batch):
                return
            if self.stats.error is not None or exporter is None:
                self._dropped(item)
                if item.final is not None:
                    return
                continue
            try:
                if item.final is not None:
                    exporter.close(item)
                    self.stats.finished = True
                else:
                    exporter.write(item)
                with self._lock:
                    self.stats.batches += 1
                    self.stats.points_written += item.size
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                self._dropped(item)
            if item.final is not None:
                return

    def _fail(self, exc: BaseException) -> None:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.stats.error = f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class ExportHub:
    """The destinations of one run. ``makers``: kind -> a function that builds its exporter."""

    def __init__(self, makers: dict[str, Callable[[], Exporter]], run: RunIdentity) -> None:
        self.run = run
        self.workers = [_Worker(kind, make, run) for kind, make in makers.items()]

    def offer(self, batch: Batch) -> None:
        """Queue ``batch`` for every destination; never blocks."""
        for w in self.workers:
            w.offer(batch)

    def finish(self, final: Batch, deadline_s: float = FINAL_DEADLINE_S) -> list[ExportStats]:
        """Hand over the final batch and wait for the destinations, ``deadline_s`` at most."""
        for w in self.workers:
            w.final(final)
        end = time.monotonic() + deadline_s
        for w in self.workers:
            w.thread.join(max(0.0, end - time.monotonic()))
        return self.report()

    def report(self) -> list[ExportStats]:
        return [w.stats for w in self.workers]

    def write_report(self, run_dir: Path) -> Optional[Path]:
        """``exports.json`` in the run directory: each destination's :class:`ExportStats`."""
        path = Path(run_dir) / REPORT_NAME
        try:
            from ..rundir import atomic_write

            atomic_write(path, (json.dumps({"exports": [asdict(s) for s in self.report()]}, indent=1)
                                + "\n").encode())
            return path
        except Exception:  # noqa: BLE001 - the report of the exports must not cost anything either
            return None
