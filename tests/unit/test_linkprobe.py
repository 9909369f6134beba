"""The link probe over real sockets on loopback: every node's probe server, node 0's coordinator.

Naming a slow node needs a slow link, which the Slurm tests make with ``tc tbf`` on a node's
veth (tests/slurm/test_comm_slurm.py); here: what is measured, its bounds, who may take part,
and that a probe result reaches the summary through the aggregator's control link.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from aggpeers import RankPeer
from traceml_core.linkprobe.analysis import Pair, analyse, schedule
from traceml_core.linkprobe.probe import ProbeRun, ProbeServer, coordinate, send_stream
from traceml_core.wire.client import Link, LinkError, LinkRefused
from traceml_core.wire.frames import check_probe

TOKEN = "probe-token-0123456789abcdef"


@pytest.fixture
def nodes():
    """``nodes(n, token=...)``: ``n`` probe servers on loopback (ephemeral ports), closed after."""
    made: list[ProbeServer] = []

    def start(n: int, token: str = TOKEN) -> tuple[ProbeRun, list[ProbeServer]]:
        run = ProbeRun(token=token, run="r", job="7", nnodes=n, port=0)
        servers = [ProbeServer(run, i, bind="127.0.0.1", port=0).start() for i in range(n)]
        made.extend(servers)
        return run, servers

    yield start
    for s in made:
        s.close()


def _ports(servers):
    return [s.port for s in servers]


def test_every_pair_of_the_schedule_is_measured(nodes):
    run, servers = nodes(3)
    out = coordinate(run, ["127.0.0.1"] * 3, ports=_ports(servers), nbytes=4_000_000, seconds=2.0)
    assert out["error"] is None, out
    want = {(s, d) for rnd in schedule(3) for s, d in rnd}
    assert {(p["src"], p["dst"]) for p in out["pairs"]} == want
    for p in out["pairs"]:
        assert p["error"] is None and p["nbytes"] == 4_000_000 and p["gbps"] > 0, p
    assert all(n["gbps"] and n["recv_gbps"] for n in out["nodes"]), out["nodes"]
    # (whether anyone is named on equal links is asked of real nodes in tests/slurm: here the
    # three "nodes" share this machine's CPUs, so their rates say more about the load than links)
    # node 0 ended the probe: every server stops serving
    for s in servers:
        assert s.ended.wait(10.0)


def test_a_transfer_stops_at_its_time_bound(nodes):
    run, servers = nodes(2)
    t0 = time.monotonic()
    pair = send_stream(run, 0, 1, "127.0.0.1", servers[1].port, nbytes=1 << 32, seconds=0.3)
    took = time.monotonic() - t0
    assert pair.error is None, pair
    assert 0 < pair.nbytes < 1 << 32 and pair.seconds < 5.0, pair
    assert took < 10.0, took


def test_a_wrong_token_is_refused_and_the_probe_says_why(nodes):
    run, servers = nodes(2)
    other = ProbeRun(token="another-token-abcdef0123", run="r", job="7", nnodes=2, port=0)
    logged: list[str] = []
    t0 = time.monotonic()
    out = coordinate(other, ["127.0.0.1"] * 2, ports=_ports(servers), wait_s=20.0, log=logged.append)
    assert time.monotonic() - t0 < 10.0, "a refused hello is not retried until the deadline"
    assert out["error"] == "only 0 of 2 nodes' launchers answered the probe" and out["pairs"] == []
    assert len(logged) == 2 and all("refused" in line for line in logged), logged


def test_only_node_0_commands(nodes):
    run, servers = nodes(2)
    link = Link.connect("127.0.0.1", servers[0].port, run.hello(to=0, me=1), timeout=5.0)
    link.send({"t": "probe.ctl"})
    with pytest.raises(LinkError):
        link.recv(5.0)     # the server closes the connection
    assert not servers[0].ended.is_set()
    with pytest.raises(LinkRefused):   # a hello meant for another node's server
        Link.connect("127.0.0.1", servers[0].port, run.hello(to=1, me=0), timeout=5.0)


def test_a_malformed_command_is_refused_not_run(nodes):
    run, servers = nodes(2)
    link = Link.connect("127.0.0.1", servers[1].port, run.hello(to=1, me=0), timeout=5.0)
    link.send({"t": "probe.ctl"})
    for bad in ({"dst": 1}, {"dst": 0, "port": 0}, {"dst": 0, "nbytes": 1 << 40},
                {"dst": 0, "seconds": 3600}, {"dst": 0, "host": "x" * 300}):
        link.send({"t": "probe.send", "id": 9, "dst": 0, "host": "127.0.0.1", "port": servers[0].port,
                   "nbytes": 1000, "seconds": 1.0, **bad})
        ans = link.recv(5.0)
        assert ans["t"] == "probe.sent" and ans["nbytes"] == 0 and "refused" in ans["error"], (bad, ans)
    link.send({"t": "probe.end"})
    link.close()
    assert servers[1].ended.wait(5.0)


def test_a_node_that_never_serves_is_left_out_within_the_wait(nodes):
    run, servers = nodes(3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]      # nothing listens there once closed
    ports = _ports(servers)
    ports[2] = dead
    logged: list[str] = []
    t0 = time.monotonic()
    out = coordinate(run, ["127.0.0.1"] * 3, ports=ports, nbytes=1_000_000, wait_s=2.0, log=logged.append)
    took = time.monotonic() - t0
    assert took < 15.0, took
    assert out["error"] is None
    by = {(p["src"], p["dst"]): p for p in out["pairs"]}
    assert by[(0, 1)]["gbps"] and by[(1, 0)]["gbps"]
    assert by[(1, 2)]["error"] == "a node of this pair did not answer the probe"
    assert [n["gbps"] is None for n in out["nodes"]] == [False, False, True]
    assert any("node 2" in line and "not reachable" in line for line in logged), logged


def test_stop_ends_the_wait_for_late_nodes(nodes):
    run, servers = nodes(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    asked = time.monotonic() + 1.0
    t0 = time.monotonic()
    out = coordinate(run, ["127.0.0.1"] * 2, ports=[servers[0].port, dead], wait_s=60.0,
                     stop=lambda: time.monotonic() > asked)
    assert time.monotonic() - t0 < 6.0
    assert out["error"] == "interrupted"


def test_the_rounds_end_at_the_probe_bound_and_say_so(nodes):
    run, servers = nodes(2)
    t0 = time.monotonic()
    out = coordinate(run, ["127.0.0.1"] * 2, ports=_ports(servers), nbytes=1 << 32, seconds=6.0,
                     budget_s=1.0)
    assert time.monotonic() - t0 < 8.0, "the rounds stop at the bound, not at a transfer's 6 s"
    assert out["error"] == "the transfers took longer than the probe's bound (1 s)", out
    assert out["nodes"] == [] and out["slow_node"] is None and out["slow_link"] is None


def test_the_probe_frame_bounds_what_it_carries():
    pairs = [Pair(0, 1, nbytes=10**8, seconds=8.0), Pair(1, 0, nbytes=10**8, seconds=0.05)]
    res = analyse(pairs, ["a", "b"], bytes_per_pair=10**8, seconds=9.0)
    assert check_probe({"t": "probe", "result": json.loads(json.dumps(res))})["result"] == res
    odd = check_probe({"t": "probe", "result": {**res, "nodes": [{"node": -3, "host": 5, "gbps": float("inf")}],
                                                "slow_node": {"node": 2, "direction": "sideways"}}})
    assert odd["result"]["nodes"] == [{"node": None, "host": None, "gbps": None, "recv_gbps": None}]
    assert odd["result"]["slow_node"]["direction"] == "send"
    from traceml_core.wire.protocol import ProtocolError
    for bad in (None, [], {"nodes": "x"}, {"pairs": [{}] * 20_000}):
        with pytest.raises(ProtocolError):
            check_probe({"t": "probe", "result": bad})


def test_the_probe_result_reaches_the_summary_and_names_the_slow_node(rig):
    h = rig(nnodes=3, nproc_per_node=1)
    pairs = [Pair(s, d, nbytes=10**8, seconds=(10**8) / ((0.0125 if s == 1 else 2.0) * 1e9))
             for rnd in schedule(3) for s, d in rnd]
    res = analyse(pairs, ["node1", "node2", "node3"], bytes_per_pair=10**8, seconds=9.0)
    h.control.send({"t": "probe", "result": res})
    for rank in range(3):
        p = RankPeer(h.relay_port(rank), rank, node=rank)
        p.steps(5)
        p.bye()
    done = h.finish(0)
    s = json.loads(done.summary_json.read_text())
    assert s["communication"]["probe"]["slow_node"] == {
        "node": 1, "host": "node2", "gbps": 0.0125, "others_gbps": 2.0, "direction": "send", "ratio": 0.0063}
    text = done.summary_txt.read_text()
    assert "SLOW LINK: node 1 (node2) sends at" in text, text


def test_a_probe_that_cannot_measure_says_so_in_the_summary_and_never_fails_the_launch(tmp_path):
    """Node 0's launcher as ``traceml run`` drives it, with node 1's launcher absent: the probe
    ends within its bounds, and the summary says the links were not measured, and why."""
    from traceml_core.config import LaunchConfig
    from traceml_core.launcher.keeper import AggregatorKeeper
    from traceml_core.launcher.nodelink import NodeLink
    from traceml_core.launcher.token import Token

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # both "nodes" are 127.0.0.1: node 1's address reaches node 0's probe server, which refuses a
    # hello meant for node 1, so node 1 does not answer
    cfg = LaunchConfig(nnodes=2, node_rank=0, nproc_per_node=1, master_addr="127.0.0.1",
                       master_port=port + 3, run_name="probe", logs_dir=str(tmp_path), mode="summary",
                       aggregator_port=port, aggregator_host="127.0.0.1",
                       aggregator_bind_host="127.0.0.1", aggregator_wait=3.0, cluster="none",
                       hostnames=("127.0.0.1", "127.0.0.1"))
    keeper = AggregatorKeeper(cfg, TOKEN)
    keeper.start()
    link = NodeLink(cfg, Token(TOKEN, "test"))
    try:
        t0 = time.monotonic()
        link.link_probe(keeper, cfg.aggregator_wait)
        assert time.monotonic() - t0 < 20.0
    finally:
        if link.probe is not None:
            link.probe.close()
        done = keeper.handle.finish(0)
    s = json.loads(done.summary_json.read_text())
    probe = s["communication"]["probe"]
    assert probe["error"] == "only 1 of 2 nodes' launchers answered the probe" and probe["nodes"] == []
    assert ("Link probe: the links between the nodes were not measured (only 1 of 2 nodes' "
            "launchers answered the probe)") in done.summary_txt.read_text()
