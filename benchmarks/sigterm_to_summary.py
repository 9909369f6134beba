"""Time from SIGTERM (Slurm's time limit, scancel) to a written final summary, single node.

Starts `traceml run` on a long DDP run, waits until telemetry flows, sends SIGTERM to the
launcher and measures until final_summary.json exists and until the launcher has exited.
Slurm's default KillWait, the budget, is 30 s.

    python benchmarks/sigterm_to_summary.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def once(work: Path, i: int) -> tuple[float, float, str, int]:
    run_dir = work / f"r{i}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRACEML_RUN_INFO", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "traceml"), "run", "--nproc-per-node=2",
                             f"--logs-dir={work}", f"--run-name=r{i}", "--master-port=29621",
                             "--aggregator-port=29622", str(REPO / "examples" / "ddp_minimal.py"),
                             "--steps", "10000000"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (run_dir / "aggregate.state").exists():
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("telemetry never started flowing")
        time.sleep(0.2)
    time.sleep(2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    summary = run_dir / "final_summary.json"
    while not summary.exists() and proc.poll() is None:
        time.sleep(0.02)
    t_summary = time.monotonic() - t0
    code = proc.wait(60)
    t_exit = time.monotonic() - t0
    status = json.loads(summary.read_text())["run"]["status"] if summary.exists() else "missing"
    return t_summary, t_exit, status, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceml-sigterm-"))
    print("SIGTERM to summary (2 CPU workers; budget: Slurm's default KillWait of 30 s)")
    for i in range(args.reps):
        ts, te, status, code = once(work, i)
        print(f"  run {i}: summary written after {ts:5.2f} s, launcher exited after {te:5.2f} s "
              f"(exit {code}, summary status {status})")


if __name__ == "__main__":
    main()
