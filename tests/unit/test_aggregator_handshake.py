"""Who may talk to the aggregator and to a node's relay: one check (wire/auth.py) at every endpoint.

Anything wrong before the MAC is verified (token, run name, job, endpoint, kind) gets one and the
same refusal; replays, stale hellos and out-of-range ranks are refused; ranks never reach node 0.
"""

from __future__ import annotations

import json
import time

from aggpeers import RUN, TOKEN, NodePeer, Peer, RankPeer, end_node, node
from traceml_core.wire.auth import AGGREGATOR, AUTH_FAILED, hello_mac, make_hello, relay_aud
from traceml_core.wire.protocol import encode


def _refusal(port, hello):
    p = Peer(port)
    p.send(hello)
    reply = p.recv()
    closed = p.closed_by_server()
    p.close()
    assert closed, "a refused connection must be closed"
    assert reply is not None and reply["t"] == "refused"
    return reply["reason"]


def _node_hello(token=TOKEN, **kw):
    base = dict(aud=AGGREGATOR, run=RUN, job="42", node=0, rank=-1, kind="node")
    base.update(kw)
    return make_hello(token, **base)


def test_refusals_do_not_say_what_was_wrong_before_authentication(aggregator):
    h = aggregator()
    port = h.port
    wrong = [
        _node_hello("another-runs-token"),
        _node_hello(run="other-run"),            # a right token but another run name
        _node_hello(job="43"),                   # ... another job
        _node_hello(aud=relay_aud(0)),           # ... signed for another endpoint
        _node_hello(kind="rank", rank=0),        # ranks never connect to node 0
        _node_hello(kind="control"),             # the run token is not the control key
        _node_hello(kind="stranger"),
    ]
    reasons = {_refusal(port, w) for w in wrong}
    assert reasons == {AUTH_FAILED}, "one refusal for all: a prober learns nothing"
    assert RUN not in AUTH_FAILED and "TRACEML_TOKEN" in AUTH_FAILED

    bad_version = _node_hello()
    bad_version["v"] = 1
    assert "protocol version 1" in _refusal(port, bad_version)
    stale = _node_hello()
    stale["ts"] -= 3600
    stale["mac"] = hello_mac(TOKEN, stale)  # correctly signed, but an hour old
    assert "stale" in _refusal(port, stale)
    assert "node rank 5 is outside 0..0" in _refusal(port, _node_hello(node=5))
    assert "first frame must be a hello" in _refusal(port, {"t": "steps", "rank": 0})

    # a real node still gets in, and the refusals are in the summary
    ok = NodePeer(port, 0)
    assert ok.welcomed
    ok.join(0)
    ok.steps(0, 5)
    ok.rank_bye(0)
    ok.gone(0)
    s = json.loads(h.finish(0).summary_json.read_text())
    assert s["telemetry"]["wire"]["refused"] == len(wrong) + 4
    assert s["telemetry"]["records_received"] == 5


def test_a_replayed_hello_is_refused_at_every_endpoint(aggregator):
    h = aggregator(nproc_per_node=2)
    relay = node(h, 0)
    try:
        # at the relay: a rank's hello, captured and replayed byte for byte
        hello = make_hello(TOKEN, aud=relay_aud(0), run=RUN, job="42", node=0, rank=0, kind="rank")
        first = Peer(relay.port)
        first.send(hello)
        assert first.recv()["t"] == "welcome"
        assert "replayed" in _refusal(relay.port, hello)
        # ... and replayed at the aggregator: signed for the relay, so it fails there too
        assert _refusal(h.port, hello) == AUTH_FAILED
        # at the aggregator: a node's hello replayed
        nh = _node_hello()
        p = Peer(h.port)
        p.send(nh)
        assert p.recv()["t"] == "welcome"
        assert "replayed" in _refusal(h.port, nh)
        # ... and at the relay
        assert _refusal(relay.port, nh) == AUTH_FAILED
        first.close()
        p.close()
    finally:
        relay.close(1.0)


def test_tampered_hello_fails_authentication(aggregator):
    h = aggregator()
    hello = _node_hello()
    hello["node"] = 1  # change a signed field after signing
    assert _refusal(h.port, hello) == AUTH_FAILED
    hello = _node_hello()
    hello["nproc"] = 64  # even an unsigned-looking extra field is signed
    assert _refusal(h.port, hello) == AUTH_FAILED
    hello = _node_hello()
    del hello["mac"]
    assert _refusal(h.port, hello) == AUTH_FAILED


def test_the_relay_refuses_what_is_not_its_own_node(aggregator):
    h = aggregator(nnodes=2, nproc_per_node=2)
    relay = node(h, 1)
    try:
        assert RankPeer(relay.port, 2, node=1, token="not-the-token").reply["reason"] == AUTH_FAILED
        assert RankPeer(relay.port, 2, node=1, run="other-run").reply["reason"] == AUTH_FAILED
        # a hello for node 0's relay, sent to node 1's: signed for another endpoint
        assert RankPeer(relay.port, 0, node=0).reply["reason"] == AUTH_FAILED
        wrong_node = RankPeer(relay.port, 0, node=0, aud=relay_aud(1))
        assert "node 0 at node 1's relay" in wrong_node.reply["reason"]
        assert "outside" in RankPeer(relay.port, 9, node=1).reply["reason"]
        assert RankPeer(relay.port, 2, node=1).welcomed
        assert relay.stats().refused == 5
    finally:
        relay.close(1.0)


def test_handshake_timeout_closes_silent_connection(aggregator):
    h = aggregator(handshake_timeout_s=0.5)
    idle = Peer(h.port)
    t0 = time.monotonic()
    assert idle.closed_by_server(timeout=5)
    assert time.monotonic() - t0 < 3
    half = Peer(h.port)  # slowloris: half a hello, then nothing
    half.send_raw(encode(_node_hello())[:20])
    assert half.closed_by_server(timeout=5)
    relay = node(h, 0)
    ok = RankPeer(relay.port, 0)
    assert ok.welcomed
    ok.close()
    end_node(relay, 0)
    relay.close(1.0)
