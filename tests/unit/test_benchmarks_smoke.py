"""The aggregator benchmarks still run (tiny sizes; the figures themselves are not asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ingest_benchmark_runs_without_loss_through_relays():
    out = _run("aggregator_ingest.py", "--ranks", "4", "--per-relay", "2", "--seconds", "1",
               "--records", "5", "--flush", "0.1")
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.split()[:1] == ["4"]}
    assert set(rows) == {"relay"}, out
    sent, lost = rows["relay"][2:4]
    assert int(sent.replace(",", "")) > 0 and lost == "0", out
    # fan-in: 2 relay links + the control connection, whatever the number of ranks
    assert rows["relay"][-1] == "3", out
    assert "ceiling" in out and "!!" not in out


def test_node0_scale_benchmark_runs_side_by_side():
    """Sizes side by side in one run, the tree beside direct links where it applies (512 nodes:
    23 groups), every record accounted for (the script asserts the counts)."""
    out = _run("node0_scale.py", "--ranks", "32,512", "--per-relay", "8,1", "--tree", "auto,both",
               "--at-steps", "0,36000", "--quick")
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] in (["32"], ["512"])]
    # (from step, ranks, links, groups): 4 nodes on direct links; 512 nodes through 22 group
    # relays + group 0's 23 nodes, then the same on 512 direct links
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        (at, *row) for at in ("0", "36,000")
        for row in (("32", "4", "-"), ("512", "45", "23x1s"), ("512", "512", "-"))], out
    assert "ratio 512/32 ranks, from step 36,000: cores x" in out, out
    assert "512 ranks, from step 0, group relays / direct links: cores x" in out, out


def test_memory_benchmark_runs():
    out = _run("aggregator_memory.py", "--ranks", "2", "--steps", "2000", "--batch", "100",
               "--summary-ranks", "16")
    assert "final summary for 16 ranks" in out


def test_cli_paths_do_not_import_torch():
    out = _run("cli_latency.py", "--reps", "1")
    rows = {line[:28].strip(): line.split() for line in out.splitlines()[1:] if line.strip()}
    for name in ("help", "print-config", "print-config (Slurm step)"):
        assert name in rows, out
        assert "YES" not in rows[name], f"{name} imports torch:\n{out}"


def test_gpu_check_skips_cleanly_without_cuda():
    import pytest

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: gpu_check.py is a device run, not a CI test")
    out = _run("gpu_check.py", "--quick")
    assert "SKIPPED" in out and "no CUDA device" in out


def test_live_snapshot_benchmark_runs():
    out = _run("live_snapshot.py", "--ranks", "2", "--requests", "5", "--warmup-s", "0.5")
    kinds = [line.split()[0] for line in out.splitlines()[2:]]
    assert kinds == ["plain", "series", "verdict"], out


def test_comm_benchmark_runs_side_by_side():
    out = _run("comm_overhead.py", "--steps", "4", "--reps", "3")
    rows = [line.split()[0] for line in out.splitlines()
            if len(line.split()) == 3 and line.split()[1].replace(".", "").isdigit()]
    assert rows == ["untraced", "comm-off", "comm-on"] * 2, out     # two ranks, then one
    assert "per bucket" in out and "explicit dist.all_reduce" in out


def test_step_overhead_variants_run():
    out = _run("step_overhead.py", "--steps", "10", "--reps", "2", "--variants", "traced,closures,comm-off,bare")
    assert "closures - traced" in out and "comm-off - traced" in out and "bare - traced" in out, out


def test_stderr_tee_benchmark_runs_side_by_side():
    out = _run("stderr_tee.py", "--mb", "0.2", "--pairs", "1")
    assert "direct pipe" in out and "through tee" in out and "ratio tee/direct" in out, out
