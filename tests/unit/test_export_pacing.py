"""The pacing of live exports (``exporters/live.py``): a batch every ``--export-interval``
seconds, stretched when building one takes more than SHARE of the time, except after the first
build, which pays the summary modules' one-time imports (a second on a busy node: paced, it left
a run with no live point for ~20 s)."""

from __future__ import annotations

import time

from traceml_core.exporters.batch import RunIdentity
from traceml_core.exporters.live import SHARE, LiveExports


def slow_summary(seconds: float):
    def build():
        time.sleep(seconds)
        return {}
    return build


def test_the_first_build_is_not_paced_and_later_ones_are(tmp_path):
    live = LiveExports(RunIdentity("pace", None, time.time(), 1, 1, ("h",), "train.py", str(tmp_path)),
                       tmp_path, kinds=(), interval_s=1.0)
    live.tick(slow_summary(0.3))     # cold: 0.3 s would stretch the next interval to 6 s
    wait = live.next_at - time.monotonic()
    assert wait <= 1.0, wait
    live.tick(slow_summary(0.3))     # a build that slow from now on is paced
    wait = live.next_at - time.monotonic()
    assert wait > 0.3 / SHARE / 2, wait   # 6 s, less what a loaded machine took to get here
