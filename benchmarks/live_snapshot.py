"""What the live views cost the aggregator: ``snapshot`` round trips while ranks send steps.

A real aggregator process, ``--ranks`` simulated ranks on loopback (real hello, ``steps`` frames
of 20 records at 20 frames/s each, like the SDK's 50 ms shipping), and the launcher's control
link asking for snapshots the way the views do: plain (terminal, 2 Hz), with series (dashboard,
1 Hz) and with the verdict so far (every 5 s). Prints per kind: round-trip p50/p99/max, the
frame size, and the aggregator's CPU per snapshot (process CPU time during a burst of requests
minus its CPU while only ingesting).

    PYTHONPATH=src python benchmarks/live_snapshot.py --ranks 8 --requests 200
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import sys

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import LocalRun  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.codec import encode as encode_snapshot
from traceml_core.wire.auth import make_hello, relay_aud
from traceml_core.wire.protocol import STEP_COLUMNS, FrameBuffer, encode

TOKEN = "bench-token-0123456789"


def cols(seq: int, n: int) -> dict[str, list[int]]:
    t = time.time_ns()
    base = {c: [(5 + (i % 7)) * 1_000_000 for i in range(n)] for c in STEP_COLUMNS}
    base["step"] = list(range(seq, seq + n))
    base["t_end_ns"] = [t - (n - i) * 2_500_000 for i in range(n)]
    base["mem_peak"] = [300 << 20] * n
    return base


def rank_sender(port: int, rank: int, stop: threading.Event) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(encode(make_hello(TOKEN, aud=relay_aud(0), run="bench", job=None, node=0, rank=rank,
                                kind="rank", host="bench")))
    fb = FrameBuffer()
    while not list(fb.feed(s.recv(65536))):
        pass
    seq = 0
    while not stop.is_set():
        s.sendall(encode({"t": "steps", "rank": rank, "seq": seq, "n": 20, "cols": cols(seq, 20), "dropped": 0}))
        seq += 20
        stop.wait(0.05)
    s.sendall(encode({"t": "bye", "rank": rank, "status": "clean", "steps": seq, "dropped": 0}))
    s.close()


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = LocalRun(AggregatorSettings(run_name="bench", token=TOKEN, run_dir=Path(tmp) / "bench",
                                          port=0, nproc_per_node=args.ranks, mode="cli"),
                       flush_s=0.1, tail=True)   # the live modes' relay: its merge window, the windows' last records
        h = run.handle
        stop = threading.Event()
        senders = [threading.Thread(target=rank_sender, args=(run.port, r, stop), daemon=True)
                   for r in range(args.ranks)]
        for t in senders:
            t.start()
        time.sleep(args.warmup_s)
        c0, t0 = proc_cpu(h.pid), time.monotonic()
        time.sleep(2.0)
        idle_cpu_per_s = (proc_cpu(h.pid) - c0) / (time.monotonic() - t0)
        assert h.control is not None
        print(f"ranks {args.ranks}, ingest only: aggregator CPU {100 * idle_cpu_per_s:.1f} % of a core")
        print(f"{'request':<22}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'bytes':>9}{'CPU ms/req':>12}")
        for name, req in (("plain (terminal)", {}), ("series (dashboard)", {"series": True}),
                          ("verdict (every 5 s)", {"verdict": True})):
            times, size = [], 0
            c0, t0 = proc_cpu(h.pid), time.monotonic()
            for _ in range(args.requests):
                a = time.perf_counter()
                frame = h.snapshot(req, timeout=5.0)
                times.append((time.perf_counter() - a) * 1000)
                size = len(msgpack.packb(encode_snapshot(frame), use_bin_type=True))
            wall = time.monotonic() - t0
            cpu = (proc_cpu(h.pid) - c0 - idle_cpu_per_s * wall) / args.requests * 1000
            times.sort()
            print(f"{name:<22}{times[len(times) // 2]:>9.2f}{times[int(0.99 * (len(times) - 1))]:>9.2f}"
                  f"{times[-1]:>9.2f}{size:>9,}{max(0.0, cpu):>12.2f}")
        stop.set()
        for t in senders:
            t.join()
        run.finish(0)


if __name__ == "__main__":
    main()
