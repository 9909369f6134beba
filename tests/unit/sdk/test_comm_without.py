"""A phase's own time is the phase less the communication it waited for; when more wait was
charged to it than it lasted, its own time is not known and is reported as not measured (-1, null
in the summary), never as a made-up 0 ms."""

from __future__ import annotations

from traceml_core.sdk.collectives import CLOCK_SLACK, without


def test_a_phase_charged_more_wait_than_it_lasted_is_not_measured_rather_than_zero():
    assert without(10_000_000, 4_000_000) == 6_000_000
    assert without(10_000_000, 10_000_000) == 0
    # two clocks (the phase's host times, DDP's reducer timings) may disagree a little
    assert without(10_000_000, int(10_000_000 * (1 + CLOCK_SLACK))) == 0
    # beyond that the wait did not all happen inside the phase: its own time is unknown
    assert without(10_000_000, 15_000_000) == -1
    assert without(-1, 5_000_000) == -1 and without(7, 0) == 7
