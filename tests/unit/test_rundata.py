"""Typed run data (traceml_core/rundata.py): the aggregator's data and a checkpoint's read back
as the same types, and written back unchanged.

A summary rebuilt from a checkpoint must read exactly what the live aggregator held: these tests
fill a real RunState through its ingest code (steps, a goodbye, an exception, a node's worker and
OOM report, system samples, a hang report, the launcher's finish), then check the round trip
through the checkpoint's own bytes."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
from aggpeers import columns, make_settings, relayed
from traceml_core.aggregator.adapter import checkpoint_data, run_data
from traceml_core.aggregator.autopsy import Autopsy
from traceml_core.rundir import load_checkpoint, pack_checkpoint
from traceml_core.aggregator.state import RunState
from traceml_core.report.summary import build_summary
from traceml_core.codec import decode, encode
from traceml_core.rundata import GPU_METRICS, HangReport, LaunchEnd, RankBye, RunData, StepSource
from traceml_core.wire.frames import GPU_LIMITS, worker_report

STACK = ('Current thread 0x1 (most recent call first):\n  File "/home/u/train.py", line 76 in main\n'
         '  File "/home/u/train.py", line 121 in <module>\n')


def _state() -> RunState:
    st = RunState(make_settings(Path("/nonexistent"), nnodes=2, nproc_per_node=2))
    for rank in range(3):
        rs = st.rank(rank)
        rs.node, rs.host, rs.local_rank = rank // 2, f"n{rank // 2}", rank % 2
        rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": 0, "n": 60, "dropped": 1,
                                "cols": columns(60, comm_ms=2.0, comm_busy_ms=5.0, comm_bytes=4_000_000,
                                                comm_bus_bytes=6_000_000, comm_calls=3, mem_growth=1 << 16)}))
    st.rank(0).bye = RankBye("clean", 60, None, 5.0)
    st.rank(1).note_event("exception", "Traceback ...\nRuntimeError: boom", 4.5)
    st.rank(1).step_source = decode(StepSource, {"source": "inferred", "backward_per_step": 1, "forward": False,
                                                 "backward_steps": [60, 60]})
    st.rank(2).open_bound = 7
    for node in range(2):
        st.note_join(node, f"n{node}", "node" if node else "control", st.settings.started_at + node)
    report = worker_report({"workers": [{"rank": 3, "local_rank": 1, "pid": 7, "exitcode": -9,
                                         "signal": "SIGKILL", "ts": 5.5}],
                            "oom": {"kills": 1, "limit_bytes": 1 << 30, "source": "cgroup"}})
    st.node(1).bye = decode(LaunchEnd, {"status": "error", "exit_code": 1, "at": 6.0, **report})  # as ingest keeps it
    st.node_system(0).ingest("n0", [{"ts": st.settings.started_at + i, "cpu_pct": 50.0 + i,
                                     "ram_used": 1 << 30, "ram_total": 8 << 30,
                                     "gpus": [{"index": 0, "util_pct": 90.0, "mem_used": 1 << 30,
                                               "mem_total": 8 << 30, "temp_c": 60.0, "power_w": 200.0}]}
                                    for i in range(5)])
    a = Autopsy(1, {0: (0, "n0", 60)}, world=4, silent_s=61.0, threshold_s=60.0,
                threshold_source="auto", records_at=180)
    a.add(0, {"source": "sdk", "text": STACK})
    st.hangs.append(decode(HangReport, a.report()))
    st.records = 180
    st.finish = LaunchEnd(exit_code=1, reason="a worker failed", failed_nodes=[1], source="launcher",
                          at=time.time())
    return st


def test_the_aggregators_data_and_its_checkpoint_read_back_as_the_same_typed_run():
    st = _state()
    plain = checkpoint_data(st)
    run = run_data(st)
    # every field the aggregator keeps reaches the typed data...
    r1 = run.rank_by_id()[1]
    assert r1.received == 60 and r1.client_dropped == 1 and r1.events[-1].text.endswith("boom")
    assert r1.phase("step").count == 60 and r1.phase("step_ns") is r1.phases["step_ns"]
    assert r1.step_source is not None and r1.step_source.forward is False
    assert r1.step_source.extra == {"backward_steps": [60, 60]}
    node1 = run.node_by_id()[1]
    assert node1.bye is not None and node1.bye.workers[0].signal == "SIGKILL"
    assert node1.bye.oom is not None and node1.bye.oom.kills == 1
    assert run.system[0].gpus[0].util_pct.mean == 90.0 and run.system[0].cpu_pct.max == 54.0
    assert GPU_METRICS == tuple(GPU_LIMITS)  # the typed GPU is the wire's GPU sample
    assert run.hangs[0].ranks[0]["where"] == "train.py:76 in main" and run.hangs[0].records_at == 180
    assert run.finish is not None and run.finish.failed_nodes == [1] and not run.finish.workers
    # ... and goes back unchanged, through the checkpoint's own bytes too
    assert encode(run) == plain
    doc = msgpack.unpackb(pack_checkpoint(plain, final=True), raw=False, strict_map_key=False)
    again = decode(RunData, doc["state"])
    assert again == run and encode(again) == plain


def test_a_checkpoint_file_rebuilds_the_summary_the_live_aggregator_wrote(tmp_path):
    st = _state()
    live = build_summary(run_data(st), now=100.0)
    path = tmp_path / "aggregate.state"
    path.write_bytes(pack_checkpoint(checkpoint_data(st), final=True))
    rebuilt = build_summary(decode(RunData, load_checkpoint(path)["state"]), now=100.0)
    assert rebuilt == live
    assert live["run"]["status"] == "failed" and live["verdict"]["kind"] == "hang"


def test_an_older_checkpoint_without_the_newer_fields_still_loads():
    """Fields added over time (relay accounting, sums, step sources, the OOM report) take their
    documented defaults when a checkpoint does not have them."""
    plain = checkpoint_data(_state())
    for r in plain["ranks"]:
        for key in ("relay_dropped", "relay_seq_end", "open_bound", "last_open", "counts", "sums",
                    "step_source", "sketched", "rejected", "event_count", "first_seq"):
            r.pop(key, None)  # (rejected: written by protocol version 3's aggregators only)
    plain.pop("probe")
    plain["finish"].pop("oom")
    run = decode(RunData, plain)
    r0 = run.ranks[0]
    assert (r0.relay_dropped, r0.open_bound, r0.sums, r0.step_source) == (0, None, {}, None)
    assert r0.sketched == r0.received == 60  # every record counted as sketched, as before
    assert run.finish is not None and not run.finish.has_oom
    summary = build_summary(run, now=100.0)
    assert summary["ranks"][0]["comm"] is None and summary["telemetry"]["records_received"] == 180
