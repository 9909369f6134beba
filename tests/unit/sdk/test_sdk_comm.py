"""Communication timing on real gloo process groups (CPU): tests/unit/scripts/comm_train.py runs as
2-3 ranks, each reporting to a loopback receiver and printing the facts it knows (bytes, buckets,
a checksum of its parameters); the telemetry must agree with them."""

from __future__ import annotations

import json

import pytest

from sdk_helpers import REPO, launch_ranks

SCRIPT = str(REPO / "tests" / "unit" / "scripts" / "comm_train.py")
COMM = ("comm_ns", "comm_busy_ns", "comm_bytes", "comm_bus_bytes", "comm_calls")


def run(sink, mode: str, world: int = 2, **env: str):
    """Run the scenario; returns ({rank: columns}, {rank: facts})."""
    outs = launch_ranks(sink.port, SCRIPT, [], world=world, COMM_MODE=mode, **env)
    facts = {}
    for _code, out, _err in outs:
        line = next(x for x in out.splitlines() if x.startswith("COMM_FACTS "))
        f = json.loads(line[len("COMM_FACTS "):])
        facts[f["rank"]] = f
    if env.get("COMM_TRACE", "1") == "1":
        assert sink.wait_for(lambda s: all(r in s.ranks and s.ranks[r].bye for r in range(world)), 10)
    return {r: sink.ranks[r].columns for r in sink.ranks}, facts


def phases_add_up(cols, i: int) -> None:
    """Forward, backward and optimizer without their waits, plus the wait, fit in the step."""
    parts = sum(max(0, cols[c][i]) for c in ("input_ns", "forward_ns", "backward_ns",
                                               "optimizer_ns", "comm_ns"))
    assert parts <= cols["step_ns"][i] * 1.001, (i, parts, cols["step_ns"][i])


def test_explicit_collectives_in_a_traced_step_are_counted(sink):
    cols, facts = run(sink, "explicit", COMM_STEPS="8")
    for rank in (0, 1):
        c, f = cols[rank], facts[rank]
        assert len(c["step"]) == 8
        assert c["comm_calls"] == [f["calls_per_step"]] * 8, "the all_reduce after the loop is not a step's"
        assert c["comm_bytes"] == [f["bytes_per_step"]] * 8
        # busbw factors of nccl-tests for 2 ranks: all_reduce x1, all_gather x1/2, broadcast x1
        n = 65536
        want_bus = 4 * n + 4 * (2 * (n // 4)) // 2 + 4 * n + 0 + 4 * n
        assert c["comm_bus_bytes"] == [want_bus] * 8
        for i in range(8):
            assert 0 < c["comm_ns"][i] <= c["step_ns"][i]
            assert c["comm_busy_ns"][i] > 0
            phases_add_up(c, i)


def test_ddp_buckets_are_timed_and_backward_is_reported_without_the_wait(sink):
    cols, facts = run(sink, "ddp", COMM_STEPS="10")
    for rank in (0, 1):
        c, f = cols[rank], facts[rank]
        # DDP's first backward reduces in one bucket, then in the rebuilt buckets
        assert c["comm_calls"][0] >= 1 and set(c["comm_calls"][1:]) == {f["buckets"]}
        assert f["buckets"] >= 3, "bucket_cap_mb=0.25 splits this model"
        assert c["comm_bytes"] == [f["grad_bytes"]] * 10, "every gradient byte, once per step"
        assert c["comm_bus_bytes"] == [f["grad_bytes"]] * 10, "all-reduce on 2 ranks: busbw = algbw"
        for i in range(10):
            assert c["comm_ns"][i] >= 0 and c["comm_busy_ns"][i] > 0
            assert c["backward_ns"][i] > 0
            phases_add_up(c, i)
    # the two ranks wait for each other: together they wait a visible share of the run
    waited = sum(sum(cols[r]["comm_ns"]) for r in (0, 1))
    assert waited > 0


def test_gradient_accumulation_counts_communication_only_on_the_syncing_backward(sink):
    cols, facts = run(sink, "nosync", COMM_STEPS="6", COMM_ACCUM="4")
    for rank in (0, 1):
        c, f = cols[rank], facts[rank]
        # four backwards per step, three under no_sync(): one step's gradients cross once
        assert c["comm_bytes"] == [f["grad_bytes"]] * 6
        assert set(c["comm_calls"][1:]) == {f["buckets"]}


#: the comm-hook path that CUDA models take, forced on CPU (sdk/comm.py's test hook)
HOOK = {"TRACEML_TEST_DDP_COMM_HOOK": "1"}


def test_timing_ddp_leaves_the_gradients_bit_identical(sink):
    """Three ranks (1/3 is inexact in binary): traced and untraced training end with the same bits,
    with DDP's timings read (CPU) and with TraceML's comm hook doing the averaging (CUDA's path).
    One launch: each rank trains a fresh seeded model untraced (before traceml.init()), then
    traced, then traced through the comm hook."""
    cols, facts = run(sink, "bitwise", world=3, COMM_STEPS="5")
    plain = facts[0]["checksum_plain"]
    assert {f["checksum_plain"] for f in facts.values()} == {plain}
    assert {f["checksum_traced"] for f in facts.values()} == {plain}
    assert {f["checksum_hooked"] for f in facts.values()} == {plain}
    # the two traced models took the two paths, and their steps reached the receiver
    assert {f["comm_hook_traced"] for f in facts.values()} == {"Watched"}, "CPU: DDP's reducer timings"
    assert {f["comm_hook_hooked"] for f in facts.values()} == {"DdpHookState"}, "the comm hook"
    assert all(len(cols[r]["step"]) == 10 for r in range(3)), {r: len(cols[r]["step"]) for r in cols}


def test_the_comm_hook_path_times_every_bucket(sink):
    cols, facts = run(sink, "ddp", COMM_STEPS="6", **HOOK)
    for rank in (0, 1):
        c, f = cols[rank], facts[rank]
        assert set(c["comm_calls"][1:]) == {f["buckets"]}
        assert c["comm_bytes"] == [f["grad_bytes"]] * 6
        for i in range(6):
            assert c["comm_busy_ns"][i] > 0 and c["comm_ns"][i] >= 0
            phases_add_up(c, i)


@pytest.mark.parametrize("env", [{}, HOOK], ids=["reducer-timings", "comm-hook"])
def test_a_user_hook_registered_after_ddp_is_built_runs_and_is_timed(sink, env):
    cols, facts = run(sink, "user_hook", COMM_STEPS="6", **env)
    c, f = cols[0], facts[0]
    assert set(c["comm_calls"][1:]) == {f["buckets"]}, "each bucket once (its hook's own all_reduce not again)"
    assert c["comm_bytes"] == [f["grad_bytes"]] * 6
    assert facts[0]["checksum"] == facts[1]["checksum"], "fp16-compressed all-reduce still agrees"


def test_fsdp2_collectives_are_timed(sink):
    cols, facts = run(sink, "fsdp", COMM_STEPS="4")
    if facts[0]["fsdp"] != "ran":
        pytest.skip(f"FSDP2 cannot run on gloo here: {facts[0]['fsdp']}")
    c = cols[0]
    # 7 sharded layers: all-gather in forward and again in backward, reduce-scatter in backward
    assert c["comm_calls"] == [21] * 4
    assert all(b > 0 for b in c["comm_bytes"]) and all(x > 0 for x in c["comm_ns"])
    for i in range(4):
        phases_add_up(c, i)


def test_a_ddp_model_built_and_hooked_before_init_is_still_timed_on_cpu(sink):
    """On CPU TraceML reads DDP's own reducer timings, so a model built (with a built-in comm
    hook) before traceml.init() is found and timed all the same."""
    cols, facts = run(sink, "prehooked", COMM_STEPS="4")
    for rank in (0, 1):
        c, f = cols[rank], facts[rank]
        assert set(c["comm_calls"][1:]) == {f["buckets"] + 1}, "the buckets and the explicit all_reduce"
        assert c["comm_bytes"][1:] == [f["grad_bytes"] + 64] * 3
        assert all(x > 0 for x in c["comm_busy_ns"])


def test_in_flight_names_the_collective_a_rank_is_waiting_in(sink):
    _, facts = run(sink, "inflight")
    f = facts[0]
    assert f["seen_n"] >= 5, "rank 0 waited ~1.5 s inside the all_reduce"
    op, nbytes, seq, started_ns, size = f["seen"][0]
    assert (op, nbytes, size) == ("all_reduce", 4000, 2)
    assert seq == 1, "the barrier before it was collective 0"
    assert f["after"] is None, "nothing in flight once it completed"


def test_a_single_process_says_communication_was_not_measured(sink, sdk):
    import torch

    from sdk_helpers import tiny_mlp

    assert sdk.init(aggregator=f"127.0.0.1:{sink.port}", token="test-token", run_name="test-run")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with sdk.trace_step(model):
            model(torch.randn(4, 32)).sum().backward()
            opt.step()
    sdk.shutdown()
    assert sink.wait_for(lambda s: 0 in s.ranks and s.ranks[0].bye)
    cols = sink.ranks[0].columns
    for name in COMM:
        assert cols[name] == [-1] * 3, name
