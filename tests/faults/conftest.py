"""Fixtures of the single-node fault suite (real processes on loopback, see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # aggpeers: raw wire peers

import harness  # noqa: E402
from aggpeers import aggregator, rig  # noqa: E402,F401  (the shared real-aggregator fixtures)


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
