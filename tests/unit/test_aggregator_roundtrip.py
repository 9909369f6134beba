"""A real aggregator process, real TCP ranks: what lands in final_summary.{json,txt}."""

from __future__ import annotations

import json
import time

from aggpeers import RankPeer


def test_round_trip_counts_and_files(rig):
    h = rig(nproc_per_node=2)
    peers = [RankPeer(h.port, r) for r in range(2)]
    assert all(p.welcomed for p in peers)
    for p in peers:
        for _ in range(5):
            p.steps(20, step_ms=10.0 + p.rank)  # rank 1 a bit slower
        p.bye()
    res = h.finish(0, reason="training exited 0")
    assert not res.rebuilt and res.error is None
    assert res.summary_json.name == "final_summary.json"
    assert res.summary_json.parent == h.run_dir
    s = json.loads(res.summary_json.read_text())
    assert s["schema_version"] == 1
    assert s["run"]["name"] == "test-run" and s["run"]["job_id"] == "42"
    assert s["run"]["status"] == "completed" and s["run"]["exit_code"] == 0
    assert s["topology"]["world_size"] == 2 and s["topology"]["nodes"][0]["joined"]
    assert s["topology"]["nodes"][0]["ranks"] == [0, 1]
    assert s["rank_endings"] == {"clean": 2}
    assert s["telemetry"]["records_received"] == 200
    assert s["telemetry"]["records_lost"] == 0 and s["telemetry"]["complete"]
    r0, r1 = s["ranks"]
    assert r0["steps"] == 100 and r0["telemetry"]["lost"] == 0
    assert abs(r0["phases"]["step"]["mean_ms"] - 10.0) < 1e-6
    assert abs(r1["phases"]["step"]["mean_ms"] - 11.0) < 1e-6
    assert abs(r1["phases"]["step"]["p50_ms"] - 11.0) / 11.0 < 0.01  # sketch: <1 % error
    assert r0["phases"]["h2d"] is None  # -1 = not measured (CPU)
    assert s["across_ranks"]["step"]["worst_rank"] == 1
    assert abs(s["across_ranks"]["step"]["skew"] - 11.0 / 10.5) < 1e-3
    txt = res.summary_txt.read_text()
    assert "run test-run (job 42) - completed, exit 0" in txt
    assert "Verdict:" in txt and "2 clean" in txt and "none lost" in txt
    h.proc.wait(5)
    assert h.proc.returncode == 0


def test_aggregator_finishes_by_itself_when_every_rank_said_bye(rig):
    h = rig(nproc_per_node=2)
    h.control.close()  # no launcher: the ranks' byes end the run
    h.control = None
    peers = [RankPeer(h.port, r) for r in range(2)]
    for p in peers:
        p.steps(30)
        p.bye()
    assert h.proc.wait(10) == 0
    s = json.loads((h.run_dir / "final_summary.json").read_text())
    assert s["run"]["status"] == "completed"
    assert s["telemetry"]["records_received"] == 60


def test_status_query_reports_joined_nodes_and_ranks(rig):
    h = rig(nproc_per_node=2)
    p = RankPeer(h.port, 1)
    p.steps(7)
    deadline = time.monotonic() + 5
    while True:
        st = h.status()
        if st and st["records"] == 7 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    st.pop("checkpoint_s")
    st.pop("id")
    assert st.pop("refused") == 0
    hosts = st.pop("hosts")
    silent = st.pop("silent")
    # the run's median step (every step of every rank), for the hang report's automatic threshold
    assert abs(st.pop("median_step_ms") - 10.0) < 0.5
    # the hang detection's lines for node 0's log: none in a run that steps
    assert st.pop("notices") == []
    assert st == {"t": "status", "nodes_joined": [0], "ranks_connected": 1, "ranks_seen": 1,
                  "records": 7, "nodes_lost": [], "nodes_failed": {}}
    assert set(hosts) == {"0"}
    # for the hang watchdog: rank 1 has stepped, not said bye, and is still connected
    assert [(r, steps, node, host) for r, _, steps, node, host in silent] == [(1, 7, 0, "host0")]
    p.bye()
    # a rank that said bye is never "hung": the bye reaches the aggregator through the relay, so
    # wait for it (bounded) rather than for a fixed time
    deadline = time.monotonic() + 20
    while (st := h.status()) is None or st["silent"] != [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert st["silent"] == []


def test_the_token_is_never_written_to_disk(rig):
    from aggpeers import TOKEN
    h = rig(nproc_per_node=1, checkpoint_interval_s=0.1)
    p = RankPeer(h.port, 0)
    p.steps(10)
    p.bye()
    h.finish(0)
    files = list(h.run_dir.iterdir())
    assert {f.name for f in files} >= {"aggregate.state", "final_summary.json", "final_summary.txt"}
    for f in files:
        assert TOKEN.encode() not in f.read_bytes(), f


def test_system_samples_reach_the_summary(rig):
    h = rig(nproc_per_node=1)
    p = RankPeer(h.port, 0)
    h.relays[0].submit({"t": "system", "node": 0, "host": "gpu-a", "samples": [
        {"ts": 1.0, "cpu_pct": 20.0, "ram_used": 4 << 30, "ram_total": 16 << 30,
         "gpus": [{"index": 0, "util_pct": 80.0, "mem_used": 1 << 30, "mem_total": 8 << 30,
                   "temp_c": 70, "power_w": 200.0}]},
        {"ts": 2.0, "cpu_pct": 40.0, "ram_used": 5 << 30, "ram_total": 16 << 30,
         "gpus": [{"index": 0, "util_pct": 60.0, "mem_used": 2 << 30, "mem_total": 8 << 30,
                   "temp_c": 75, "power_w": None}]},
    ]})
    p.steps(5)
    p.bye()
    s = json.loads(h.finish(0).summary_json.read_text())
    node = s["system"]["nodes"][0]
    assert node["samples"] == 2 and node["cpu_pct_mean"] == 30.0 and node["ram_used_max"] == 5 << 30
    gpu = node["gpus"][0]
    assert gpu["util_pct_mean"] == 70.0 and gpu["temp_c_max"] == 75 and gpu["power_w_mean"] == 200.0
    assert s["system"]["gpu_util_pct_mean"] == 70.0
