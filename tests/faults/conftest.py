"""Fixtures of the single-node fault suite (real processes on loopback, see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # aggpeers: raw wire peers

import harness  # noqa: E402
from aggpeers import aggregator, rig  # noqa: E402,F401  (the shared real-aggregator fixtures)


class Baselines:
    """The same faulty_train.py run under plain torchrun, WITHOUT TraceML (telemetry off): the
    reference for training's own exit code and result. Cached per argument list."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp = tmp_path_factory
        self.cache: dict[tuple[str, ...], harness.Run] = {}

    def __call__(self, *script_args: str, nproc: int = 2) -> harness.Run:
        self.prefetch(script_args, nproc=nproc)
        return self.cache[(str(nproc),) + tuple(script_args)]

    def prefetch(self, *arg_lists: tuple[str, ...], nproc: int = 2) -> None:
        """Make the missing ones side by side (nothing in a plain run is timed: each is mostly
        torch's import), so a module that needs several waits for about one."""
        launches = {}
        for args in arg_lists:
            key = (str(nproc),) + tuple(args)
            if key not in self.cache and key not in launches:
                launches[key] = harness.Launch(self.tmp.mktemp("baseline"), args, nproc=nproc,
                                               traceml=False)
        for key, launch in launches.items():
            # (a hang guard: several side by side on a loaded 2-core machine import torch slowly)
            self.cache[key] = launch.wait(90 + 30 * len(launches))


@pytest.fixture(scope="session")
def baseline(tmp_path_factory) -> Baselines:
    return Baselines(tmp_path_factory)
