"""Loss accounting and how each rank, node and the run ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from aggpeers import RUN, NodePeer, RankPeer, make_settings
from traceml_core.aggregator.process import AggregatorStartError, start_aggregator


def _summary(res):
    return json.loads(res.summary_json.read_text())


def test_gaps_duplicates_and_client_drops_are_counted(rig):
    h = rig(nproc_per_node=1)
    p = RankPeer(h.port, 0)
    p.steps(10)            # 0..9
    p.steps(10, seq=15)    # 15..24: records 10..14 never arrived (gap of 5)
    p.steps(10, seq=20)    # 20..29: 20..24 already here (5 duplicates), 25..29 new
    p.steps(4, dropped=3)  # 30..33; the client says it dropped 3 records itself
    p.bye(dropped=3)
    s = _summary(h.finish(0))
    t = s["ranks"][0]["telemetry"]
    assert t["received"] == 29
    assert t["gaps"] == 5 and t["duplicates"] == 5 and t["client_dropped"] == 3
    assert t["expected"] == 34 and t["lost"] == 5
    assert s["telemetry"]["records_lost"] == 5 and not s["telemetry"]["complete"]
    assert "5 lost (rank 0: 5)" in h.run_dir.joinpath("final_summary.txt").read_text()


def test_crashed_error_and_never_joined_ranks(rig):
    h = rig(nproc_per_node=4)
    ok = RankPeer(h.port, 0)
    ok.steps(5)
    ok.bye()
    err = RankPeer(h.port, 1)
    err.steps(5)
    err.bye("error", error="Traceback ...\nRuntimeError: CUDA error: device-side assert")
    dead = RankPeer(h.port, 2)
    dead.steps(5)
    dead.close()  # SIGKILL-like: the connection drops without a bye
    # rank 3 never connects
    time.sleep(0.2)
    s = _summary(h.finish(1, reason="worker 2 exited with signal 9"))
    st = {r["rank"]: r["status"] for r in s["ranks"]}
    assert st == {0: "clean", 1: "error", 2: "crashed", 3: "never_joined"}
    assert s["run"]["status"] == "failed" and s["run"]["exit_code"] == 1
    assert s["ranks"][1]["error"].endswith("device-side assert")
    assert s["rank_endings"] == {"clean": 1, "error": 1, "crashed": 1, "never_joined": 1}
    txt = h.run_dir.joinpath("final_summary.txt").read_text()
    assert "rank 2 (node 0, host0) crashed" in txt
    assert "rank 1 (node 0, host0) error FIRST FAILURE: RuntimeError: CUDA error: device-side assert" in txt
    assert s["verdict"]["kind"] == "run_failed" and s["verdict"]["culprit"]["rank"] == 1
    assert s["run"]["reason"].startswith("rank 1 raised RuntimeError")
    node0 = s["topology"]["nodes"][0]["hostname"]  # from its relay's hello
    assert node0 == "host0"
    assert f"rank 3 (node 0, {node0}) never joined" in txt


def test_interrupted_run(rig):
    h = rig(nproc_per_node=1)
    p = RankPeer(h.port, 0)
    p.steps(5)
    s = _summary(h.finish(143, interrupted=True, reason="SIGTERM from Slurm (time limit)"))
    assert s["run"]["status"] == "interrupted"
    assert s["ranks"][0]["status"] == "interrupted"


def test_nodes_join_leave_and_never_join(aggregator):
    h = aggregator(nnodes=3, nproc_per_node=1)
    n1 = NodePeer(h.port, 1, host="nodeB")
    n2 = NodePeer(h.port, 2, host="nodeC")
    second = NodePeer(h.port, 1, host="nodeB")  # a second link of node 1 (a reconnect)
    assert n1.welcomed and n2.welcomed and second.welcomed
    second.send({"t": "system", "node": 1, "samples": [{"ts": 1.0, "cpu_pct": 50.0}]})
    second.close()  # closing one of a node's links is not losing the node
    n2.join(2)
    n2.steps(2, 5)
    n1.bye(exit_code=0)  # node 1 ends cleanly ...
    n1.close()
    n2.close()  # ... node 2's launcher vanishes mid-run (and with it, its relay)
    deadline = time.monotonic() + 5
    while h.status()["nodes_lost"] != [2] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.status()["nodes_joined"] == [0, 1, 2]
    s = _summary(h.finish(1, reason="node 2 lost"))
    nodes = s["topology"]["nodes"]
    assert [n["joined"] for n in nodes] == [True, True, True]
    assert [n["left_early"] for n in nodes] == [False, False, True]
    assert nodes[1]["hostname"] == "nodeB" and nodes[1]["exit_code"] == 0
    assert s["system"]["nodes"][0]["node"] == 1 and s["system"]["nodes"][0]["cpu_pct_mean"] == 50.0
    st = {r["rank"]: r["status"] for r in s["ranks"]}
    assert st[2] == "vanished" and st[0] == "never_joined" and st[1] == "never_joined"


def test_node_named_in_failed_nodes_and_never_joined(aggregator):
    h = aggregator(nnodes=2, nproc_per_node=1)
    s = _summary(h.finish(1, reason="node 1 never joined", failed_nodes=[1]))
    n1 = s["topology"]["nodes"][1]
    assert not n1["joined"] and n1["left_early"]
    assert "1 node(s) never joined: 1 (?)" in h.run_dir.joinpath("final_summary.txt").read_text()


def test_port_in_use_is_a_clear_error(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    with pytest.raises(AggregatorStartError) as err:
        start_aggregator(make_settings(tmp_path, port=port, port_source="--aggregator-port"))
    msg = str(err.value)
    assert f"port {port} (from --aggregator-port) is already in use" in msg
    assert "--aggregator-port" in msg and "TRACEML_AGGREGATOR_PORT" in msg
    holder.close()


def test_bind_host_not_on_this_node(tmp_path):
    with pytest.raises(AggregatorStartError, match="--aggregator-bind-host"):
        start_aggregator(make_settings(tmp_path, bind_host="192.0.2.1"))


def test_unwritable_logs_dir_falls_back_and_says_where(tmp_path, rig):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the logs dir should be")
    h = rig(run_dir=blocker / RUN)
    assert h.run_dir != blocker / RUN
    assert str(blocker / RUN) in h.run_dir_note and str(h.run_dir) in h.run_dir_note
    p = RankPeer(h.port, 0)
    p.steps(3)
    p.bye()
    res = h.finish(0)
    assert res.summary_json.parent == h.run_dir
    s = _summary(res)
    assert s["notes"] and str(h.run_dir) in s["notes"][0]
    assert "Note: could not write to" in res.summary_txt.read_text()


def test_sigterm_writes_a_provisional_summary_then_the_final_one(rig):
    h = rig(nproc_per_node=1, term_grace_s=10)
    p = RankPeer(h.port, 0)
    p.steps(8)
    os.kill(h.pid, signal.SIGTERM)  # Slurm signals every process of the step
    path = h.run_dir / "final_summary.json"
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    prov = json.loads(path.read_text())
    assert prov["provisional"] and prov["run"]["status"] == "running"
    assert prov["ranks"][0]["steps"] == 8
    assert h.alive()  # still waiting for the launcher's report
    s = _summary(h.finish(143, interrupted=True, reason="scancel"))
    assert not s["provisional"] and s["run"]["status"] == "interrupted"


def test_sigterm_without_launcher_finishes_in_the_grace_period(rig):
    h = rig(nproc_per_node=1, term_grace_s=1.0)
    p = RankPeer(h.port, 0)
    p.steps(8)
    t0 = time.monotonic()
    os.kill(h.pid, signal.SIGTERM)
    assert h.proc.wait(10) == 0
    assert time.monotonic() - t0 < 4
    s = json.loads((h.run_dir / "final_summary.json").read_text())
    assert s["run"]["status"] == "interrupted" and not s["provisional"]
    assert "SIGTERM" in s["run"]["reason"]


def test_launcher_gone_without_finish(rig):
    h = rig(nproc_per_node=1, launcher_lost_grace_s=0.5)
    p = RankPeer(h.port, 0)
    p.steps(8)
    p.close()
    h.control.close()  # the launcher was SIGKILLed
    h.control = None
    assert h.proc.wait(10) == 0
    s = json.loads((h.run_dir / "final_summary.json").read_text())
    assert s["run"]["status"] == "unknown"
    assert "without an exit report" in s["run"]["reason"]
    assert s["ranks"][0]["steps"] == 8
