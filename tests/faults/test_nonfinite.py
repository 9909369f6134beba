"""Issue 27, finding 2: one rank's NaN or infinity must not cost the run its summary.

The attack, against the real aggregator process and real relays on loopback: a rank sends an
event whose time stamp is NaN, and a peer holding the run's token sends a node's system samples
with infinite and absurd values over a node link. Before the fix the aggregator accepted them,
``final_summary.json`` was never written (``Out of range float values are not JSON compliant``),
and the launcher's rebuild (``AggregatorHandle.finish``) raised the same error. Now the values are
refused where they enter (wire/frames.py, one physical bound per kind of field), counted, and the
summary says so.

A checkpoint that already holds such values (written before the wire checked for them), or data
the builder cannot read, still gets a summary from ``traceml summarize``: the last-resort path
(report/partial.py) writes what is known and says what is missing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack

from aggpeers import NodePeer, RankPeer
from harness import REPO

NAN, INF = float("nan"), float("inf")


def strict_json(path: Path) -> dict:
    """The file as JSON, refusing NaN/Infinity (what any other JSON reader does)."""
    def refuse(token: str) -> None:
        raise AssertionError(f"{path} holds {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_nan_and_infinity_from_a_rank_and_a_node_are_refused_and_the_summary_is_written(rig):
    r = rig(nnodes=2, nproc_per_node=1)
    rank0 = RankPeer(r.relay_port(0), 0, node=0)
    rank1 = RankPeer(r.relay_port(1), 1, node=1)
    assert rank0.welcomed and rank1.welcomed
    rank0.steps(20)
    rank1.steps(20)
    # the rank's event: a NaN time stamp
    rank0.send({"t": "event", "rank": 0, "kind": "warning", "text": "poisoned", "ts": NAN})
    # a second link of node 1 (the run's token is all it takes): system samples with a time stamp
    # that is not a time, and values that are not measurements
    now = time.time()
    evil = NodePeer(r.handle.port, 1)
    assert evil.welcomed
    evil.send({"t": "system", "node": 1, "host": "host1", "samples": [
        {"ts": INF, "cpu_pct": 10.0},                                        # 1: not a time
        {"ts": now, "cpu_pct": INF, "ram_used": NAN, "ram_total": 2 ** 34,   # 2: cpu, ram
         "gpus": [{"index": 0, "util_pct": INF, "temp_c": 1e300, "mem_used": 2 ** 30}]},  # 2: util, temp
        {"ts": now + 1, "cpu_pct": 55.0, "ram_used": 2 ** 33, "ram_total": 2 ** 34},
    ]})
    rank0.bye()
    rank1.bye()
    evil.close()
    result = r.finish(0)
    assert result.summary_json is not None and not result.rebuilt, result
    s = strict_json(result.summary_json)
    assert s["run"]["status"] == "completed", s["run"]
    assert [x["telemetry"]["received"] for x in s["ranks"]] == [20, 20]
    assert s["telemetry"]["wire"]["values_refused"] == 6, s["telemetry"]["wire"]
    assert any("6 value(s) sent by the ranks or nodes were not measurements" in n for n in s["notes"]), s["notes"]
    node1 = [n for n in s["system"]["nodes"] if n["node"] == 1][0]
    # the sample without a time is left out; the other two count, their refused values do not
    assert node1["samples"] == 2 and node1["cpu_pct_mean"] == 55.0, node1
    text = Path(result.summary_txt).read_text()
    assert "values refused 6" in text and "not measurements" in text, text


def _state(run_dir: Path) -> dict:
    return msgpack.unpackb((run_dir / "aggregate.state").read_bytes(), raw=False, strict_map_key=False)


def _summarize(run_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", "summarize", str(run_dir)],
                          capture_output=True, text=True, timeout=120, env=env)


def _finished_run(rig) -> Path:
    r = rig(nnodes=1, nproc_per_node=2)
    for rank in (0, 1):
        p = RankPeer(r.port, rank)
        p.steps(30)
        p.bye()
    result = r.finish(0)
    assert result.summary_json is not None
    return Path(result.summary_json).parent


def test_summarize_writes_a_summary_from_a_checkpoint_holding_nan(rig):
    """A checkpoint written before the wire refused non-finite values (or by a bug): `traceml
    summarize` writes the whole summary without them, says how many there were, exits 0."""
    run_dir = _finished_run(rig)
    doc = _state(run_dir)
    doc["state"]["ranks"][0]["events"].append({"kind": "exception", "text": "x", "ts": NAN})
    doc["state"]["ranks"][1]["joined_at"] = INF
    (run_dir / "aggregate.state").write_bytes(msgpack.packb(doc, use_bin_type=True))
    out = _summarize(run_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr
    s = strict_json(run_dir / "final_summary.json")
    assert s["partial"]["whole"] is True and s["rebuilt"], s.get("partial")
    assert "2 value(s) of the run's data were not finite numbers" in s["notes"][0]
    assert s["step_time"]["steps"] == 60 and s["verdict"]  # the statistics are all there
    assert "were not finite numbers" in out.stdout


def test_summarize_writes_what_is_known_when_the_builder_cannot_read_the_data(rig):
    """Data the builder cannot read at all (a rank's statistics missing): a partial summary with
    the run, its end and its ranks, naming the error and what is missing; the text says PARTIAL."""
    run_dir = _finished_run(rig)
    doc = _state(run_dir)
    del doc["state"]["ranks"][1]["phases"]
    (run_dir / "aggregate.state").write_bytes(msgpack.packb(doc, use_bin_type=True))
    out = _summarize(run_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr
    s = strict_json(run_dir / "final_summary.json")
    assert s["partial"]["whole"] is False and "KeyError" in s["partial"]["error"], s["partial"]
    assert "step_time" in s["partial"]["missing"]
    assert s["run"]["status"] == "completed" and s["run"]["exit_code"] == 0, s["run"]
    assert [(x["rank"], x["status"], x["received"]) for x in s["ranks"]] == [(0, "clean", 30), (1, "clean", 30)]
    assert "(PARTIAL)" in out.stdout and "rank 1 (node 0, host0): clean, 30 step records" in out.stdout
    assert not math.isnan(s["telemetry"]["records_received"]) and s["telemetry"]["records_received"] == 60
