"""Fixtures for tests against the real local Slurm cluster (``scripts/dev-cluster``).

Every test under tests/slurm gets the ``slurm`` marker. The ``slurm_cluster`` fixture skips, with the
command to use, when the test process is not running inside the cluster's login namespace.

The tests in ``GENERATIONS`` also get the ``generations`` marker on the generations they name: CI
runs the whole suite on Slurm 22.05 and then only these (``-m generations``) on Slurm 24.11 and on
Slurm 25.11 (with the real pyslurm). Together they prove what differs between the generations, each
for its own reason below; everything else is the same code path on all of them and would only add
minutes (25.11's stage has 180 s of CI: its job environments are 24.11's, so the time-limit test,
which takes 90 s, runs on 24.11 only; it passes on 25.11 too: TRACEML_CLUSTER_SLURM=25.11
scripts/test tests/slurm -k time_limit). A listed test that is renamed or removed fails the collection of
its file instead of silently leaving the 24.11 run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cluster import Cluster, ClusterError  # noqa: E402

HERE = Path(__file__).parent


#: file::test (all its parameters) -> (the generations besides 22.05 it runs on, why)
GENERATIONS = {
    "test_env_fixtures.py::test_fresh_capture_matches_committed_dumps": ("24.11 25.11",
        "the committed dumps of the running generation are still what its jobs get"),
    "test_multinode.py::test_two_nodes_zero_flag_launch": ("24.11 25.11",
        "a real zero-flag 2-node x 2-worker job resolves from that generation's variables and writes the summary"),
    # 25.11's jobs have 24.11's SLURM_JOB_END_TIME (the dumps are alike): the same path, and 90 s of CI
    "test_multinode.py::test_time_limit_writes_interrupted_summary": ("24.11",
        "'time limit' from SLURM_JOB_END_TIME (24.11) or from the controller's StartTime + TimeLimit (22.05)"),
    "test_faults_slurm.py::test_scancel_writes_the_summary_before_killwait": ("24.11 25.11",
        "the words of a scancel, which the controllers describe differently"),
    "test_doctor_cluster.py::test_healthy_two_node_job_passes_every_cross_check": ("24.11 25.11",
        "the doctor's cross-node checks and its reading of the controller (scontrol) on that generation"),
    "test_words_slurm.py::test_doctor_local_in_an_salloc_shell_names_the_jobs_gpu_request": ("24.11 25.11",
        "the job's GPU request as the controller writes it (gres:gpu:2 on 22.05, gres/gpu:2 on 24.11)"),
    "test_template_job.py::test_template_refuses_a_job_that_does_not_fit": ("24.11 25.11",
        "the template's reading of partitions, MaxTime and GPU types from that generation's sinfo/scontrol"),
    "test_template_job.py::test_template_checks_a_fitting_job_and_runs_test_only": ("24.11 25.11",
        "sbatch --test-only's answer as that generation words it"),
    "test_scheduled_end_slurm.py::test_a_job_reading_signaling_is_still_ended_at_its_endtime": ("24.11 25.11",
        "a running job's state flags (SIGNALING) and EndTime after an update, as that controller shows them"),
    "test_doctor_pyslurm.py::test_doctor_through_pyslurm_and_scontrol_gives_the_same_facts": ("25.11",
        "the doctor through the real pyslurm against scontrol (only 25.11 has a pyslurm)"),
    "test_doctor_pyslurm.py::test_a_backfilled_job_without_time_limit_has_none_through_both": ("25.11",
        "Slurm's 365-day 'no limit' of a backfilled job, through pyslurm and scontrol"),
    "test_doctor_pyslurm.py::test_the_recorded_pyslurm_answers_are_still_the_real_ones": ("25.11",
        "the pyslurm recordings the unit tests replay are still what the real one returns"),
}


def _generation() -> str:
    """The running cluster's generation (the sl wrapper of a Debian 13 tree's cluster exports it)."""
    return os.environ.get("TRACEML_CLUSTER_SLURM") or "22.05"


def pytest_collection_modifyitems(config, items):
    modules = {}  # file name -> its module, for the files collected
    gen = _generation()
    for item in items:
        path = Path(str(item.fspath))
        if HERE not in path.parents:
            continue
        item.add_marker(pytest.mark.slurm)
        modules[path.name] = item.module
        entry = GENERATIONS.get(f"{path.name}::{item.originalname}")
        if entry is not None and (gen == "22.05" or gen in entry[0].split()):
            item.add_marker(pytest.mark.generations)
    for key in GENERATIONS:
        file, name = key.split("::")
        if file in modules and not callable(getattr(modules[file], name, None)):
            raise pytest.UsageError(f"tests/slurm/conftest.py GENERATIONS names {key}, which {file} no longer "
                                    "has: update the list (CI runs these on Slurm 24.11 and 25.11)")


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
