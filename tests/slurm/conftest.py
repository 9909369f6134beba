"""Fixtures for tests against the real local Slurm cluster (``scripts/dev-cluster``).

Every test under tests/slurm gets the ``slurm`` marker. The ``slurm_cluster`` fixture skips, with the
command to use, when the test process is not running inside the cluster's login namespace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cluster import Cluster, ClusterError  # noqa: E402

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    """The running dev cluster; skips when the tests do not run inside its login namespace."""
    cluster, reason = Cluster.detect()
    if cluster is None:
        pytest.skip(reason)
    # Inside the namespace, a cluster that does not answer is a failure, not a reason to skip.
    try:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=20).stdout.split("\n")
    except ClusterError as exc:
        pytest.fail(f"the dev cluster does not answer: {exc}")
    down = sorted({line for line in states if line and not line.endswith(("idle", "mixed", "allocated", "completing"))})
    if down:
        pytest.fail(f"dev cluster nodes not usable: {down}; restart it with scripts/dev-cluster up")
    return cluster
