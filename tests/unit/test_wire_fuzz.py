"""Fuzzing the input paths: random bytes on a real socket, random frame and hello contents, and
the validators every frame passes where it enters (wire/frames.py).

The aggregator runs in-process (same code as the process, stepped by the test) so hypothesis can
try hundreds of inputs quickly; every example ends by checking a real node link is still served.
"""

from __future__ import annotations

import socket

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggpeers import RUN, TOKEN, columns, folded, make_settings, relayed
from traceml_core.launcher.relayframes import merge_into
from traceml_core.rundir import prepare_run_dir
from traceml_core.aggregator.adapter import rank_data
from traceml_core.aggregator.rankstate import RankState
from traceml_core.codec import encode as encode_record
from traceml_core.aggregator.server import Server, open_listener
from traceml_core.wire.auth import AGGREGATOR, Endpoint, NonceCache, check_hello, make_hello, relay_aud
from traceml_core.wire.frames import validate
from traceml_core.wire.protocol import STEP_COLUMNS, FrameBuffer, ProtocolError, encode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    s = make_settings(tmp, nproc_per_node=2, handshake_timeout_s=30)
    srv = Server(s, open_listener(s), prepare_run_dir(s.run_dir, RUN),
                 lambda *_: {"summary_json": None, "summary_txt": None})
    yield srv
    srv.close()


def _pump(srv, cond, turns=200):
    for _ in range(turns):
        srv.step(0.005)
        if cond():
            return True
    return False


def _connect(srv, hello=False):
    c = socket.create_connection(("127.0.0.1", srv.port))
    c.setblocking(False)
    if hello:
        c.sendall(encode(make_hello(TOKEN, aud=AGGREGATOR, run=RUN, job="42", node=0, rank=-1,
                                    kind="node")))
        buf = FrameBuffer()
        got = []

        def welcomed():
            try:
                got.extend(buf.feed(c.recv(4096)))
            except BlockingIOError:
                pass
            return bool(got)
        assert _pump(srv, welcomed) and got[0]["t"] == "welcome"
    return c


def _closed(c):
    try:
        return c.recv(65536) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


frame_like = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda b: len(b).to_bytes(4, "big") + b, st.binary(max_size=200)),
    st.builds(lambda obj: encode({"t": "steps", **obj}) if isinstance(obj, dict) else b"",
              st.dictionaries(st.sampled_from(["rank", "seq", "n", "cols", "dropped", "t"]),
                              st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none(),
                                        st.lists(st.integers(-3, 3), max_size=3)))),
    # windows' statistics (what relays send): random packed arrays and accounting
    st.builds(lambda obj: encode({"t": "fold", **obj}),
              st.dictionaries(st.sampled_from(["rank", "seq", "n", "dropped", "v", "o", "keys"]),
                              st.one_of(st.integers(-5, 5), st.binary(max_size=64), st.none()))),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(frame_like, min_size=1, max_size=4), authenticated=st.booleans())
def test_random_input_never_stops_the_server(server, data, authenticated):
    c = _connect(server, hello=authenticated)
    for chunk in data:
        try:
            c.sendall(chunk)
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            break
        _pump(server, lambda: False, turns=3)
    c.close()
    _pump(server, lambda: False, turns=3)
    # a real node link is still served and its rank's data counted
    real = _connect(server, hello=True)
    before = server.state.rank(0).received
    real.sendall(encode({"t": "join", "rank": 0, "local_rank": 0, "host": "h", "pid": 1, "new": True})
                 + encode(folded({"t": "steps", "rank": 0, "seq": server.state.rank(0).next_seq, "n": 3,
                                  "cols": columns(3), "dropped": 0})))
    assert _pump(server, lambda: server.state.rank(0).received == before + 3)
    real.close()
    assert server.net.buffered >= 0 and not server.done


values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                                st.floats(allow_nan=True), st.text(max_size=5), st.binary(max_size=5)),
                      lambda inner: st.one_of(st.lists(inner, max_size=4),
                                              st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["seq", "n", "cols", "dropped", "rank"]), values),
       st.dictionaries(st.sampled_from(["step", "t_end_ns", "step_ns", "input_ns", "mem_peak"]), values))
def test_steps_frames_with_wrong_types_raise_only_protocol_level_errors(msg, cols):
    rs = RankState(0)
    if "cols" not in msg:
        msg["cols"] = {**columns(2), **cols}
        msg.setdefault("n", 2)
    msg["t"] = "steps"
    try:
        validate("rank", msg)  # the trust boundary: only ProtocolError escapes it
    except ProtocolError:
        return
    if msg["n"]:  # a validated frame always folds at the relay, and node 0 takes its window
        assert rs.ingest_fold(relayed(msg)) == msg["n"]
        d = encode_record(rank_data(rs))
        assert d["phases"]["step_ns"]["count"] + d["phases"]["step_ns"]["unmeasured"] == msg["n"]
    # re-encoding must be possible: whatever was accepted is plain data
    msgpack.packb(encode_record(rank_data(rs)))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["t", "v", "run", "job", "node", "rank", "kind", "nonce",
                                        "ts", "mac", "host", "pid"]), values))
def test_check_hello_never_raises(hello):
    out = check_hello({"t": "hello", **hello}, RELAY0, NonceCache(), 0.0)
    assert isinstance(out, str)  # random content never authenticates


RELAY0 = Endpoint(aud=relay_aud(0), run=RUN, job="42", keys={"rank": TOKEN}, nnodes=1, nproc_per_node=2,
                  node=0)


def test_check_hello_accepts_only_the_real_thing():
    h = make_hello(TOKEN, aud=relay_aud(0), run=RUN, job="42", node=0, rank=1, kind="rank",
                   extra={"local_rank": 1})
    ident = check_hello(h, RELAY0, NonceCache(), h["ts"])
    assert not isinstance(ident, str) and ident.rank == 1 and ident.local_rank == 1


element = st.one_of(st.integers(-2**63, 2**64 - 1), st.integers(-1, 10**9), st.floats(), st.booleans(),
                    st.none(), st.text(max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.fixed_dictionaries({c: st.lists(element, min_size=n, max_size=n)
                                       for c in STEP_COLUMNS}))),
       st.integers(0, 3))
def test_columns_of_any_content_are_accepted_whole_or_rejected_whole(n_cols, pooled):
    """A frame is validated whole where it enters: accepted frames always fold cleanly, merged
    with good ones (a relay's window of several frames) or alone."""
    n, cols = n_cols
    rs = RankState(0)
    good = columns(n)
    window = {"t": "steps", "rank": 0, "seq": 0, "n": 0, "cols": {k: [] for k in STEP_COLUMNS}, "dropped": 0}
    for i in range(pooled):  # good frames merged with the random one, as a relay does
        assert merge_into(window, validate("rank", {"t": "steps", "rank": 0, "seq": i * n, "n": n,
                                                    "cols": {k: list(v) for k, v in good.items()}, "dropped": 0}))
    frame = {"t": "steps", "rank": 0, "seq": pooled * n, "n": n, "cols": cols, "dropped": 0}
    try:
        validate("rank", frame)
        accepted = True
    except ProtocolError:
        accepted = False
    if accepted:
        assert merge_into(window, frame)
    if window["n"]:
        rs.ingest_fold(relayed(window))  # never raises: a validated frame is never rejected later
    assert rs.received == pooled * n + (n if accepted else 0)
    d = encode_record(rank_data(rs))
    assert d["phases"]["step_ns"]["count"] + d["phases"]["step_ns"]["unmeasured"] == rs.received
    msgpack.packb(d)
