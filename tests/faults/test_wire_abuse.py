"""Abuse of the aggregator's port at scale, against the real aggregator process, while a real node
keeps reporting: a slowloris trickling its hello, thousands of idle connections, and authenticated
peers parking huge partial frames. The aggregator stays up, its memory stays bounded (read from
/proc), and the real rank's records are all counted.

(Single bad frames, random bytes, wrong types and replays are in tests/unit/test_aggregator_*.py and
test_wire_fuzz.py; this file adds the volume.)
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import time

from aggpeers import RUN, TOKEN, NodePeer
from traceml_core.wire.auth import AGGREGATOR, make_hello
from traceml_core.wire.protocol import MAX_FRAME, encode


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_slowloris_trickling_its_hello_is_cut_at_the_deadline(aggregator):
    h = aggregator(handshake_timeout_s=1.0)
    hello = encode(make_hello(TOKEN, aud=AGGREGATOR, run=RUN, job="42", node=0, rank=-1, kind="node"))
    t0 = time.monotonic()     # before the connection: the aggregator's deadline starts after it
    s = socket.create_connection(("127.0.0.1", h.port))
    cut = None
    for b in hello:  # one byte every 50 ms at least: the whole hello (167 bytes) would take > 8 s
        try:
            s.sendall(bytes([b]))
        except OSError:
            cut = time.monotonic() - t0
            break
        time.sleep(0.05)
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                cut = time.monotonic() - t0
                break
        except BlockingIOError:
            pass
        except OSError:
            cut = time.monotonic() - t0
            break
        finally:
            s.setblocking(True)
    s.close()
    # cut at the deadline: not before it, and well before the hello could have been complete
    # (the upper bound leaves 4 s for a loaded machine to notice and for this loop to see it)
    assert cut is not None and 0.9 < cut < 1.0 + 4.0, cut
    real = NodePeer(h.port, 0)
    real.join(0)
    real.steps(0, 5)
    real.rank_bye(0)
    real.gone(0)
    summary = json.loads(h.finish(0).summary_json.read_text())
    assert summary["telemetry"]["wire"]["handshake_timeouts"] == 1
    assert summary["ranks"][0]["steps"] == 5


def test_thousands_of_idle_connections(aggregator):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = 3000
    if hard < n + 200:
        import pytest
        pytest.skip(f"the open-files limit ({hard}) is too low for {n} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, n + 200), hard))
    h = aggregator(nproc_per_node=1, handshake_timeout_s=30)
    real = NodePeer(h.port, 0)
    real.join(0)
    real.steps(0, 10)
    time.sleep(0.3)
    base = rss(h.pid)
    idle = []
    try:
        for i in range(n):
            idle.append(socket.create_connection(("127.0.0.1", h.port)))
            if i % 500 == 0:
                real.steps(0, 10)  # the real node keeps reporting during the flood
        time.sleep(0.5)
        real.steps(0, 10)
        grown = rss(h.pid) - base
        print(f"aggregator RSS +{grown / 2**20:.1f} MiB with {n} idle connections")
        assert h.alive() and grown < 30 * 2**20, grown
        late = NodePeer(h.port, 0)  # a node (re)connecting now still gets in
        assert late.welcomed
        late.join(0)
        late.steps(0, 10, seq=real.seqs[0])
        late.rank_bye(0)
        late.gone(0)
    finally:
        for s in idle:
            s.close()
    summary = json.loads(h.finish(0).summary_json.read_text())
    wire = summary["telemetry"]["wire"]
    assert wire["evicted"] >= n - 1024  # at most max_pending_handshakes wait for a hello
    print(f"evicted {wire['evicted']} of {n} idle connections")
    assert summary["ranks"][0]["steps"] == real.seqs[0] + 10
    assert summary["telemetry"]["records_lost"] == 0


def test_parked_partial_frames_cannot_exhaust_memory(aggregator):
    cap = 32 * 2**20
    h = aggregator(nnodes=32, nproc_per_node=1, max_buffered_bytes=cap)
    real = NodePeer(h.port, 0)
    real.join(0)
    real.steps(0, 10)
    time.sleep(0.3)
    base = rss(h.pid)
    chunk = struct.pack(">I", MAX_FRAME) + b"\x00" * (6 * 2**20)  # 6 MiB of a declared 8 MiB frame
    peers = []
    for n in range(1, 21):  # 20 nodes x 6 MiB = 120 MiB offered against a 32 MiB cap
        p = NodePeer(h.port, n)
        assert p.welcomed
        try:
            p.sock.sendall(chunk)
        except OSError:
            pass  # cut while sending: the cap works
        peers.append(p)
        real.steps(0, 5)
    time.sleep(0.5)
    peak = rss(h.pid) - base
    print(f"aggregator RSS +{peak / 2**20:.1f} MiB with 120 MiB of partial frames offered (cap 32 MiB)")
    assert h.alive()
    assert peak < cap + 40 * 2**20, peak / 2**20
    real.steps(0, 5)
    real.rank_bye(0)
    real.gone(0)
    for p in peers:
        p.close()
    summary = json.loads(h.finish(0).summary_json.read_text())
    assert summary["telemetry"]["wire"]["overload"] >= 10  # most parked frames were cut
    assert summary["ranks"][0]["steps"] == real.seqs[0]
    assert summary["ranks"][0]["status"] == "clean"
