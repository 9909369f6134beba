"""The committed environment dumps still match what the cluster produces.

The resolver's table-driven tests trust tests/fixtures/slurm_env/<generation>/*.json. This
re-captures two situations on the live cluster (into a temporary directory) and compares them with
the committed files of the cluster's own Slurm generation (22.05 or 24.11), so a change to the
cluster's config or to capture.py that would make the fixtures stale fails here instead of silently.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm_env"

# Values that differ from one capture to the next by nature (ids, ports, pids, paths of this cluster).
# The job's start and end times (24.11) are compared as their difference, the job's time limit.
VOLATILE = ("JOB_ID", "JOBID", "PORT", "TASK_PID", "SLURM_CONF", "CLUSTER_NAME", "WORKING_CLUSTER",
            "IPADDR", "COMM_HOST", "SUBMIT_DIR", "PWD", "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME")


def _load_capture():
    spec = importlib.util.spec_from_file_location("capture", FIXTURES / "capture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["capture"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _stable(doc: dict) -> dict:
    out = {k: v for k, v in doc.items() if k != "_meta" and not any(x in k for x in VOLATILE)}
    if "SLURM_JOB_END_TIME" in doc:
        out["time limit (end - start)"] = int(doc["SLURM_JOB_END_TIME"]) - int(doc["SLURM_JOB_START_TIME"])
    return out


@pytest.mark.parametrize("key", ["gres", "wnode2"])
def test_fresh_capture_matches_committed_dumps(slurm_cluster, tmp_path, key):
    capture = _load_capture()
    situation = next(s for s in capture.SITUATIONS if s.key == key)
    written = capture.capture(slurm_cluster, situation, str(tmp_path))
    assert written, "the situation produced no dump"
    gen = capture.generation(slurm_cluster.run("scontrol", "--version").stdout)
    assert (FIXTURES / gen).is_dir(), f"no committed dumps for Slurm {gen}: run capture.py on this cluster"
    for name in written:
        fresh = json.loads((tmp_path / name).read_text())
        committed = json.loads((FIXTURES / gen / name).read_text())
        assert fresh["_meta"]["slurm_version"] == committed["_meta"]["slurm_version"]
        assert sorted(fresh) == sorted(committed), f"{name}: variables differ; rerun capture.py"
        assert _stable(fresh) == _stable(committed), f"{name}: values differ; rerun capture.py"
        assert fresh["_meta"]["command"] == committed["_meta"]["command"]
