"""Fixtures of the single-node fault suite (real processes on loopback, see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # aggpeers: raw wire peers

import harness  # noqa: E402


@pytest.fixture(scope="session")
def baseline(tmp_path_factory) -> Callable[..., harness.Run]:
    """The same faulty_train.py run under plain torchrun, WITHOUT TraceML (telemetry off): the
    reference for training's own exit code and result. Cached per argument list."""
    cache: dict[tuple[str, ...], harness.Run] = {}

    def get(*script_args: str, nproc: int = 2) -> harness.Run:
        key = (str(nproc),) + script_args
        if key not in cache:
            tmp = tmp_path_factory.mktemp("baseline")
            cache[key] = harness.run(tmp, script_args, nproc=nproc, traceml=False, timeout=90)
        return cache[key]

    return get


@pytest.fixture
def aggregator(tmp_path):
    """A real aggregator process (as tests/unit's fixture); yields a factory of settings overrides."""
    from aggpeers import make_settings
    from traceml_core.aggregator.process import start_aggregator

    handles = []

    def start(**kw):
        h = start_aggregator(make_settings(tmp_path, **kw))
        handles.append(h)
        return h

    yield start
    for h in handles:
        if h.alive():
            h.kill()
