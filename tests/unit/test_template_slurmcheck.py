"""Checks of a generated job against a cluster's partitions, from `sinfo` output.

LOCAL_CLUSTER is real output of `sinfo -h -o '%P|%l|%D|%G|%a'` on the project's local Slurm
(scripts/dev-cluster, Slurm 22.05.8). The live checks against that cluster are in
tests/slurm/test_template_job.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from traceml_slurm.template import check
from traceml_slurm.template.model import resolve_job

LOCAL_CLUSTER = "debug*|infinite|2|gpu:a100:4|up\nshort|5:00|2|gpu:a100:4|up\n"
# The shape sinfo prints for a site with two GPU node types in one partition, socket bindings and MPS.
MIXED = ("gpu|2-00:00:00|4|gpu:a100:4(S:0-1)|up\n"
         "gpu|2-00:00:00|2|gpu:h100:8(S:0-1),mps:400|up\n"
         "cpu*|1-00:00:00|10|(null)|up\n"
         "old|30:00|1|gpu:2|drain\n")


def job(**given):
    return resolve_job(given, script="train.py", cwd=Path("/")).spec


def test_parse_real_sinfo():
    parts = check.parse_sinfo(LOCAL_CLUSTER)
    assert sorted(parts) == ["debug", "short"]
    assert parts["debug"].default and not parts["short"].default
    assert parts["debug"].max_minutes is None and parts["short"].max_minutes == 5
    assert parts["short"].gpu_types == {"a100"} and parts["short"].max_gpus == 4 and parts["short"].nodes == 2


def test_parse_mixed_partition():
    parts = check.parse_sinfo(MIXED)
    gpu = parts["gpu"]
    assert gpu.nodes == 6 and gpu.gpu_types == {"a100", "h100"} and gpu.max_gpus == 8
    assert gpu.max_gpus_by_type == {"a100": 4, "h100": 8} and gpu.max_minutes == 2 * 24 * 60
    assert parts["cpu"].default and parts["cpu"].max_gpus == 0
    assert parts["old"].gpu_types == set() and parts["old"].max_gpus == 2


@pytest.mark.parametrize("given,words", [
    ({"partition": "gpus"}, ["partition gpus does not exist", "debug, short"]),
    ({"partition": "short", "time": "10"}, ["MaxTime 5:00", "PENDING", "debug: infinite", "short: 5:00"]),
    ({"partition": "short", "time": "UNLIMITED"}, ["MaxTime 5:00"]),
    ({"nodes": "3"}, ["--nodes=3", "has 2 node(s)"]),
    ({"gpus_per_node": "2", "gpu_type": "h100"}, ["--gpu-type=h100", "valid there: a100"]),
    ({"gpus_per_node": "8"}, ["--gpus-per-node=8", "at most 4"]),
])
def test_problems_on_the_local_cluster(given, words):
    result = check.check_job(job(**given), check.parse_sinfo(LOCAL_CLUSTER))
    text = " ".join(result.problems)
    assert result.problems, "expected a problem"
    for word in words:
        assert word in text, text


def test_a_fitting_job_passes_and_says_what_was_checked():
    result = check.check_job(job(nodes="2", gpus_per_node="2", gpu_type="a100", time="4", partition="short"),
                             check.parse_sinfo(LOCAL_CLUSTER))
    assert result.problems == []
    assert result.partition == "short"
    assert any("MaxTime (5:00)" in p for p in result.passed)


def test_mixed_partition_gpu_counts_per_type():
    parts = check.parse_sinfo(MIXED)
    assert check.check_job(job(partition="gpu", gpus_per_node="8", gpu_type="h100"), parts).problems == []
    bad = check.check_job(job(partition="gpu", gpus_per_node="8", gpu_type="a100"), parts)
    assert "at most 4 a100" in " ".join(bad.problems)
    cpu = check.check_job(job(gpus_per_node="1"), parts)  # default partition cpu has no GPUs
    assert "have no GPU" in " ".join(cpu.problems)


def test_comma_partition_list_fits_if_any_partition_fits():
    parts = check.parse_sinfo(LOCAL_CLUSTER)
    assert check.check_job(job(partition="short,debug", time="60"), parts).problems == []
    assert check.check_job(job(partition="short", time="60"), parts).problems


def _stub_dir(tmp_path: Path, name: str, body: str) -> str:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text("#!/bin/sh\n" + body + "\n")
    f.chmod(0o755)
    return str(d)


def test_probe_is_bounded_when_the_controller_hangs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _stub_dir(tmp_path, "sinfo", "exec sleep 30") + os.pathsep + os.environ["PATH"])
    t0 = time.monotonic()
    parts, note = check.probe(timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert parts is None and "did not answer within" in note and "skipped" in note


def test_probe_reports_a_controller_that_refuses(tmp_path, monkeypatch):
    body = "echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1"
    monkeypatch.setenv("PATH", _stub_dir(tmp_path, "sinfo", body) + os.pathsep + os.environ["PATH"])
    parts, note = check.probe()
    assert parts is None and "Unable to contact slurm controller" in note


def test_probe_without_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    parts, note = check.probe()
    assert parts is None and note.startswith("no Slurm here")
    assert not check.sbatch_test_only("x.sbatch").ran
