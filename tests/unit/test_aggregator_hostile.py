"""Broken and hostile input is stopped where it enters, counted, and never stops the service.

A rank's frames enter at its node's relay (a bad one closes that rank's connection there); a
relay's frames enter at the aggregator (a malformed relayed frame is skipped and counted: the link
carries the node's other ranks; garbage that breaks the framing closes the link).
"""

from __future__ import annotations

import json
import struct
import time

from aggpeers import TOKEN, RUN, NodePeer, Peer, RankPeer, columns, end_node, folded, node
from traceml_core.wire.auth import make_hello, relay_aud
from traceml_core.wire.protocol import MAX_FRAME, encode


def _welcomed_rank(port, rank=1):
    p = Peer(port)
    p.send(make_hello(TOKEN, aud=relay_aud(0), run=RUN, job="42", node=0, rank=rank, kind="rank"))
    assert p.recv()["t"] == "welcome"
    return p


def test_bad_rank_frames_close_only_that_rank_at_the_relay(aggregator):
    h = aggregator(nproc_per_node=2)
    relay = node(h, 0)
    real = RankPeer(relay.port, 0)
    real.steps(10)

    # before the handshake: a huge length prefix, a hello-sized one, garbage, a non-map
    for data in (struct.pack(">I", MAX_FRAME + 1), struct.pack(">I", 70_000),
                 b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", struct.pack(">I", 4) + b"\x93\x01\x02\x03"):
        p = Peer(relay.port)
        p.send_raw(data)
        assert p.closed_by_server(), data
    real.steps(10)

    # after the handshake: oversize prefix, garbage, wrong types and values, another rank's frame
    bad_frames = [
        struct.pack(">I", MAX_FRAME + 1),
        b"\x00\x00\x00\x03\xff\xff\xff",
        encode({"t": "steps", "rank": 1, "seq": "zero", "n": 1, "cols": {}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 10, "n": 2, "cols": {**columns(2), "step_ns": ["a", "b"]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 20, "n": 2, "cols": {**columns(2), "input_ns": [1.5, 2.5]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 20, "n": 2, "cols": {**columns(2), "h2d_ns": [True, 1]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 20, "n": 1, "cols": {**columns(1), "mem_peak": [1 << 63]}, "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 0, "n": 3, "cols": columns(2), "dropped": 0}),
        encode({"t": "steps", "rank": 1, "seq": 0, "n": 2, "cols": [1, 2], "dropped": 0}),
        encode({"t": "steps", "rank": 0, "seq": 0, "n": 2, "cols": columns(2), "dropped": 0}),
        encode({"t": "bye", "rank": 1, "status": 5}),
        encode({"t": "system", "node": 0, "samples": [{"ts": "now"}]}),
        encode({"t": "join", "rank": 1}),
        encode({"t": "event", "rank": 1, "kind": None, "text": 3}),
    ]
    for data in bad_frames:
        p = _welcomed_rank(relay.port)
        p.send_raw(data)
        assert p.closed_by_server(), data
    # a truncated frame followed by a disconnect
    p = _welcomed_rank(relay.port)
    p.send_raw(encode({"t": "steps", "rank": 1, "seq": 0, "n": 2, "cols": columns(2), "dropped": 0})[:50])
    p.close()

    real.steps(10)
    real.bye()
    real.close()
    end_node(relay)
    s = json.loads(h.finish(0).summary_json.read_text())
    relay.close(1.0)
    assert relay.stats().malformed == len(bad_frames)
    assert relay.counters["refused"] == 4
    assert s["telemetry"]["wire"]["malformed"] == 0, "nothing bad reached node 0"
    r0 = s["ranks"][0]
    assert r0["steps"] == 30 and r0["status"] == "clean"
    assert s["ranks"][1]["steps"] == 0   # no frame of rank 1 was valid


def test_bad_relayed_frames_are_skipped_and_the_link_stays(aggregator):
    h = aggregator(nproc_per_node=2)
    link = NodePeer(h.port, 0)
    link.join(0)
    link.steps(0, 5)
    window = folded({"t": "steps", "rank": 0, "seq": 5, "n": 2, "cols": columns(2, 5)})
    bad = [
        dict(window, v=window["v"][:-8]),                                  # a value cut short
        folded({"t": "steps", "rank": 7, "seq": 0, "n": 1, "cols": columns(1)}),  # outside the world
        {"t": "join", "rank": "x"},
        {"t": "gone", "rank": 0},
        {"t": "system", "node": 1, "samples": []},                          # another node's
        {"t": "finish", "exit_code": 0},                                   # not a node's frame
    ]
    for f in bad:
        link.send(f)
    link.steps(0, 5)
    link.rank_bye(0)
    link.gone(0)
    assert not link.closed_by_server(timeout=0.5), "the node's link survives bad relayed frames"
    s = json.loads(h.finish(0).summary_json.read_text())
    assert s["telemetry"]["wire"]["malformed"] == 5 and s["telemetry"]["wire"]["ignored_frames"] == 1
    assert s["ranks"][0]["steps"] == 10 and s["ranks"][0]["status"] == "clean"


def test_many_idle_connections_are_bounded_and_real_ranks_get_in(aggregator):
    h = aggregator(max_pending_handshakes=20, handshake_timeout_s=30)
    idle = [Peer(h.port) for _ in range(60)]
    # the oldest are dropped to keep at most 20 pending (as the aggregator accepts them: wait)
    closed: set[int] = set()
    deadline = time.monotonic() + 30
    while len(closed) < 40 and time.monotonic() < deadline:
        closed |= {i for i, p in enumerate(idle) if i not in closed and p.closed_by_server(timeout=0.01)}
    assert len(closed) >= 40, f"{len(closed)} of 60 idle connections dropped, with 20 pending allowed"
    # with the pending slots full of idle connections, a real node and rank still get in
    relay = node(h, 0)
    real = RankPeer(relay.port, 0)
    assert real.welcomed
    real.steps(3)
    real.bye()
    real.close()
    end_node(relay)
    s = json.loads(h.finish(0).summary_json.read_text())
    relay.close(1.0)
    assert s["telemetry"]["wire"]["evicted"] >= 40
    assert s["ranks"][0]["steps"] == 3
