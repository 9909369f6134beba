"""One thread per destination, each behind a small bounded queue: the aggregator never waits.

:meth:`ExportHub.offer` puts a batch on every destination's queue without blocking; a full queue
means that destination is slower than the run, and the batch is dropped there and counted.
:meth:`ExportHub.finish` hands over the final batch (making room by dropping the oldest waiting
one) and waits for the destinations up to a deadline. :meth:`ExportHub.report` says, per
destination, what was written, what was dropped and why, and what was still queued at the end
with what the destination was doing then (``exports.json``, the log): a destination that hangs
(a server that accepts and never answers, a W&B that cannot reach its host) is named with what it
was stuck in, never reported as fine. Then the helper processes the destinations' libraries
started (W&B's ``wandb-core`` service) are stopped: they must not outlive the run.
"""

from __future__ import annotations

import json
import os
import queue
import signal
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
#: seconds a helper process of a destination's library gets after SIGTERM, before SIGKILL
HELPER_GRACE_S = 2.0


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
    #: at the end, what had not been written when the deadline passed: the batches still waiting
    #: in its queue and the one it was working on (never written, so never counted as written)
    points_queued: int = 0
    batches_queued: int = 0
    #: what the destination was doing when the deadline passed ("writing a batch for 41 s")
    stuck_in: Optional[str] = None

    def line(self) -> str:
        out = f"export {self.kind}: {self.points_written:,} points written"
        if self.target:
            out += f" to {self.target}"
        if self.points_dropped:
            out += (f"; {self.points_dropped:,} dropped ({self.batches_dropped:,} batches"
                    + (" after its error" if self.error else ": it was slower than the run") + ")")
        if self.points_queued:
            out += f"; {self.points_queued:,} still queued ({self.batches_queued:,} batches) at the end"
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
        #: what the thread is doing now, since when (monotonic), and the batch it holds
        self.doing, self.since = "starting", time.monotonic()
        self.holding: Optional[Batch] = None
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

    def _doing(self, what: str, batch: Optional[Batch] = None) -> None:
        with self._lock:
            self.doing, self.since, self.holding = what, time.monotonic(), batch

    def _main(self) -> None:
        exporter: Optional[Exporter] = None
        try:
            self._doing("opening (starting its library, connecting)")
            exporter = self._make()
            exporter.open(self._run)
            self.stats.target = str(getattr(exporter, "target", "") or "")
        except Exception as exc:  # noqa: BLE001 - a destination must never take anything down
            self._fail(exc)
        while True:
            self._doing("waiting for a batch")
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
                    self._doing("writing the final batch and the summary's files", item)
                    exporter.close(item)
                    self.stats.finished = True
                else:
                    self._doing("writing a batch", item)
                    exporter.write(item)
                with self._lock:
                    self.holding = None
                    self.stats.batches += 1
                    self.stats.points_written += item.size
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                with self._lock:
                    self.holding = None
                self._dropped(item)
            if item.final is not None:
                return

    def give_up(self, deadline_s: float) -> None:
        """The deadline passed with the thread still working: count what it holds and what
        waits as queued (not written, not dropped by us), and say what it was stuck in."""
        waiting: list[Batch] = []
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                waiting.append(item)
        with self._lock:
            if self.holding is not None:
                waiting.append(self.holding)
            self.stats.points_queued = sum(b.size for b in waiting)
            self.stats.batches_queued = len(waiting)
            stuck = f"{self.doing} for {time.monotonic() - self.since:.0f} s"
            self.stats.stuck_in = stuck
            if self.stats.error is None:
                self.stats.error = f"no answer within the {deadline_s:g} s the end allows: still {stuck}"

    def _fail(self, exc: BaseException) -> None:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.stats.error = f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class ExportHub:
    """The destinations of one run. ``makers``: kind -> a function that builds its exporter."""

    def __init__(self, makers: dict[str, Callable[[], Exporter]], run: RunIdentity) -> None:
        self.run = run
        #: this process's descendants before any destination started (theirs are the others)
        self._before = descendants(os.getpid())
        #: the helper processes of the destinations' libraries stopped at the end ("4242 wandb-core")
        self.helpers_stopped: list[str] = []
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
        for w in self.workers:
            if w.thread.is_alive():
                w.give_up(deadline_s)
        self.helpers_stopped = stop_helpers(self._before)
        return self.report()

    def report(self) -> list[ExportStats]:
        return [w.stats for w in self.workers]

    def write_report(self, run_dir: Path) -> Optional[Path]:
        """``exports.json`` in the run directory: each destination's :class:`ExportStats`."""
        path = Path(run_dir) / REPORT_NAME
        try:
            from ..rundir import atomic_write

            atomic_write(path, (json.dumps({"exports": [asdict(s) for s in self.report()],
                                            "helpers_stopped": self.helpers_stopped}, indent=1)
                                + "\n").encode())
            return path
        except Exception:  # noqa: BLE001 - the report of the exports must not cost anything either
            return None


# --- helper processes ------------------------------------------------------------------------------
def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, their children...), from /proc; empty where /proc
    cannot be read."""
    parent: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read(512)
        except OSError:
            continue
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            parent[int(name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in out:
                out.add(child)
                todo.append(child)
    return out


def stop_helpers(before: set[int], grace_s: float = HELPER_GRACE_S) -> list[str]:
    """Stop the processes the destinations' libraries left below this one (W&B's ``wandb-core``
    service outlived a run by 55 s): SIGTERM, then SIGKILL after ``grace_s``. Returns them, as
    "pid name"."""
    mine = descendants(os.getpid()) - before
    names = []
    for pid in sorted(mine):
        try:
            with open(f"/proc/{pid}/comm") as f:
                names.append(f"{pid} {f.read().strip()}")
        except OSError:
            names.append(str(pid))
    for pid in mine:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    alive = set(mine)
    while alive and time.monotonic() < end:
        time.sleep(0.05)
        alive = {p for p in alive if _alive(p)}
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return names


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie child, reaped by no one yet, does not)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(512)
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):
        return False
