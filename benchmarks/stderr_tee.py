"""What passing a worker's stderr through the torchrun process costs the worker (launcher/stderrtee.py).

A child process writes ``--mb`` MB to its stderr in lines of ``--line`` bytes, one ``write`` +
``flush`` per line (as ``logging`` does), and times itself; its stderr is either a pipe straight to a
reader (what torchrun gives a worker: the terminal, here a pipe drained as fast as it fills) or the
tee's pipe, copied by the tee's thread to that same reader while it keeps the last lines. Paired
runs, alternating (ABBA), so the machine's load falls on both alike; prints the child's wall time
per run, the medians side by side and their ratio.

    PYTHONPATH=src python benchmarks/stderr_tee.py [--mb 20] [--line 100] [--pairs 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from traceml_core.launcher.stderrtee import WorkerStderr  # noqa: E402

CHILD = """
import sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
line = b"x" * (size - 1) + b"\\n"
w = sys.stderr.buffer
t0 = time.perf_counter()
for _ in range(n):
    w.write(line)
    w.flush()
sys.stdout.write(f"{time.perf_counter() - t0:.6f}")
"""


def _drain(fd: int) -> threading.Thread:
    def run() -> None:
        while os.read(fd, 1 << 16):
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def one(tee: bool, lines: int, size: int) -> float:
    r, w = os.pipe()
    reader = _drain(r)
    if tee:
        t = WorkerStderr(dest=w)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(lines), str(size)],
                                 stdout=subprocess.PIPE, stderr=t.writer)
        t.started()
    else:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(lines), str(size)],
                                 stdout=subprocess.PIPE, stderr=w)
    took = float(child.communicate()[0])
    if tee:
        t.done.wait(30)
    os.close(w)
    reader.join(30)
    os.close(r)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--line", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    lines = int(a.mb * 1e6 / a.line)
    runs: dict[bool, list[float]] = {False: [], True: []}
    for i in range(a.pairs):
        for tee in ((False, True) if i % 2 == 0 else (True, False)):
            runs[tee].append(one(tee, lines, a.line))
    direct, teed = statistics.median(runs[False]), statistics.median(runs[True])
    print(f"stderr_tee: {lines:,} lines of {a.line} B ({a.mb:g} MB), one write+flush each, {a.pairs} pairs (ABBA), "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  direct pipe : {' '.join(f'{t:.3f}' for t in runs[False])} s  median {direct:.3f} s "
          f"({a.mb / direct:.1f} MB/s, {direct / lines * 1e6:.2f} us/line)")
    print(f"  through tee : {' '.join(f'{t:.3f}' for t in runs[True])} s  median {teed:.3f} s "
          f"({a.mb / teed:.1f} MB/s, {teed / lines * 1e6:.2f} us/line)")
    print(f"  ratio tee/direct: {teed / direct:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
