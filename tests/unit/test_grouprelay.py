"""The tree (launcher/grouprelay.py): node relays -> group relays -> node 0. Real processes and
sockets on loopback: an aggregator process, a relay per node, a group relay for the second group,
ranks speaking the wire protocol. Node 0's summary must be the one of direct links: every record
counted, every rank's ending, node presence, the statistics (only the per-bucket resolution may
be coarser: a group relay's windows are longer)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggpeers import RankPeer, end_node, make_settings
from test_relay import wait_until
from traceml_core.aggregator.process import start_aggregator
from traceml_core.launcher.grouprelay import GroupRelay, fan_in, group_flush_s, relay_fan_in
from traceml_core.launcher.relay import Relay
from traceml_core.wire.auth import AGGREGATOR, group_aud

NNODES, NPROC, FAN = 4, 2, 2
OPTS = {"backoff_initial": 0.02, "backoff_max": 0.2}


def run(tmp_path, tree: bool, steps: int = 120) -> dict[str, Any]:
    """4 nodes x 2 ranks; with ``tree`` nodes 2-3 report through the group relay of node 2."""
    s = make_settings(tmp_path, nnodes=NNODES, nproc_per_node=NPROC, relay_fan_in=FAN if tree else 0)
    h = start_aggregator(s)
    group = None
    relays = {}
    try:
        if tree:
            group = GroupRelay(token=s.token, run_name=s.run_name, job_id=s.job_id, group=1, fan=FAN,
                               nnodes=NNODES, nproc_per_node=NPROC, upstream=(h.connect_host, h.port),
                               hostname="host2", bind_host="127.0.0.1", flush_s=0.3,
                               client_options=OPTS).start()
            assert group.wait_connected(10.0)
        for n in range(NNODES):
            up, aud = (h.connect_host, h.port), AGGREGATOR
            if group is not None and n // FAN == 1:
                up, aud = (group.host, group.port), group_aud(1)
            relays[n] = Relay(token=s.token, run_name=s.run_name, job_id=s.job_id, node=n, nnodes=NNODES,
                              nproc_per_node=NPROC, upstream=up, upstream_aud=aud, hostname=f"host{n}",
                              flush_s=0.05, client_options=OPTS).start()
            assert relays[n].wait_connected(10.0), n
        ranks = [RankPeer(relays[r // NPROC].port, r, node=r // NPROC) for r in range(NNODES * NPROC)]
        assert all(p.welcomed for p in ranks)
        for i in range(0, steps, 10):
            for p in ranks:
                p.steps(10, step_ms=10.0 + (5.0 if p.rank == 5 else 0.0))
        for p in ranks:
            p.bye()
        assert wait_until(lambda: (h.status() or {}).get("records") == steps * NNODES * NPROC), h.status()
        for n in range(1, NNODES):
            end_node(relays[n], n)
        end_node(relays[0], 0)
        if group is not None:
            group.close(5.0)
        res = h.finish(0)
        return json.loads(res.summary_json.read_text())
    finally:
        for r in relays.values():
            r.close(0.5)
        if group is not None:
            group.close(0.5)
        if h.alive():
            h.kill()


def test_a_group_relay_gives_node_0_the_summary_of_direct_links(tmp_path):
    tree = run(tmp_path / "tree", True)
    direct = run(tmp_path / "direct", False)
    for s in (tree, direct):
        assert s["telemetry"]["records_received"] == 120 * 8 and s["telemetry"]["records_lost"] == 0
        assert [r["status"] for r in s["ranks"]] == ["clean"] * 8
        assert [n["joined"] for n in s["topology"]["nodes"]] == [True] * 4
        assert not any(n["left_early"] for n in s["topology"]["nodes"])
    for a, b in zip(tree["ranks"], direct["ranks"]):
        assert a["node"] == b["node"] and a["host"] == b["host"] and a["steps"] == b["steps"] == 120
        ta, tb = dict(a["telemetry"]), dict(b["telemetry"])
        # (how many records the sketch stands for depends on how the relays happened to cut the
        # windows, a timing matter: each key of a window of more than 16 records stands for more)
        assert abs(ta.pop("sketched") - 120) <= 12 and abs(tb.pop("sketched") - 120) <= 12
        assert a["phases"] == b["phases"] and ta == tb
    assert tree["across_ranks"]["step"]["worst_rank"] == 5 == direct["across_ranks"]["step"]["worst_rank"]
    assert tree["across_ranks"]["step"]["worst_node"] == 2


def test_fan_in_grows_with_the_square_root_of_the_nodes():
    assert fan_in(256) == 0 and fan_in(511) == 0 and fan_in(512) == 23 and fan_in(8192) == 91
    assert relay_fan_in("auto", 8192) == 91 and relay_fan_in("off", 8192) == 0
    assert relay_fan_in("4", 3) == 3 and relay_fan_in("4", 16) == 4
    assert group_flush_s(4096) == 1.0 and group_flush_s(16384) == 2.0 and group_flush_s(65536) == 8.0


@pytest.mark.parametrize("hello_node", [1, 3])
def test_a_group_relay_serves_its_own_group_only(tmp_path, hello_node):
    """Node 3's relay is welcome at the relay of nodes 2..3; node 1's (another group) is refused
    there, with the reason."""
    from aggpeers import RUN, TOKEN, Peer
    from traceml_core.wire.auth import make_hello

    s = make_settings(tmp_path, nnodes=NNODES, nproc_per_node=NPROC, relay_fan_in=FAN)
    h = start_aggregator(s)
    group = GroupRelay(token=s.token, run_name=s.run_name, job_id=s.job_id, group=1, fan=FAN,
                       nnodes=NNODES, nproc_per_node=NPROC, upstream=(h.connect_host, h.port),
                       bind_host="127.0.0.1", client_options=OPTS).start()
    try:
        assert group.wait_connected(10.0)
        peer = Peer(group.port)
        peer.send(make_hello(TOKEN, aud=group_aud(1), run=RUN, job="42", node=hello_node, rank=-1,
                             kind="node", extra={"nproc": NPROC}))
        reply = peer.recv()
        if hello_node == 3:
            assert reply["t"] == "welcome"
        else:
            assert reply["t"] == "refused" and "group relay of nodes 2..3" in reply["reason"]
        peer.close()
    finally:
        group.close(0.5)
        h.kill()


def test_after_node_0_restarts_the_group_relay_re_announces_its_nodes_and_ranks(tmp_path):
    """Node 0's aggregator is replaced mid-run (same port): the group relay reconnects and says
    again which nodes and ranks it carries, so the new aggregator knows them (and where each
    rank's records went on from) although none of them reconnected."""
    s = make_settings(tmp_path, nnodes=NNODES, nproc_per_node=NPROC, relay_fan_in=FAN)
    h = start_aggregator(s)
    port = h.port
    group = GroupRelay(token=s.token, run_name=s.run_name, job_id=s.job_id, group=1, fan=FAN,
                       nnodes=NNODES, nproc_per_node=NPROC, upstream=(h.connect_host, port),
                       hostname="host2", bind_host="127.0.0.1", flush_s=0.2, client_options=OPTS).start()
    relays, h2 = [], None
    try:
        assert group.wait_connected(10.0)
        for n in (2, 3):
            relays.append(Relay(token=s.token, run_name=s.run_name, job_id=s.job_id, node=n, nnodes=NNODES,
                                nproc_per_node=NPROC, upstream=(group.host, group.port),
                                upstream_aud=group_aud(1), hostname=f"host{n}", flush_s=0.05,
                                client_options=OPTS).start())
        assert all(r.wait_connected(10.0) for r in relays)
        ranks = [RankPeer(relays[r // NPROC - 2].port, r, node=r // NPROC) for r in range(4, 8)]
        for p in ranks:
            p.steps(20)
        assert wait_until(lambda: (h.status() or {}).get("records") == 80)
        h.kill()
        h2 = start_aggregator(make_settings(tmp_path / "again", nnodes=NNODES, nproc_per_node=NPROC,
                                            relay_fan_in=FAN, port=port))
        assert wait_until(lambda: (h2.status() or {}).get("ranks_connected") == 4, 20.0), h2.status()
        st = h2.status()
        assert {2, 3} <= set(st["nodes_joined"]) and st["ranks_seen"] == 4
        for p in ranks:
            p.steps(10)
            p.bye()
        assert wait_until(lambda: (h2.status() or {}).get("records") == 40)
        for r in relays:
            r.close(3.0, bye={"t": "bye", "status": "clean", "exit_code": 0})
        group.close(5.0)
        summary = json.loads(h2.finish(0).summary_json.read_text())
    finally:
        for r in relays:
            r.close(0.5)
        group.close(0.5)
        for x in (h, h2):
            if x is not None and x.alive():
                x.kill()
    nodes = {n["node"]: n for n in summary["topology"]["nodes"]}
    assert nodes[2]["joined"] and nodes[3]["joined"], nodes
    assert not nodes[2]["left_early"] and not nodes[3]["left_early"], nodes
    got = {r["rank"]: r for r in summary["ranks"] if r["rank"] >= 4}
    assert all(r["status"] == "clean" and r["node"] == r["rank"] // NPROC for r in got.values())
    # the new aggregator counts the 20 records each rank sent before it started as not received
    assert all(r["telemetry"]["expected"] == 30 and r["steps"] == 10 for r in got.values())
