"""Who may talk to the aggregator: wrong token/run/version, replays and stale hellos are refused."""

from __future__ import annotations

import json
import time

from aggpeers import RUN, TOKEN, Peer, RankPeer
from traceml_core.wire.protocol import encode, make_hello


def _refusal(port, hello):
    p = Peer(port)
    p.send(hello)
    reply = p.recv()
    closed = p.closed_by_server()
    p.close()
    assert closed, "a refused connection must be closed by the aggregator"
    assert reply is not None and reply["t"] == "refused"
    return reply["reason"]


def test_refusals_name_the_reason_and_are_counted(aggregator):
    h = aggregator()
    port = h.port
    assert "authentication failed" in _refusal(
        port, make_hello("another-runs-token", run=RUN, job="42", node=0, rank=0))
    reason = _refusal(port, make_hello(TOKEN, run="other-run", job="42", node=0, rank=0))
    assert "other-run" in reason and RUN not in reason  # never leaks our run name
    bad_version = make_hello(TOKEN, run=RUN, job="42", node=0, rank=0)
    bad_version["v"] = 99
    assert "protocol version 99" in _refusal(port, bad_version)
    stale = make_hello(TOKEN, run=RUN, job="42", node=0, rank=0)
    stale["ts"] -= 3600  # signature must still match, so re-sign with the old timestamp
    from traceml_core.wire.protocol import _canonical  # the signed fields
    import hashlib, hmac
    stale["mac"] = hmac.new(TOKEN.encode(), _canonical(stale), hashlib.sha256).digest()
    assert "stale" in _refusal(port, stale)
    assert "rank 7 is outside 0..1" in _refusal(port, make_hello(TOKEN, run=RUN, job="42", node=0, rank=7))
    assert "first frame must be a hello" in _refusal(port, {"t": "steps", "rank": 0})

    # a real rank still gets in, and the refusals are in the summary
    ok = RankPeer(port, 0)
    assert ok.welcomed
    ok.steps(5)
    ok.bye()
    res = h.finish(0)
    s = json.loads(res.summary_json.read_text())
    assert s["telemetry"]["wire"]["refused"] == 6
    assert s["telemetry"]["records_received"] == 5


def test_replayed_hello_is_refused(aggregator):
    h = aggregator()
    hello = make_hello(TOKEN, run=RUN, job="42", node=0, rank=0)
    first = Peer(h.port)
    first.send(hello)
    assert first.recv()["t"] == "welcome"
    # an eavesdropper replays the captured bytes, byte for byte
    assert "replayed" in _refusal(h.port, hello)
    first.close()


def test_tampered_hello_fails_authentication(aggregator):
    h = aggregator()
    hello = make_hello(TOKEN, run=RUN, job="42", node=0, rank=0)
    hello["rank"] = 1  # change a signed field after signing
    assert "authentication failed" in _refusal(h.port, hello)
    hello = make_hello(TOKEN, run=RUN, job="42", node=0, rank=0)
    del hello["mac"]
    assert "authentication failed" in _refusal(h.port, hello)


def test_handshake_timeout_closes_silent_connection(aggregator):
    h = aggregator(handshake_timeout_s=0.5)
    idle = Peer(h.port)
    t0 = time.monotonic()
    assert idle.closed_by_server(timeout=5)
    assert time.monotonic() - t0 < 3
    half = Peer(h.port)  # slowloris: half a hello, then nothing
    half.send_raw(encode(make_hello(TOKEN, run=RUN, job="42", node=0, rank=0))[:20])
    assert half.closed_by_server(timeout=5)
    ok = RankPeer(h.port, 0)
    assert ok.welcomed
