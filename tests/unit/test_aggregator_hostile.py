"""Broken and hostile input closes that one connection, is counted, and never stops the service."""

from __future__ import annotations

import json
import struct
import time

from aggpeers import RUN, TOKEN, Peer, RankPeer, columns
from traceml_core.wire.protocol import MAX_FRAME, encode, make_hello


def _welcomed(port, rank=1):
    p = Peer(port)
    p.send(make_hello(TOKEN, run=RUN, job="42", node=0, rank=rank))
    assert p.recv()["t"] == "welcome"
    return p


def test_bad_frames_close_only_their_connection(aggregator):
    h = aggregator(nproc_per_node=2)
    real = RankPeer(h.port, 0)
    real.steps(10)

    # before the handshake: a huge length prefix, garbage, a non-map
    for data in (struct.pack(">I", MAX_FRAME + 1), struct.pack(">I", 70_000),
                 b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", struct.pack(">I", 4) + b"\x93\x01\x02\x03"):
        p = Peer(h.port)
        p.send_raw(data)
        assert p.closed_by_server(), data
    real.steps(10)

    # after the handshake: oversize prefix, garbage, wrong types, a frame for another rank
    bad_frames = [
        struct.pack(">I", MAX_FRAME + 1),
        b"\x00\x00\x00\x03\xff\xff\xff",
        encode({"t": "steps", "rank": 1, "seq": "zero", "n": 1, "cols": {}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 10, "n": 2, "cols": {**columns(2), "step_ns": ["a", "b"]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 20, "n": 2, "cols": {**columns(2), "input_ns": [1.5, 2.5]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 0, "n": 3, "cols": columns(2), "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 0, "n": 2, "cols": [1, 2], "dropped": 0}),
        encode({"t": "steps", "rank": 0, "seq": 0, "n": 2, "cols": columns(2), "dropped": 0}),
        encode({"t": "bye", "rank": 1, "status": 5}),
        encode({"t": "system", "node": 0, "samples": [{"ts": "now"}]}),
        encode({"t": "event", "rank": 1, "kind": None, "text": 3}),
    ]
    # (frames whose values are malformed are found when their statistics are computed, within
    # a second, and the connection is closed then)
    for data in bad_frames:
        p = _welcomed(h.port)
        p.send_raw(data)
        assert p.closed_by_server(), data
    # a truncated frame followed by a disconnect
    p = _welcomed(h.port)
    p.send_raw(encode({"t": "steps", "rank": 1, "seq": 0, "n": 2, "cols": columns(2), "dropped": 0})[:50])
    p.close()

    real.steps(10)
    real.bye()
    s = json.loads(h.finish(0).summary_json.read_text())
    assert s["telemetry"]["wire"]["malformed"] == 4 + len(bad_frames)
    r0 = s["ranks"][0]
    assert r0["steps"] == 30 and r0["status"] == "clean"
    # the rejected frames for rank 1 changed nothing: it never had a valid record
    assert s["ranks"][1]["steps"] == 0
    t1 = s["ranks"][1]["telemetry"]
    assert t1["rejected"] == 4 and t1["gaps"] == 18  # the two rejected frames and the seq holes
    assert t1["lost"] == 22  # every record up to the last seq seen is accounted for


def test_many_idle_connections_are_bounded_and_real_ranks_get_in(aggregator):
    h = aggregator(max_pending_handshakes=20, handshake_timeout_s=30)
    idle = [Peer(h.port) for _ in range(60)]
    time.sleep(0.3)
    real = RankPeer(h.port, 0)
    assert real.welcomed
    real.steps(3)
    closed = sum(p.closed_by_server(timeout=0.05) for p in idle)
    assert closed >= 40  # the oldest were dropped to keep at most 20 pending
    s = json.loads(h.finish(0).summary_json.read_text())
    assert s["telemetry"]["wire"]["evicted"] >= 40
    assert s["ranks"][0]["steps"] == 3
