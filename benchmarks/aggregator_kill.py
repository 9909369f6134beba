"""Training speed before and after the aggregator is SIGKILLed mid-run (issue 9, case 2).

Runs ``traceml run`` on tests/faults/faulty_train.py (2 gloo DDP workers on CPU, steps as fast as
the machine goes: the case most sensitive to any cost on the training side), SIGKILLs the aggregator
once stepping is steady, and compares rank 0's steps/s in a window before the kill with a window
after it (skipping the first 0.5 s). A control run without the kill measures the same windows, so
the noise of a shared machine is visible next to the figure.

    PYTHONPATH=src python benchmarks/aggregator_kill.py [--reps 3] [--window 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "faults"))
from harness import Launch, Progress, aggregator_pid  # noqa: E402


def once(work: Path, i: int, *, kill: bool, window: float, warm: float) -> tuple[float, float, int]:
    tmp = work / f"{'kill' if kill else 'ctl'}{i}"
    tmp.mkdir()
    launch = Launch(tmp, ("--steps", "100000000"), run_name="bench")
    agg = aggregator_pid(launch.pid)
    deadline = time.monotonic() + 120
    first = None
    while True:  # wait for steady stepping, then `window` seconds of it
        p = Progress.read(launch.progress_dir)
        if p.steps.get(0):
            first = first or time.time()
            if time.time() - first > warm + window:
                break
        if time.monotonic() > deadline or launch.proc.poll() is not None:
            raise SystemExit(f"the run did not start stepping:\n{launch.stderr_now()[-2000:]}")
        time.sleep(0.1)
    t_kill = time.time()
    if kill:
        os.kill(agg, signal.SIGKILL)
    time.sleep(0.5 + window + 0.3)
    launch.proc.send_signal(signal.SIGTERM)  # end the endless run (and write its summary)
    r = launch.wait(60)
    steps = [t for _, t in r.progress.steps[0]]
    before = [t for t in steps if t_kill - window <= t < t_kill]
    after = [t for t in steps if t_kill + 0.5 <= t < t_kill + 0.5 + window]
    return rate(before), rate(after), r.code


def rate(ts: list[float]) -> float:
    """Steps/s from the MEDIAN step interval: robust to the scheduler pauses of a shared machine
    (a mean over the window would mostly measure the other jobs)."""
    return 1.0 / statistics.median(b - a for a, b in zip(ts, ts[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0, help="seconds measured before and after")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of stepping skipped first")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceml-aggkill-"))
    print(f"rank 0 steps/s (1 / median step interval), {args.window:.0f} s windows before / after "
          "t (after skips 0.5 s); 2 gloo workers on CPU")
    print(f"{'run':<18} {'before':>9} {'after':>9} {'after/before':>13}")
    ratios: dict[str, list[float]] = {"aggregator killed": [], "control (no kill)": []}
    for i in range(args.reps):
        for kill, label in ((True, "aggregator killed"), (False, "control (no kill)")):
            b, a, code = once(work, i, kill=kill, window=args.window, warm=args.warm)
            ratios[label].append(a / b)
            print(f"{label:<18} {b:>9.1f} {a:>9.1f} {a / b:>13.3f}")
    for label, rs in ratios.items():
        print(f"median after/before, {label}: {statistics.median(rs):.3f}")


if __name__ == "__main__":
    main()
