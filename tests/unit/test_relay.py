"""The per-node relay between real ranks (TelemetryClient + step recorder) and a real aggregator
process, over loopback: exact counts, rank endings, and what happens when node 0 is slow or gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


from aggpeers import RUN, TOKEN, NodePeer, RankPeer, columns, folded, make_settings
from traceml_core.aggregator.process import start_aggregator
from traceml_core.launcher.relay import Relay
from traceml_core.sdk.recorder import StepRecorder
from traceml_core.sdk.tracer import Tracer
from traceml_core.wire.auth import relay_aud
from traceml_core.wire.client import ClientConfig, TelemetryClient

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _summary(res):
    return json.loads(res.summary_json.read_text())


def make_relay(port, node, *, nnodes=2, nproc=2, sndbuf=None, **kw):
    opts = {"backoff_initial": 0.02, "backoff_max": 0.2}
    if sndbuf:  # no kernel auto-tuning: a stalled aggregator fills the relay's budget sooner
        opts["sndbuf"] = sndbuf
    return Relay(token=TOKEN, run_name=RUN, job_id="42", node=node, nnodes=nnodes,
                 nproc_per_node=nproc, upstream=("127.0.0.1", port), hostname=f"host{node}",
                 client_options=opts, **kw).start()


def rank_client(port, rank, node, rec, **kw):
    return TelemetryClient(ClientConfig("127.0.0.1", port, TOKEN, aud=relay_aud(node), run=RUN, job="42", node=node,
                                        rank=rank, kind="rank", world=4, hostname=f"host{node}",
                                        extra={"local_rank": rank % 2}, backoff_initial=0.02, backoff_max=0.2),
                           source=rec, **kw)


def bye(rank, rec, status="clean"):
    return lambda: {"t": "bye", "rank": rank, "status": status, "steps": rec.count,
                    "dropped": rec.lost, "error": None}


def wait_until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def rank_process(port, rank, node, steps):
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen([sys.executable, str(HERE / "relay_rank.py"), str(port), str(rank),
                             str(node), str(steps)], stdout=subprocess.PIPE, text=True, env=env)


def test_counts_exact_through_relays_and_fan_in_is_nodes(aggregator):
    h = aggregator(nnodes=2, nproc_per_node=2)
    relays = [make_relay(h.port, n) for n in (0, 1)]
    recs, clients = {}, {}
    for rank in range(4):
        node = rank // 2
        recs[rank] = StepRecorder(rank=rank, batch_size=50, seal_interval_s=0.01, max_batches=1000)
        clients[rank] = rank_client(relays[node].port, rank, node, recs[rank])
        clients[rank].start()
    assert all(c.wait_connected(5.0) for c in clients.values())
    assert wait_until(lambda: (h.status() or {}).get("ranks_connected") == 4)
    steps = {0: 3000, 1: 2500, 2: 4000, 3: 1234}
    for rank, n in steps.items():
        ctx = Tracer(recs[rank]).step
        for _ in range(n):
            with ctx:
                pass
        recs[rank].flush_partial()
    for rank, c in clients.items():
        assert c.close(5.0, bye=bye(rank, recs[rank]))
    assert relays[0].drain(5.0) and relays[1].drain(5.0)
    relays[0].run_ended()
    relays[1].close(3.0, bye={"t": "bye", "status": "clean", "exit_code": 0})
    assert wait_until(lambda: (h.status() or {}).get("ranks_connected") == 0)
    s = _summary(h.finish(0))
    relays[0].close(1.0)
    tel = s["telemetry"]
    assert tel["records_received"] == tel["records_expected"] == sum(steps.values())
    assert tel["records_lost"] == 0 and tel["complete"] and tel["relay_dropped"] == 0
    # one control connection and one link per node: the ranks never reached node 0 themselves
    assert tel["wire"]["connections"] == 3 and tel["wire"]["malformed"] == 0
    by_rank = {r["rank"]: r for r in s["ranks"]}
    for rank, n in steps.items():
        r = by_rank[rank]
        assert (r["status"], r["steps"], r["node"], r["host"], r["local_rank"]) == \
            ("clean", n, rank // 2, f"host{rank // 2}", rank % 2)
        assert r["telemetry"]["client_dropped"] == 0
        assert r["telemetry"]["gaps"] == 0 and r["telemetry"]["reconnects"] == 0
    assert s["topology"]["nodes_joined"] == 2
    assert s["run"]["status"] == "completed"
    for r in relays:
        st = r.stats()
        assert st.records_in == st.records_forwarded and st.records_dropped == 0


def test_rank_killed_behind_the_relay_is_crashed(aggregator):
    h = aggregator(nnodes=1, nproc_per_node=2)
    relay = make_relay(h.port, 0, nnodes=1)
    ok = rank_process(relay.port, 0, 0, 2000)
    doomed = rank_process(relay.port, 1, 0, -1)
    try:
        assert doomed.stdout.readline().strip() == "running"
        assert ok.stdout.readline().startswith("sent 2000 lost 0 ok True")
        assert wait_until(lambda: (h.status() or {}).get("records", 0) > 2000)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(5)
        assert wait_until(lambda: (h.status() or {}).get("ranks_connected") == 0)
    finally:
        for p in (ok, doomed):
            if p.poll() is None:
                p.kill()
    s = _summary(h.finish(1, reason="worker 1 exited with signal 9"))
    relay.close(1.0)
    st = {r["rank"]: r["status"] for r in s["ranks"]}
    assert st == {0: "clean", 1: "crashed"}
    assert s["ranks"][0]["steps"] == 2000 and s["ranks"][1]["steps"] > 0
    assert s["run"]["status"] == "failed"


def test_bad_frame_from_one_rank_closes_only_that_rank(aggregator):
    h = aggregator(nnodes=1, nproc_per_node=2)
    relay = make_relay(h.port, 0, nnodes=1)
    good = RankPeer(relay.port, 0)
    bad = RankPeer(relay.port, 1)
    assert good.welcomed and bad.welcomed
    good.steps(10)
    bad.steps(5)
    bad.send({"t": "steps", "rank": 0, "seq": 5, "n": 1, "cols": {}, "dropped": 0})  # not its rank
    assert bad.closed_by_server()
    good.steps(10)
    good.bye()
    good.close()
    assert relay.drain(5.0)
    s = _summary(h.finish(1))
    relay.close(1.0)
    by = {r["rank"]: r for r in s["ranks"]}
    assert by[0]["status"] == "clean" and by[0]["steps"] == 20
    assert by[1]["status"] == "crashed" and by[1]["steps"] == 5
    assert relay.stats().malformed == 1 and s["telemetry"]["wire"]["malformed"] == 0


def _record_for(rec, ctx, seconds, step_times, until=None):
    """Traced steps for ``seconds`` (or, with ``until``, until it holds, at most ``seconds``)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until is not None and until()):
        t0 = time.perf_counter()
        with ctx:
            pass
        step_times.append(time.perf_counter() - t0)
        time.sleep(0.0001)


def test_slow_upstream_relay_drops_counts_and_reports_exactly(aggregator):
    """Node 0's aggregator stops reading (SIGSTOP): the relay fills its budget, drops and counts
    per rank, the ranks never wait and drop nothing; once it reads again the summary's loss is
    exactly what the relay dropped."""
    h = aggregator(nnodes=1, nproc_per_node=2)
    # the live modes' relay (each window's last records go up beside its statistics): a window's
    # statistics alone are a few hundred bytes whatever it holds, so two ranks would need minutes
    # to fill the budget
    relay = make_relay(h.port, 0, nnodes=1, budget_bytes=200_000, flush_s=0.02, sndbuf=8192, tail=True)
    recs = {r: StepRecorder(rank=r, batch_size=256, seal_interval_s=0.005) for r in (0, 1)}
    clients = {r: rank_client(relay.port, r, 0, recs[r]) for r in (0, 1)}
    for c in clients.values():
        c.start()
    assert all(c.wait_connected(5.0) for c in clients.values())
    times: list[float] = []
    os.kill(h.pid, signal.SIGSTOP)
    try:
        # steps until the relay had to drop (a few seconds; longer on a busy machine, where the
        # ranks step more slowly and the windows' last records fill the budget later)
        dropping = lambda: relay.stats().records_dropped > 0  # noqa: E731
        threads = [threading.Thread(target=_record_for, args=(recs[r], Tracer(recs[r]).step, 60.0, times, dropping))
                   for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wait_until(dropping, 5.0)
    finally:
        os.kill(h.pid, signal.SIGCONT)
    for r, c in clients.items():
        recs[r].flush_partial()
        assert c.close(5.0, bye=bye(r, recs[r]))
    assert relay.drain(10.0)
    st = relay.stats()
    s = _summary(h.finish(0))
    relay.close(1.0)
    made = sum(recs[r].count for r in (0, 1))
    assert sum(recs[r].lost for r in (0, 1)) == 0, "the ranks themselves dropped nothing"
    assert st.records_in == made and st.records_dropped > 0
    assert st.records_forwarded + st.records_dropped == made
    assert st.peak_queued_bytes <= 200_000 + 8192  # the budget, plus small frames it never drops (bye, join, gone)
    tel = s["telemetry"]
    assert tel["relay_dropped"] == st.records_dropped == sum(relay.dropped_by_rank().values())
    assert tel["records_lost"] == st.records_dropped
    assert tel["records_received"] == made - st.records_dropped
    for r in s["ranks"]:
        assert r["telemetry"]["relay_dropped"] == relay.dropped_by_rank().get(r["rank"], 0)
        assert r["status"] == "clean"
    times.sort()
    assert times[int(len(times) * 0.999)] < 0.005, "a traced step waited on the network"


def test_upstream_killed_relay_counts_then_reports_to_a_new_aggregator(tmp_path):
    """The aggregator dies mid-run: the relay keeps reading its ranks, drops beyond its budget
    and counts; a new aggregator on the same port gets the re-announced ranks and the counts."""
    settings = make_settings(tmp_path, nnodes=1, nproc_per_node=1, port=0)
    h = start_aggregator(settings)
    port = h.port
    # with the windows' last records: statistics alone are too small to fill the budget in
    # seconds (see above)
    relay = make_relay(port, 0, nnodes=1, nproc=1, budget_bytes=100_000, flush_s=0.02, tail=True)
    rec = StepRecorder(rank=0, batch_size=128, seal_interval_s=0.005)
    client = rank_client(relay.port, 0, 0, rec)
    client.start()
    h2 = None
    try:
        assert client.wait_connected(5.0)
        ctx = Tracer(rec).step
        times: list[float] = []
        _record_for(rec, ctx, 0.3, times)
        h.kill()
        dropping = lambda: relay.stats().records_dropped > 0  # noqa: E731
        _record_for(rec, ctx, 60.0, times, dropping)  # until the relay's budget is full
        assert wait_until(dropping, 5.0)
        assert client.connected, "the rank stays connected to its relay"
        h2 = start_aggregator(make_settings(tmp_path / "again", nnodes=1, nproc_per_node=1, port=port))
        assert wait_until(lambda: relay.stats().upstream_connected, 10.0)
        _record_for(rec, ctx, 0.3, times)
        rec.flush_partial()
        assert client.close(5.0, bye=bye(0, rec))
        assert relay.drain(10.0)
        st = relay.stats()
        s = _summary(h2.finish(0))
    finally:
        relay.close(1.0)
        for x in (h, h2):
            if x is not None and x.alive():
                x.kill()
    r = s["ranks"][0]
    assert st.upstream_connects == 2 and st.records_in == rec.count and rec.lost == 0
    assert r["telemetry"]["relay_dropped"] == st.records_dropped > 0
    assert r["telemetry"]["expected"] == rec.count
    assert r["status"] == "clean" and r["node"] == 0
    times.sort()
    assert times[int(len(times) * 0.999)] < 0.005


def test_relay_link_lost_with_ranks_connected_marks_them_gone(aggregator):
    """A node's relay link dies with its ranks still connected (the node crashed): the aggregator
    ends those ranks like closed connections, keeps serving, and names the node as lost."""
    h = aggregator(nnodes=2, nproc_per_node=2)
    link = NodePeer(h.port, 1, extra={"nproc": 2})
    assert link.welcomed
    for rank in (2, 3):
        link.send({"t": "join", "rank": rank, "local_rank": rank - 2, "host": "host1", "pid": 1,
                   "new": True})
        link.send(folded({"t": "steps", "rank": rank, "seq": 0, "n": 3, "cols": columns(3), "dropped": 0}))
    assert wait_until(lambda: (h.status() or {}).get("ranks_connected") == 2)
    link.close()
    assert wait_until(lambda: (h.status() or {}).get("ranks_connected") == 0)
    status = h.status()
    assert status is not None and status["nodes_lost"] == [1], status
    s = _summary(h.finish(1, reason="node 1 vanished", failed_nodes=[1]))
    by = {r["rank"]: r for r in s["ranks"]}
    assert by[2]["status"] == by[3]["status"] == "vanished"
    assert by[2]["steps"] == by[3]["steps"] == 3 and by[2]["node"] == 1
