"""LiveFeed: one background thread that polls the aggregator for snapshots for the live views.

The terminal view, the status lines and the dashboard all read the feed, never the aggregator:
one request per interval whatever the number of readers, and a slow or dead aggregator can only
make the feed's numbers old (which the views show), never block a view or training. The feed
also keeps a bounded history over time (throughput per rank, CPU/GPU use per node) for the
dashboard's time charts: at most :data:`HISTORY_POINTS` points, halved (every other point
dropped) when full, so it always spans the whole run.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ..livesnapshot import LiveSnapshot
from .snapshot import VERDICT_AFTER_STEPS, LiveState, read_snapshot

#: seconds between two verdict computations in the aggregator (a provisional summary)
VERDICT_EVERY_S = 5.0
HISTORY_POINTS = 1200

Fetch = Callable[[dict[str, Any]], Optional[LiveSnapshot]]


class LiveFeed:
    def __init__(self, fetch: Fetch, interval: float = 0.5, *, series: bool = False,
                 timeout: float = 1.0) -> None:
        self._fetch = fetch
        self.interval = interval
        self.series = series
        self.timeout = timeout
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._frame: Optional[LiveSnapshot] = None
        self._state: Optional[LiveState] = None
        self._next_verdict = 0.0
        self.updates = 0
        self.failures = 0
        self.last_error: Optional[str] = None
        self._last_ok: Optional[float] = None
        self.started = time.monotonic()
        self._hist: dict[str, Any] = {"t": [], "rate": {}, "cpu": {}, "gpu": {}}

    # --- thread ------------------------------------------------------------------------------
    def start(self) -> "LiveFeed":
        self._thread = threading.Thread(target=self._run, name="traceml-live-feed", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_poll: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1.0)
        if final_poll:
            self.poll()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.poll()
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - t0)))

    def poll(self) -> Optional[LiveState]:
        """One request now (also used for the final picture); never raises."""
        now = time.monotonic()
        st = self._state
        want_verdict = (now >= self._next_verdict and st is not None
                        and max((r.received for r in st.ranks), default=0) >= VERDICT_AFTER_STEPS)
        try:
            frame = self._fetch({"series": self.series, "verdict": want_verdict})
        except Exception as exc:  # the fetch is the launcher's; still never raise from here
            frame, err = None, f"{type(exc).__name__}: {exc}"
        else:
            err = None if frame is not None else "the aggregator did not answer"
        if frame is not None and frame.error:
            frame, err = None, f"the aggregator could not build a snapshot: {frame.error}"
        with self._lock:
            if frame is None:
                self.failures += 1
                self.last_error = err
                return None
            if want_verdict:
                self._next_verdict = now + VERDICT_EVERY_S
            try:
                state = read_snapshot(frame, self._frame, self._state, now)
            except Exception as exc:  # a malformed frame: keep the old state, say why
                self.failures += 1
                self.last_error = f"unreadable snapshot: {type(exc).__name__}: {exc}"
                return None
            self._frame, self._state = frame, state
            self._last_ok = now
            self.last_error = None
            self.updates += 1
            self._record(state)
            return state

    # --- readers ---------------------------------------------------------------------------------
    def state(self) -> Optional[LiveState]:
        """The latest state as it looks now (ages grown since it was read)."""
        with self._lock:
            st = self._state
        return None if st is None else st.aged()

    def contact(self) -> tuple[bool, Optional[float], Optional[str]]:
        """(aggregator answering, seconds since the last good snapshot, last error)."""
        with self._lock:
            age = None if self._last_ok is None else time.monotonic() - self._last_ok
            ok = self.last_error is None and self._last_ok is not None
            return ok, age, self.last_error

    def history(self) -> dict[str, Any]:
        with self._lock:
            h = self._hist
            return {"t": list(h["t"]), "rate": {k: list(v) for k, v in h["rate"].items()},
                    "cpu": {k: list(v) for k, v in h["cpu"].items()},
                    "gpu": {k: list(v) for k, v in h["gpu"].items()}}

    def _record(self, st: LiveState) -> None:
        h = self._hist
        n = len(h["t"])
        h["t"].append(round(st.elapsed_s, 2))

        def put(table: dict[str, list], key: str, value: Optional[float]) -> None:
            col = table.get(key)
            if col is None:
                col = table[key] = [None] * n
            col.append(None if value is None else round(value, 3))

        for r in st.ranks:
            put(h["rate"], str(r.rank), r.rate)
        for node in st.nodes:
            put(h["cpu"], str(node.node), node.cpu_pct)
            for g in node.gpus:
                put(h["gpu"], f"{node.node}:{g.index}", g.util_pct)
        for table in (h["rate"], h["cpu"], h["gpu"]):
            for col in table.values():
                if len(col) < n + 1:
                    col.append(None)
        if len(h["t"]) >= HISTORY_POINTS:
            h["t"] = h["t"][::2]
            for table in (h["rate"], h["cpu"], h["gpu"]):
                for k in list(table):
                    table[k] = table[k][::2]
