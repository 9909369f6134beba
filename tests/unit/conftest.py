from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from aggpeers import make_settings  # noqa: E402
from traceml_core.aggregator.process import start_aggregator  # noqa: E402


@pytest.fixture
def aggregator(tmp_path):
    """Start a real aggregator process; yields a factory taking settings overrides."""
    handles = []

    def start(**kw):
        h = start_aggregator(make_settings(tmp_path, **kw))
        handles.append(h)
        return h

    yield start
    for h in handles:
        if h.alive():
            h.kill()
