"""Issue 27, finding 3: sums past 2**64 must not make every checkpoint fail.

Against the real aggregator process and real relays on loopback:

* the attack: four records whose ``comm_bytes`` are each 2**62 (inside the protocol's old range,
  so accepted one by one) summed past 2**64 at node 0, and every checkpoint then failed
  (msgpack's ``OverflowError``): the aggregator died, and the run was left with a rebuild from
  an early checkpoint. Now a value past its column's physical bound (1 PiB for bytes moved in one
  step) is refused where it enters, with its frame, and the records are counted as lost;
* values within their bounds whose sum still passes 2**64 (a peak memory of 1 PiB over 20,000
  steps; a long run gets there with a realistic one): the checkpoint holds the exact sum, and a
  restarted aggregator or ``traceml summarize`` reads it back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from aggpeers import RankPeer, columns
from traceml_core.rundir import load_checkpoint


def wait_checkpoint(r, cond, timeout: float = 60.0) -> list:
    """The ranks of the first checkpoint (one every 0.2 s) for which ``cond`` holds; fails when the
    aggregator dies first."""
    state = Path(r.run_dir) / "aggregate.state"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ranks = load_checkpoint(state)["state"]["ranks"]
        except (OSError, ValueError):
            ranks = []
        if cond(ranks):
            return ranks
        assert r.alive(), "the aggregator died"
        time.sleep(0.1)
    raise AssertionError("no checkpoint with every record was written")


def test_four_in_range_values_summing_past_2_64_no_longer_kill_the_aggregator(rig):
    r = rig(nnodes=1, nproc_per_node=2)
    other = RankPeer(r.port, 1)
    other.steps(30)
    evil = RankPeer(r.port, 0)
    evil.steps(10)
    cols = columns(4, 10, comm_ms=1.0, comm_busy_ms=1.0, comm_bytes=1 << 62, comm_bus_bytes=1, comm_calls=1)
    evil.send({"t": "steps", "rank": 0, "seq": 10, "n": 4, "cols": cols, "dropped": 0})
    assert evil.closed_by_server(10.0), "the relay kept a connection that sent values past their bound"
    again = RankPeer(r.port, 0)  # the rank reconnects, as the SDK's client does, and goes on
    again.seq = 14
    again.steps(16)
    again.bye()
    other.bye()
    wait_checkpoint(r, lambda ranks: [x["received"] for x in ranks] == [26, 30])
    result = r.finish(0)
    assert result.summary_json is not None and not result.rebuilt, result
    s = json.loads(result.summary_json.read_text())
    t0 = s["ranks"][0]["telemetry"]
    assert (t0["received"], t0["lost"], t0["expected"]) == (26, 4, 30), t0
    assert s["ranks"][1]["telemetry"]["received"] == 30
    assert s["run"]["status"] == "completed" and not s["telemetry"]["complete"]
    assert s["telemetry"]["records_lost"] == 4 and s["telemetry"]["aggregator_restarts"] == 0


def test_sums_of_in_bound_values_past_2_64_are_checkpointed_exactly(rig):
    big = 1 << 50  # a peak memory at its physical bound (limits.BYTES): valid
    n, per_frame = 20_000, 2_000  # 20,000 x 2**50 > 2**64
    r = rig(nnodes=1, nproc_per_node=1)
    peer = RankPeer(r.port, 0)
    for _ in range(n // per_frame):
        peer.steps(per_frame, mem=big)
    sums = wait_checkpoint(r, lambda ranks: ranks and ranks[0]["received"] == n)[0]["mem"]
    assert sums["sum"] == n * big > 1 << 64 and sums["count"] == n, sums
    peer.bye()
    result = r.finish(0)
    assert not result.rebuilt, result
    s = json.loads(result.summary_json.read_text())
    assert s["ranks"][0]["mem_peak"]["mean_bytes"] == big and s["ranks"][0]["mem_peak"]["max_bytes"] == big
    final = load_checkpoint(Path(r.run_dir) / "aggregate.state")
    assert final["final"] and final["state"]["ranks"][0]["mem"]["sum"] == n * big

