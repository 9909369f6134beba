"""The rank side against the real aggregator: the examples, run as 2-rank DDP jobs on gloo, end in
the summary verdict they are written to show (no launcher involved: the ranks get the run info a
launcher would export, and a real relay carries them to node 0)."""

from __future__ import annotations

import json

import pytest

from aggpeers import end_node, node
from sdk_helpers import launch_ranks

pytest.importorskip("traceml_core.aggregator.process")

from traceml_core.aggregator.process import start_aggregator  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402

TOKEN = "sdk-e2e-token-0123456789"
RUN = "sdk-e2e"


def run_example(tmp_path, script, args, world=2, **env):
    settings = AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=tmp_path / "logs" / RUN, port=0,
                                  nnodes=1, nproc_per_node=world, drain_s=0.5, job_id=None)
    agg = start_aggregator(settings)
    relay = None
    try:
        relay = node(agg, 0)   # the ranks' route to node 0, as under `traceml run`
        launch_ranks(relay.port, script, args, world=world, token=TOKEN, run=RUN, **env)
        end_node(relay, 0)
        result = agg.finish(0)
    finally:
        if relay is not None:
            relay.close(1.0)
        if agg.alive():
            agg.kill()
    assert result.summary_json is not None, result
    return json.loads(result.summary_json.read_text())


@pytest.mark.slow
def test_straggler_example_is_called_a_straggler_with_its_rank(tmp_path):
    summary = run_example(tmp_path, "straggler.py", ["--steps", "60"], STRAGGLER_DELAY_MS="20")
    v = summary["verdict"]
    assert v["kind"] == "straggler", v
    assert v["culprit"]["rank"] == 1
    for r in summary["ranks"][:2]:
        assert r["status"] == "clean" and r["steps"] == 60
        assert r["telemetry"]["lost"] == 0


@pytest.mark.slow
def test_input_bound_example_is_called_input_bound(tmp_path):
    summary = run_example(tmp_path, "input_bound.py", ["--steps", "30", "--item-ms", "1.5"])
    assert summary["verdict"]["kind"] == "input_bound", summary["verdict"]
