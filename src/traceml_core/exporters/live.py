"""The aggregator's side of the live exports: when to build a batch, and the end.

:meth:`LiveExports.tick` runs inside the aggregator's loop: it builds a provisional summary of the
run so far (the typed run data, as the live views' verdict does), turns it into a batch and offers
it to the destinations. It is paced like the checkpoints: the next one comes after
``--export-interval`` seconds, or later when building took more than :data:`SHARE` of the time
since (at 4,096 ranks a summary takes ~0.8 s: one batch every ~16 s); the first build, which pays
the one-time imports, is not paced. :meth:`LiveExports.finish`
runs after the final summary is written: the rest of the series and the files, within a deadline,
then ``exports.json`` and one log line per destination.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..report.document import Summary, read
from .batch import BatchBuilder, FinalFiles, RunIdentity
from .hub import Exporter, ExportHub, ExportStats
from .output import registry

#: the largest share of the wall clock spent building batches (the interval stretches): node 0's
#: aggregator shares the node's cores with training
SHARE = 0.05


def makers(kinds: Sequence[str], given: Mapping[str, Any]) -> dict[str, Callable[[], Exporter]]:
    """kind -> a function that builds its exporter (in the destination's own thread) with its
    settings: its option rows' values from ``given`` (the launch's), else their defaults."""
    reg = registry()
    return {k: functools.partial(reg.outputs[k].start, reg.settings(k, given)) for k in kinds}


class LiveExports:
    """The live destinations of one run. It knows the run only through what the aggregator hands
    it (its identity, and a function that builds the provisional summary of the run so far), so
    exporters depend on the summary's types, never on the aggregator's state: the aggregator
    produces, an exporter ships."""

    def __init__(self, identity: RunIdentity, run_dir: Path, kinds: Sequence[str], interval_s: float,
                 settings: Optional[Mapping[str, Any]] = None) -> None:
        self.identity = identity
        self.run_dir = Path(run_dir)
        self.hub = ExportHub(makers(kinds, settings or {}), self.identity)
        self.builder = BatchBuilder()
        self.interval = interval_s
        self.next_at = time.monotonic() + self.interval
        self.build_seconds = 0.0
        self.builds = 0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def tick(self, summary_so_far: Callable[[], "Summary | dict[str, Any]"]) -> None:
        """Build and offer one batch of the run so far (in the aggregator's loop; never raises)."""
        t0 = time.perf_counter()
        try:
            self.hub.offer(self.builder.build(summary_so_far(), at=time.time()))
        except Exception:  # noqa: BLE001 - an export must never cost the run anything
            pass
        dt = time.perf_counter() - t0
        self.build_seconds += dt
        self.builds += 1
        # the first build pays one-time imports (the summary's modules: a second on a busy node),
        # which would stretch the next interval to ~20 s with no live point in between: it is
        # not paced; every later build is
        paced = dt / SHARE if self.builds > 1 else 0.0
        self.next_at = time.monotonic() + max(self.interval, paced)

    def finish(self, summary: dict[str, Any], files: dict[str, Any]) -> list[str]:
        """The final batch (after the summary is written): returns the lines to log."""
        try:
            doc = read(summary)
            final = FinalFiles(doc.run.status or "completed", files.get("summary_json"),
                               files.get("summary_txt"), files.get("summary_html"))
            batch = self.builder.build(doc, at=time.time(), final=final)
        except Exception as exc:  # noqa: BLE001
            return [f"live exports: the final batch could not be built ({type(exc).__name__}: {exc})"]
        stats = self.hub.finish(batch)
        path = self.hub.write_report(self.run_dir)
        helpers = self.hub.helpers_stopped
        return ([s.line() for s in stats]
                + ([f"stopped what the destinations' libraries left running: {', '.join(helpers)}"] if helpers else [])
                + ([f"export report: {path}"] if path else []))

    def report(self) -> list[ExportStats]:
        return self.hub.report()


def live_exports(identity: RunIdentity, run_dir: Path, export: Sequence[str], interval_s: float,
                 settings: Optional[Mapping[str, Any]] = None) -> Optional[LiveExports]:
    """The run's live exports, or None when none was asked for. ``settings``: the outputs'
    option values by key (AggregatorSettings.export_settings)."""
    live = registry().live_kinds()
    kinds = [k for k in export if k in live]
    return LiveExports(identity, run_dir, kinds, interval_s, settings) if kinds else None
