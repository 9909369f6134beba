"""Aggregator ingest benchmark: simulated ranks speaking the real wire protocol on loopback,
through per-node relays into a real aggregator.

A real aggregator process (``start_aggregator``) is fed by sender processes that each hold many
rank connections (hello with HMAC, then ``steps`` frames at a fixed rate, then ``bye``). The ranks
of each simulated node connect to that node's real :class:`~traceml_core.launcher.relay.Relay`
(``--per-relay`` ranks per node; relay threads hosted by a few processes), and the relays forward
to the aggregator over one ``node`` link each, as ``traceml run`` does. Printed per size and mode:

* records/s achieved (wall) and records per aggregator CPU-second (what one core ingests);
* the bare ``msgpack.unpackb`` ceiling for the same records, in this process: for the frames the
  aggregator receives (merged by the relays) and for the ranks' own frames, and both ratios;
* loss (records sent vs. records in the final summary; must be 0);
* end-to-end latency: from the moment a tick's frames were due at the senders until the
  aggregator's record count covered that whole tick (status polled every 50 ms; includes the
  relays' merge window and the query round trip), median / 95th percentile / max over ticks;
* aggregator RSS (now and peak), the final-summary time (``finish`` -> ``finished``), and the CPU
  the relays spent (it moves to the nodes).

Run: ``PYTHONPATH=src python benchmarks/aggregator_ingest.py [--ranks 1,64] [--modes direct,relay]``;
issue 8's sizes: ``--ranks 1,64,512,4096 --records 5`` (minutes on a small machine).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from traceml_core.aggregator.process import start_aggregator  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402
from traceml_core.wire.auth import make_hello, relay_aud  # noqa: E402
from traceml_core.wire.protocol import HEADER, FrameBuffer, encode  # noqa: E402

TOKEN = "bench-token"
RUN = "bench"
VARIANTS = 8
POLL_S = 0.05


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
        # a DDP job: exposed and busy communication, ~100 MB of gradients in 4 buckets
        "comm_ns": [int(s * 0.05) for s in steps],
        "comm_busy_ns": [int(s * 0.4) for s in steps],
        "comm_bytes": [100_000_000] * n,
        "comm_bus_bytes": [150_000_000] * n,
        "comm_calls": [4] * n,
    }


def frame_bytes(rank: int, seq: int, n: int, cols_packed: bytes) -> bytes:
    """A ``steps`` frame, assembled around pre-packed columns (senders must not be the bottleneck)."""
    pk = msgpack.packb
    body = (b"\x86" + pk("t") + pk("steps") + pk("rank") + pk(rank) + pk("seq") + pk(seq)
            + pk("n") + pk(n) + pk("cols") + cols_packed + pk("dropped") + pk(0))
    return HEADER.pack(len(body)) + body


def _lift_fd_limit() -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def sender(idx: int, ranks: list[tuple[int, int, int]], rate: float, n: int, seconds: float,
           ready: Any, start_at: Any, out: Any) -> None:
    """``ranks``: (rank, node, port) for each simulated rank of this process."""
    _lift_fd_limit()
    rnd = random.Random(idx)
    variants = [msgpack.packb(make_cols(n, rnd)) for _ in range(VARIANTS)]
    socks = []
    for r, node, port in ranks:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(encode(make_hello(TOKEN, aud=relay_aud(node), run=RUN, job=None, node=node, rank=r,
                                    kind="rank")))
        socks.append(s)
    for s in socks:  # collect the welcomes
        fb = FrameBuffer()
        got: list = []
        while not got:
            got = list(fb.feed(s.recv(4096)))
        assert got[0]["t"] == "welcome", got
    ready.wait()
    start = start_at.value
    seqs = [0] * len(ranks)
    sent = 0
    tick = 0
    behind = 0.0
    while True:
        due = start + tick / rate
        if due - start >= seconds:
            break
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        for i, ((r, _node, _port), s) in enumerate(zip(ranks, socks)):
            s.sendall(frame_bytes(r, seqs[i], n, variants[(tick + i) % VARIANTS]))
            seqs[i] += n
            sent += n
        tick += 1
    for i, ((r, _node, _port), s) in enumerate(zip(ranks, socks)):
        s.sendall(encode({"t": "bye", "rank": r, "status": "clean", "steps": seqs[i], "dropped": 0,
                          "error": None}))
    out.put(("sent", idx, sent, behind, tick))
    time.sleep(0.5)
    for s in socks:
        s.close()


def relay_host(idx: int, nodes: list[int], nnodes: int, per_node: int, agg_port: int,
               flush_s: float, ports: Any, ready: Any, stop: Any, out: Any) -> None:
    """Runs the real relays of ``nodes`` (one thread each), as their launchers would."""
    _lift_fd_limit()
    from traceml_core.launcher.relay import Relay

    relays = {k: Relay(token=TOKEN, run_name=RUN, job_id=None, node=k, nnodes=nnodes,
                       nproc_per_node=per_node, upstream=("127.0.0.1", agg_port),
                       hostname=f"node{k}", flush_s=flush_s).start()
              for k in nodes}
    for r in relays.values():
        r.wait_connected(30.0)
    ports.put({k: r.port for k, r in relays.items()})
    ready.wait()
    cpu0 = time.process_time()
    stop.wait()
    for r in relays.values():
        r.drain(10.0)
    for r in relays.values():
        if r.node == 0:
            r.run_ended()
    totals: dict[str, int] = {}
    for r in relays.values():
        st = r.close(5.0, bye=None if r.node == 0 else {"t": "bye", "status": "clean", "exit_code": 0})
        for k, v in st.__dict__.items():
            if isinstance(v, int) and not isinstance(v, bool):
                totals[k] = totals.get(k, 0) + v
    totals["cpu_ms"] = int(1e3 * (time.process_time() - cpu0))
    out.put(("relays", idx, totals, 0.0, 0))


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def decode_ceiling(n: int, seconds: float = 0.3, tries: int = 5) -> float:
    """Records per CPU-second that bare ``msgpack.unpackb`` decodes, for ``steps`` frames of ``n``
    records like ours. Timed in this thread's CPU time (the same unit as the aggregator's
    records per CPU-second, and immune to preemption on a shared machine); best of ``tries``."""
    rnd = random.Random(99)
    bodies = [frame_bytes(7, i * n, n, msgpack.packb(make_cols(n, rnd)))[4:] for i in range(VARIANTS)]
    unpackb = msgpack.unpackb
    best = 0.0
    for _ in range(tries):
        count = 0
        c0 = time.thread_time()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for b in bodies:
                unpackb(b, raw=False, strict_map_key=False)
            count += len(bodies)
        best = max(best, count * n / max(time.thread_time() - c0, 1e-6))
    return best


def _pct(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_one(world: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    relay = True
    per = max(1, min(args.per_relay, world))
    nnodes = -(-world // per)
    per = -(-world // nnodes)
    tmp = Path(tempfile.mkdtemp(prefix="traceml-bench-"))
    settings = AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=tmp / RUN, port=0, nnodes=nnodes,
                                  nproc_per_node=per, drain_s=5.0,
                                  max_pending_handshakes=max(1024, world + 64))
    cmd = None
    if args.profile:
        cmd = [sys.executable, "-m", "cProfile", "-o", f"{args.profile}.{world}.{mode}",
               "-m", "traceml_core.aggregator"]
    h = start_aggregator(settings, command=cmd)
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    hosts: list = []
    stop = ctx.Event()
    node_port = {0: h.port}
    nsend = max(1, min(args.senders, world))
    nhost = max(1, min(args.senders, nnodes)) if relay else 0
    ready = ctx.Barrier(nsend + nhost + 1)
    if relay:
        ports: Any = ctx.Queue()
        groups = [list(range(nnodes))[i::nhost] for i in range(nhost)]
        hosts = [ctx.Process(target=relay_host, args=(i, g, nnodes, per, h.port, args.flush, ports,
                                                       ready, stop, out)) for i, g in enumerate(groups)]
        for p in hosts:
            p.start()
        for _ in hosts:
            node_port.update(ports.get(timeout=60))
    ranks = [(r, r // per, node_port[r // per]) for r in range(world)]
    rgroups = [ranks[i::nsend] for i in range(nsend)]
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=sender, args=(i, g, args.rate, args.records, args.seconds, ready,
                                               start_at, out)) for i, g in enumerate(rgroups)]
    for p in procs:
        p.start()
    start_at.value = time.monotonic() + 0.3
    ready.wait(timeout=600)
    c0, t0 = proc_cpu(h.pid), time.monotonic()
    st0 = h.status(timeout=10) or {}
    ck0 = st0.get("checkpoint_s", 0.0)
    polls: list[tuple[float, int]] = []
    rtts: list[float] = []
    while any(p.is_alive() for p in procs) and time.monotonic() - t0 < args.seconds + 60:
        q0 = time.monotonic()
        st = h.status(timeout=10)
        q1 = time.monotonic()
        if st is not None:
            polls.append((q1, st["records"]))
            rtts.append(q1 - q0)
        time.sleep(POLL_S)
    sent_msgs = [out.get(timeout=120) for _ in procs]
    sent = sum(m[2] for m in sent_msgs)
    behind = max(m[3] for m in sent_msgs)
    ticks = min(m[4] for m in sent_msgs)
    stop.set()
    deadline = time.monotonic() + 120
    st = None
    while time.monotonic() < deadline:
        st = h.status(timeout=10)
        if st is not None:
            polls.append((time.monotonic(), st["records"]))
            if st["records"] >= sent:
                break
        time.sleep(POLL_S)
    t1, c1 = time.monotonic(), proc_cpu(h.pid)
    got = st["records"] if st else -1
    ck = (st["checkpoint_s"] - ck0) if st else 0.0
    rss, hwm = proc_mem(h.pid)
    relay_totals: dict[str, int] = {}
    for _ in hosts:
        relay_totals_part = out.get(timeout=120)[2]
        for k, v in relay_totals_part.items():
            relay_totals[k] = relay_totals.get(k, 0) + v
    for p in procs + hosts:
        p.join(timeout=30)
    f0 = time.perf_counter()
    res = h.finish(0, timeout=180)
    fin = time.perf_counter() - f0
    summary = json.loads(res.summary_json.read_text()) if res.summary_json else {}
    tel = summary.get("telemetry", {})
    # latency: tick k is covered when the aggregator's count reaches (k+1) x world x records
    start = start_at.value
    per_tick = world * args.records
    lats = []
    j = 0
    for k in range(ticks):
        need = (k + 1) * per_tick
        while j < len(polls) and polls[j][1] < need:
            j += 1
        if j == len(polls):
            break
        lats.append(polls[j][0] - (start + k / args.rate))
    cpu = max(c1 - c0, 1e-9)
    ingested = got
    frames_in_agg = (relay_totals.get("frames_forwarded") or 0) if relay else ingested / args.records
    per_frame = ingested / frames_in_agg if frames_in_agg else float(args.records)
    return {
        "ranks": world, "mode": mode, "nodes": nnodes, "sent": sent, "ingested": ingested,
        "summary_received": tel.get("records_received"), "lost": tel.get("records_lost"),
        "relay_dropped": tel.get("relay_dropped"), "wall_s": t1 - t0,
        "rec_per_s": ingested / (t1 - t0), "agg_cpu_s": cpu, "checkpoint_s": ck,
        "rec_per_cpu_s": ingested / cpu, "records_per_agg_frame": per_frame,
        "agg_frames_per_s": frames_in_agg / (t1 - t0), "us_per_agg_frame": 1e6 * cpu / max(1, frames_in_agg),
        "lat_p50_s": _pct(lats, 0.5), "lat_p95_s": _pct(lats, 0.95), "lat_max_s": max(lats) if lats else None,
        "rtt_p50_ms": 1e3 * (_pct(rtts, 0.5) or 0), "rss_mb": rss / 2**20, "hwm_mb": hwm / 2**20,
        "finish_s": fin, "sender_behind_s": behind, "relay_cpu_s": relay_totals.get("cpu_ms", 0) / 1e3,
        "relay_dropped_counted": relay_totals.get("records_dropped", 0),
        "connections": tel.get("wire", {}).get("connections"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,64", help="comma-separated numbers of simulated ranks")
    ap.add_argument("--modes", default="relay", help="relay (the only route since issue 17)")
    ap.add_argument("--per-relay", type=int, default=64, help="ranks per node (relay mode)")
    ap.add_argument("--flush", type=float, default=None,
                    help="relay merge window in seconds (default: the relay's own)")
    ap.add_argument("--rate", type=float, default=10.0, help="batches per second per rank")
    ap.add_argument("--records", type=int, default=5, help="step records per batch")
    ap.add_argument("--seconds", type=float, default=5.0, help="sending time per size")
    ap.add_argument("--senders", type=int, default=2, help="sender (and relay host) processes")
    ap.add_argument("--profile", help="run the aggregator under cProfile, writing PROFILE.<ranks>.<mode>")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if args.flush is None:
        from traceml_core.launcher.relay import FLUSH_S

        args.flush = FLUSH_S
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; msgpack "
          f"{'.'.join(map(str, msgpack.version))}")
    ceilings: dict[int, float] = {args.records: decode_ceiling(args.records)}
    print(f"bare msgpack.unpackb ceiling, the ranks' frames ({args.records} records, 9 columns): "
          f"{ceilings[args.records]:,.0f} records/s on one core")
    print(f"load: {args.rate:g} batches/s per rank x {args.records} records, {args.seconds:g} s, "
          f"{args.senders} sender processes; relay: {args.per_relay} ranks per node, merge window "
          f"{args.flush:g} s")
    print(f"{'ranks':>5} {'mode':>6} {'sent':>9} {'lost':>4} {'rec/s':>8} {'rec/cpu-s':>10} "
          f"{'rec/frame':>9} {'ceiling':>10} {'ratio':>5} {'ratio*':>6} {'agg cpu':>7} "
          f"{'latency p50/p95/max s':>21} {'rss/peak MB':>11} {'finish s':>8} {'relay cpu':>9} {'conns':>5}")
    rows = []
    for world in [int(x) for x in args.ranks.split(",")]:
        for mode in modes:
            r = run_one(world, mode, args)
            m = max(1, round(r["records_per_agg_frame"]))
            if m not in ceilings:
                ceilings[m] = decode_ceiling(m)
            r["ceiling_received"] = ceilings[m]
            r["ceiling_rank_frames"] = ceilings[args.records]
            r["ratio"] = r["rec_per_cpu_s"] / ceilings[m]
            r["ratio_rank_frames"] = r["rec_per_cpu_s"] / ceilings[args.records]
            rows.append(r)
            lat = "/".join(f"{v:.2f}" if v is not None else "-" for v in
                           (r["lat_p50_s"], r["lat_p95_s"], r["lat_max_s"]))
            print(f"{r['ranks']:>5} {mode:>6} {r['sent']:>9,} {r['lost']!s:>4} {r['rec_per_s']:>8,.0f} "
                  f"{r['rec_per_cpu_s']:>10,.0f} {r['records_per_agg_frame']:>9.1f} "
                  f"{r['ceiling_received']:>10,.0f} {r['ratio']:>5.2f} {r['ratio_rank_frames']:>6.2f} "
                  f"{r['agg_cpu_s'] / r['wall_s']:>7.0%} {lat:>21} "
                  f"{r['rss_mb']:>4.0f}/{r['hwm_mb']:<6.0f} {r['finish_s']:>8.2f} "
                  f"{r['relay_cpu_s'] / r['wall_s']:>9.0%} {r['connections']!s:>5}", flush=True)
            if r["summary_received"] != r["sent"]:
                print(f"  !! summary counts {r['summary_received']} records, {r['sent']} were sent "
                      f"(relays dropped and counted {r['relay_dropped_counted']})")
            if r["sender_behind_s"] > 1.0 / args.rate:
                print(f"  (senders fell {r['sender_behind_s']:.2f} s behind their schedule: the "
                      "offered load was lower than asked; the machine is the limit)")
    print("ratio: records per aggregator CPU-second / the ceiling for the frames the aggregator "
          "receives (merged by relays); ratio*: / the ceiling for the ranks' own frames")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
