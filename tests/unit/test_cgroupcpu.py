"""cgroupcpu: a cgroup's CPU quota and throttling counters, v2 and v1 file formats (the doctor's CPU
matmul and the SDK's CPU facts read them; the real v1 hierarchy: tests/slurm/test_node_cpu_limit_slurm.py)."""

from __future__ import annotations

from traceml_core.cgroupcpu import CpuCgroup, cpu_cgroup


def test_v2_quota_and_periods(tmp_path):
    (tmp_path / "cpu.max").write_text("20000 100000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 5\nnr_periods 40\nnr_throttled 30\nthrottled_usec 900\n")
    cg = CpuCgroup(str(tmp_path), 2)
    assert (cg.quota_cpus(), cg.periods(), cg.throttled_key) == (0.2, (40, 30), "throttled_usec")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cg.quota_cpus() is None   # no quota


def test_v1_quota_and_periods(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu.stat").write_text("nr_periods 8\nnr_throttled 2\nthrottled_time 123\n")
    cg = CpuCgroup(str(tmp_path), 1)
    assert (cg.quota_cpus(), cg.periods(), cg.throttled_key) == (1.5, (8, 2), "throttled_time")
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert cg.quota_cpus() is None   # v1's "no quota"


def test_nothing_readable_is_none(tmp_path):
    cg = CpuCgroup(str(tmp_path / "gone"), 1)
    assert (cg.quota_cpus(), cg.periods()) == (None, None)
    assert cpu_cgroup("999999999") is None   # no such process: no /proc/<pid>/cgroup
