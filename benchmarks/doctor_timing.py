"""How long `traceml slurm doctor` takes: --local on this node, and the default tier on a 2-node job.

    python benchmarks/doctor_timing.py                      # --local only (any machine)
    scripts/dev-cluster exec python benchmarks/doctor_timing.py --cluster   # plus the 2-node job

Targets (issue 5): --local under 2 s on a CPU node; the default tier under 30 s on 2 nodes.
Prints wall-clock figures; it asserts nothing (speed is measured here, not in unit tests).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SLURMD_", "TRACEML_DOCTOR_"))}
    e["PYTHONPATH"] = str(SRC)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    return e


def local(runs: int) -> None:
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "doctor", "--local", "--json"],
                           capture_output=True, text=True, env=env())
        walls.append(time.perf_counter() - t0)
        report = json.loads(p.stdout)
    slowest = max(report["checks"], key=lambda c: c["duration_s"])
    print(f"--local on {os.uname().nodename} ({os.cpu_count()} CPUs), {runs} runs: "
          f"median {statistics.median(walls):.2f} s, min {min(walls):.2f} s, max {max(walls):.2f} s "
          f"(slowest check {slowest['id']} {slowest['duration_s']:.2f} s; target < 2 s)")


def cluster(nodes: int) -> None:
    base = Path(os.environ.get("TRACEML_CLUSTER_DIR", "/tmp")) / "jobs"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="doctor-bench-", dir=base))
    script = work / "job.sh"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --signal=TERM@60", f"cd {work}",
        "t0=$(date +%s.%N)",
        f"{sys.executable} -m traceml_core.cli slurm doctor --json > report.json 2> stderr.txt",
        "t1=$(date +%s.%N)", "echo \"$t0 $t1\" > wall.txt"]) + "\n")
    script.chmod(0o755)
    t0 = time.perf_counter()
    job = subprocess.run(["sbatch", "--parsable", f"-N{nodes}", "--ntasks-per-node=1", "--time=30",
                          f"--output={work}/out.txt", str(script)], capture_output=True, text=True, env=env(), cwd=work,
                         check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.2)
    total = time.perf_counter() - t0
    a, b = (float(x) for x in (work / "wall.txt").read_text().split())
    report = json.loads((work / "report.json").read_text())
    phases = {c["id"]: c["duration_s"] for c in report["checks"] if c["id"].startswith("cross.")}
    print(f"default tier on {nodes} nodes (job {job}): doctor {b - a:.2f} s in the batch shell "
          f"(sbatch to end {total:.1f} s); summary {report['summary']}; target < 30 s")
    print("  cross-node phases: " + ", ".join(f"{k[6:]} {v:.2f} s" for k, v in phases.items() if v > 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cluster", action="store_true", help="also time the default tier in a 2-node sbatch job")
    ap.add_argument("--nodes", type=int, default=2)
    ns = ap.parse_args()
    local(ns.runs)
    if ns.cluster:
        cluster(ns.nodes)


if __name__ == "__main__":
    main()
