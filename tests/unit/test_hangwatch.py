"""The stall rule of the hang report (launcher/hangwatch.py), fed the statuses node 0 sees."""

from __future__ import annotations

from traceml_core.launcher.hangwatch import HangWatch


def test_auto_threshold_is_a_minute_or_twenty_median_steps():
    w = HangWatch("auto")
    assert w.threshold(100.0)[0] == 60.0          # 20 x 0.1 s < 60 s
    assert w.threshold(10_000.0)[0] == 200.0      # 20 x 10 s
    assert w.threshold(None)[0] == 60.0
    assert HangWatch("15").threshold(10_000.0) == (15.0, "--hang-report-after=15")


def test_one_report_per_stall_and_none_before_the_first_step_or_after_the_end():
    w = HangWatch("10")
    assert w.observe(0.0, 0, True, None) is None
    assert w.observe(30.0, 0, True, None) is None, "no step yet: start-up is not judged"
    w.observe(31.0, 50, True, 5.0)
    assert w.observe(40.0, 50, True, 5.0) is None, "9 s without a step: not yet"
    stall = w.observe(41.5, 50, True, 5.0)
    assert stall is not None and stall.threshold_s == 10.0
    assert w.observe(60.0, 50, True, 5.0) is None, "one report per stall"
    assert w.observe(61.0, 60, True, 5.0) is None and stall.resolved_after_s == 30.0
    assert w.observe(80.0, 60, False, 5.0) is None, "every rank said goodbye: not a hang"
    assert w.observe(90.0, 60, True, 5.0) is not None, "a later stall gets its own report"
    assert HangWatch("off").observe(1e6, 5, True, 1.0) is None
