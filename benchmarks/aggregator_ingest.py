"""Aggregator ingest benchmark: simulated ranks speaking the real wire protocol on loopback.

A real aggregator process (``start_aggregator``) is fed by a few sender processes that each hold
many rank connections (hello with HMAC, then ``steps`` frames at a fixed rate, then ``bye``).
Printed figures:

* records/s achieved (wall) and records per aggregator CPU-second (what one core can ingest);
* the bare ``msgpack.unpackb`` ceiling for the same frames, in this process, and the ratio;
* loss (records sent vs. records in the final summary; must be 0);
* control round-trip under load (a ``query`` frame: the queueing latency a frame sees);
* aggregator RSS (now and peak) and the final-summary time (``finish`` -> ``finished``).

Small by default (runs in ~15 s on a laptop); e.g. ``--ranks 1,64,512,4096`` for the issue's sizes.
Run: ``PYTHONPATH=src python benchmarks/aggregator_ingest.py [--ranks 1,64] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from traceml_core.aggregator.process import start_aggregator  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402
from traceml_core.wire.protocol import HEADER, FrameBuffer, encode, make_hello  # noqa: E402

TOKEN = "bench-token"
RUN = "bench"
VARIANTS = 8


def make_cols(n: int, rnd: random.Random) -> dict[str, list[int]]:
    """Plausible step records: ~50 ms steps with lognormal jitter, phases as fractions."""
    t0 = time.time_ns()
    steps = [int(rnd.lognormvariate(17.7, 0.15)) for _ in range(n)]  # ~50 ms
    return {
        "step": list(range(n)),
        "t_end_ns": [t0 + i * 50_000_000 for i in range(n)],
        "step_ns": steps,
        "input_ns": [int(s * rnd.uniform(0.02, 0.1)) for s in steps],
        "forward_ns": [int(s * 0.3) for s in steps],
        "backward_ns": [int(s * 0.5) for s in steps],
        "optimizer_ns": [int(s * 0.08) for s in steps],
        "h2d_ns": [-1] * n,
        "mem_peak": [8_000_000_000 + rnd.randrange(1 << 20) for _ in range(n)],
    }


def frame_bytes(rank: int, seq: int, n: int, cols_packed: bytes) -> bytes:
    """A ``steps`` frame, assembled around pre-packed columns (senders must not be the bottleneck)."""
    pk = msgpack.packb
    body = (b"\x86" + pk("t") + pk("steps") + pk("rank") + pk(rank) + pk("seq") + pk(seq)
            + pk("n") + pk(n) + pk("cols") + cols_packed + pk("dropped") + pk(0))
    return HEADER.pack(len(body)) + body


def sender(idx: int, ranks: list[int], port: int, rate: float, n: int, seconds: float,
           ready: "mp.Barrier", out: "mp.Queue") -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    rnd = random.Random(idx)
    variants = [msgpack.packb(make_cols(n, rnd)) for _ in range(VARIANTS)]
    socks = []
    for r in ranks:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(encode(make_hello(TOKEN, run=RUN, job=None, node=0, rank=r)))
        socks.append(s)
    for s in socks:  # collect the welcomes
        fb = FrameBuffer()
        got: list = []
        while not got:
            got = list(fb.feed(s.recv(4096)))
        assert got[0]["t"] == "welcome", got
    ready.wait()
    seqs = [0] * len(ranks)
    sent = 0
    start = time.monotonic()
    tick = 0
    behind = 0.0
    while True:
        due = start + tick / rate
        now = time.monotonic()
        if due - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        for i, (r, s) in enumerate(zip(ranks, socks)):
            s.sendall(frame_bytes(r, seqs[i], n, variants[(tick + i) % VARIANTS]))
            seqs[i] += n
            sent += n
        tick += 1
    for i, (r, s) in enumerate(zip(ranks, socks)):
        s.sendall(encode({"t": "bye", "rank": r, "status": "clean", "steps": seqs[i], "dropped": 0,
                          "error": None}))
    out.put((idx, sent, behind))
    time.sleep(0.5)
    for s in socks:
        s.close()


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def proc_mem(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def decode_ceiling(n: int, seconds: float = 0.3, tries: int = 5) -> float:
    """Records/s that bare msgpack.unpackb decodes on one core, for frames like ours (best of
    ``tries``: the machine may be shared, and the ceiling is what the core can do)."""
    return max(_decode_rate(n, seconds) for _ in range(tries))


def _decode_rate(n: int, seconds: float) -> float:
    rnd = random.Random(99)
    bodies = [frame_bytes(7, i * n, n, msgpack.packb(make_cols(n, rnd)))[4:] for i in range(VARIANTS)]
    unpackb = msgpack.unpackb
    count = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in bodies:
            unpackb(b, raw=False, strict_map_key=False)
        count += len(bodies)
    return count * n / (time.perf_counter() - t0)


def run_one(world: int, args: argparse.Namespace, ceiling: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="traceml-bench-"))
    settings = AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=tmp / RUN, port=0, nnodes=1,
                                  nproc_per_node=world, drain_s=5.0,
                                  max_pending_handshakes=max(1024, world + 64))
    cmd = None
    if args.profile:
        cmd = [sys.executable, "-m", "cProfile", "-o", f"{args.profile}.{world}",
               "-m", "traceml_core.aggregator"]
    h = start_aggregator(settings, command=cmd)
    nsend = max(1, min(args.senders, world))
    groups = [list(range(world))[i::nsend] for i in range(nsend)]
    ctx = mp.get_context("fork")
    ready = ctx.Barrier(nsend + 1)
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=sender, args=(i, g, h.port, args.rate, args.records, args.seconds,
                                               ready, out)) for i, g in enumerate(groups)]
    for p in procs:
        p.start()
    ready.wait(timeout=300)
    (u0, s0), t0 = proc_cpu(h.pid), time.monotonic()
    st0 = h.status()
    rec0, ck0 = st0["records"], st0["checkpoint_s"]
    rtts = []
    while any(p.is_alive() for p in procs) and time.monotonic() - t0 < args.seconds:
        q0 = time.perf_counter()
        st = h.status(timeout=10)
        rtts.append(time.perf_counter() - q0)
        time.sleep(0.2)
    results = [out.get(timeout=120) for _ in procs]
    sent = sum(r[1] for r in results)
    behind = max(r[2] for r in results)
    # wait until everything sent is ingested
    deadline = time.monotonic() + 120
    while True:
        st = h.status(timeout=10)
        if st is None or st["records"] >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    t1, (u1, s1) = time.monotonic(), proc_cpu(h.pid)
    got = st["records"] if st else -1
    ck = (st["checkpoint_s"] - ck0) if st else 0.0
    rss, hwm = proc_mem(h.pid)
    for p in procs:
        p.join(timeout=30)
    f0 = time.perf_counter()
    res = h.finish(0, timeout=120)
    fin = time.perf_counter() - f0
    import json
    summary = json.loads(res.summary_json.read_text()) if res.summary_json else {}
    tel = summary.get("telemetry", {})
    cpu = max(u1 - u0 + s1 - s0, 1e-9)
    rtts.sort()
    return {
        "ranks": world, "sent": sent, "ingested": got - rec0 if got >= 0 else got,
        "summary_received": tel.get("records_received"), "lost": tel.get("records_lost"),
        "wall_s": t1 - t0, "rec_per_s": (got - rec0) / (t1 - t0), "agg_cpu_s": cpu,
        "agg_sys_s": s1 - s0, "checkpoint_s": ck, "us_per_frame": 1e6 * cpu / max(1, (got - rec0) / args.records),
        "rec_per_cpu_s": (got - rec0) / cpu, "ratio": (got - rec0) / cpu / ceiling,
        "batches_per_s": (got - rec0) / args.records / (t1 - t0),
        "rtt_p50_ms": 1e3 * rtts[len(rtts) // 2] if rtts else None,
        "rtt_max_ms": 1e3 * rtts[-1] if rtts else None,
        "rss_mb": rss / 2**20, "hwm_mb": hwm / 2**20, "finish_s": fin, "sender_behind_s": behind,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,64", help="comma-separated numbers of simulated ranks")
    ap.add_argument("--rate", type=float, default=10.0, help="batches per second per rank")
    ap.add_argument("--records", type=int, default=100, help="step records per batch")
    ap.add_argument("--seconds", type=float, default=5.0, help="sending time per size")
    ap.add_argument("--senders", type=int, default=2, help="sender processes")
    ap.add_argument("--profile", help="run the aggregator under cProfile, writing PROFILE.<ranks>")
    args = ap.parse_args()
    ceiling = decode_ceiling(args.records)
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; msgpack "
          f"{'.'.join(map(str, msgpack.version))}")
    print(f"bare msgpack.unpackb ceiling ({args.records} records/frame, 9 columns): "
          f"{ceiling:,.0f} records/s on one core")
    print(f"load: {args.rate:g} batches/s per rank x {args.records} records, {args.seconds:g} s, "
          f"{args.senders} sender processes")
    hdr = (f"{'ranks':>6} {'sent':>10} {'lost':>5} {'rec/s wall':>11} {'batch/s':>8} "
           f"{'rec/cpu-s':>11} {'ratio':>6} {'agg cpu':>8} {'rtt p50/max ms':>15} "
           f"{'rss/peak MB':>12} {'finish s':>8} {'us/frame (sys)':>15} {'ckpt':>5}")
    print(hdr)
    for world in [int(x) for x in args.ranks.split(",")]:
        r = run_one(world, args, ceiling)
        print(f"{r['ranks']:>6} {r['sent']:>10,} {r['lost']!s:>5} {r['rec_per_s']:>11,.0f} "
              f"{r['batches_per_s']:>8,.0f} {r['rec_per_cpu_s']:>11,.0f} {r['ratio']:>6.2f} "
              f"{r['agg_cpu_s'] / r['wall_s']:>7.0%} "
              f"{(r['rtt_p50_ms'] or 0):>7.1f}/{(r['rtt_max_ms'] or 0):<7.1f} "
              f"{r['rss_mb']:>5.0f}/{r['hwm_mb']:<6.0f} {r['finish_s']:>8.2f} "
              f"{r['us_per_frame']:>7.1f} ({1e6 * r['agg_sys_s'] / max(1, r['sent'] / args.records):.1f})"
              f" {r['checkpoint_s'] / r['agg_cpu_s']:>5.0%}")
        if r["summary_received"] != r["sent"]:
            print(f"  !! summary counts {r['summary_received']} records, {r['sent']} were sent")
        if r["sender_behind_s"] > 1.0 / args.rate:
            print(f"  (senders fell {r['sender_behind_s']:.2f} s behind their schedule: the offered "
                  "load was lower than asked; the machine is the limit)")


if __name__ == "__main__":
    main()
