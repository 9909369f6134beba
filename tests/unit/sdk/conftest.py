"""Fixtures for the rank-side tests: a real loopback receiver and a fresh SDK per test."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from traceml_core.wire.sink import SinkServer


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    server = SinkServer("test-token", "test-run").start()
    yield server
    server.stop()


@pytest.fixture
def sdk() -> Iterator[object]:
    """The SDK module with a clean session before and after the test."""
    from traceml_core.sdk import api

    api._reset_for_tests()
    yield api
    api._reset_for_tests()


@pytest.fixture
def traceml_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="traceml")
    return caplog
