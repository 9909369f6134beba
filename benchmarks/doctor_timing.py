"""How long `traceml slurm doctor` takes: --local on this node, and the default tier on a 2-node job.

    python benchmarks/doctor_timing.py                      # --local only (any machine)
    scripts/dev-cluster exec python benchmarks/doctor_timing.py --cluster   # plus the 2-node job
    scripts/dev-cluster exec python benchmarks/doctor_timing.py --allocation [--busy 1] [--against DIR]

``--allocation``: --local in the batch shell of a real 2-node job with GPUs (what a user runs first:
the resolver, the controller and torch all have work there), ``--runs`` times, with ``--busy N``
busy loops beside it on the same machine (started in the job, ended by pid), and with ``--against
DIR`` each run also with DIR/src first on the path (another checkout: the before/after of a change
side by side in one job). Prints the wall time (median, min, max), the CPU time, the slowest
check, and the load average while it ran.

Targets (issue 5, issue 27): --local under 2 s on a CPU node, also in a real allocation and with a
busy loop beside it; the default tier under 30 s on 2 nodes. Prints figures; it asserts nothing
(speed is measured here, not in unit tests).
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


def in_job(runs: int, busy: int, srcs: list[str], out: str, renice: int) -> None:
    """Inside the job's batch shell: the runs, each version in turn, with the busy loops beside them."""
    if renice:
        os.nice(renice)  # the doctor, its children and the busy loops alike (see --renice)
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    rows = []
    try:
        time.sleep(1.0 if busy else 0.0)  # let the loops take their share
        for _ in range(runs):
            for src in srcs:
                e = {**os.environ, "PYTHONPATH": src}
                t0 = time.perf_counter()
                before = os.times()
                p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "doctor", "--local", "--json"],
                                   capture_output=True, text=True, env=e)
                wall = time.perf_counter() - t0
                after = os.times()
                cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
                report = json.loads(p.stdout)
                slowest = max(report["checks"], key=lambda c: c["duration_s"])
                torch = next((o["data"].get("import_s") for c in report["checks"] if c["id"] == "sw.torch"
                              for o in c["nodes"].values()), None)
                rows.append({"src": src, "wall": wall, "cpu": cpu, "slowest": [slowest["id"], slowest["duration_s"]],
                             "torch_import": torch,
                             "load": os.getloadavg()[0], "summary": report["summary"],
                             "failed": [c["id"] for c in report["checks"] if c["status"] == "fail"]})
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    Path(out).write_text(json.dumps(rows))


def allocation(runs: int, busy: int, against: str, renice: int) -> None:
    base = Path(os.environ.get("TRACEML_CLUSTER_DIR", "/tmp")) / "jobs"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="doctor-bench-", dir=base))
    srcs = [str(SRC)] + ([str(Path(against).resolve() / "src")] if against else [])
    out = work / "rows.json"
    script = work / "job.sh"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --signal=TERM@120", f"cd {work}",
        f"{sys.executable} {Path(__file__).resolve()} --in-job {out} --runs {runs} --busy {busy} --renice {renice} "
        + " ".join(f"--src {s}" for s in srcs)]) + "\n")
    subprocess.run(["sbatch", "--wait", "-N2", "--ntasks-per-node=1", "--gres=gpu:2", "--time=30",
                    f"--output={work}/out.txt", str(script)], capture_output=True, text=True, env=env(), cwd=work,
                   check=True)
    rows = json.loads(out.read_text())
    print(f"--local in the batch shell of a 2-node job with GPUs, {busy} busy loop(s) beside it, {runs} runs each "
          f"({os.cpu_count()} CPUs; load average {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f}"
          + (f"; everything at nice {renice}" if renice else "") + "):")
    medians = {}
    for src in srcs:
        mine = [r for r in rows if r["src"] == src]
        walls = [r["wall"] for r in mine]
        medians[src] = statistics.median(walls)
        slow = max(mine, key=lambda r: r["slowest"][1])["slowest"]
        label = "this checkout" if src == srcs[0] else f"{against}"
        over = [r["wall"] - r["torch_import"] for r in mine if r.get("torch_import") is not None]
        if over:  # what the doctor adds to `import torch` in its child, which is the floor of --local
            print(f"  {label}: `import torch` in the child median {statistics.median(r['torch_import'] for r in mine if r.get('torch_import') is not None):.2f} s; "
                  f"the doctor's own time around it median {statistics.median(over):.2f} s")
        print(f"  {label}: median {medians[src]:.2f} s, min {min(walls):.2f} s, max {max(walls):.2f} s; CPU median "
              f"{statistics.median(r['cpu'] for r in mine):.2f} s (doctor and its children); slowest check {slow[0]} "
              f"{slow[1]:.2f} s; {mine[-1]['summary']}, failed: {', '.join(mine[-1]['failed']) or 'none'}")
    if len(srcs) > 1:
        print(f"  ratio this/against: {medians[srcs[0]] / medians[srcs[1]]:.2f} (target: under 2 s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cluster", action="store_true", help="also time the default tier in a 2-node sbatch job")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--allocation", action="store_true", help="--local in the batch shell of a real 2-node job")
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside it (--allocation)")
    ap.add_argument("--against", default="", help="another checkout, timed side by side (--allocation)")
    ap.add_argument("--renice", type=int, default=0,
                    help="run the doctor and the busy loops at this niceness (root: -20 approximates a quiet machine "
                         "on one that other work loads; --allocation)")
    ap.add_argument("--in-job", default="", help=argparse.SUPPRESS)
    ap.add_argument("--src", action="append", default=[], help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.in_job:
        in_job(ns.runs, ns.busy, ns.src, ns.in_job, ns.renice)
        return
    if ns.allocation:
        allocation(ns.runs, ns.busy, ns.against, ns.renice)
        return
    local(ns.runs)
    if ns.cluster:
        cluster(ns.nodes)


if __name__ == "__main__":
    main()
