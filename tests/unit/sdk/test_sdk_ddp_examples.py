"""The examples, run as real 2-process DDP jobs on gloo, reporting to a loopback receiver.

Each rank is a subprocess with the environment torchrun and ``traceml run`` would give it
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, TRACEML_RUN_INFO).
"""

from __future__ import annotations

import statistics

import pytest

from sdk_helpers import launch_ranks


def run_ranks(sink, script: str, args: list[str], world: int = 2, **extra_env: str):
    outs = launch_ranks(sink.port, script, args, world=world, **extra_env)
    assert sink.wait_for(lambda s: all(r in s.ranks and s.ranks[r].bye for r in range(world)))
    return outs


def median(xs):
    return statistics.median(xs)


def test_ddp_minimal_two_ranks_on_gloo(sink):
    outs = run_ranks(sink, "ddp_minimal.py", ["--steps", "60"])
    assert "ddp_minimal: 60 steps on 2 process(es)" in outs[0][1]
    for rank in (0, 1):
        log = sink.ranks[rank]
        assert log.hello["world"] == 2 and log.hello["local_rank"] == rank
        assert log.bye["status"] == "clean" and log.bye["steps"] == 60 and log.bye["dropped"] == 0
        cols = log.columns
        assert cols["step"] == list(range(60))
        for phase in ("forward_ns", "backward_ns", "optimizer_ns", "input_ns"):
            assert all(v > 0 for v in cols[phase]), (rank, phase)


def test_straggler_example_makes_the_other_rank_wait_in_the_all_reduce(sink):
    run_ranks(sink, "straggler.py", ["--steps", "25"], STRAGGLER_DELAY_MS="25")
    slow, fast = sink.ranks[1].columns, sink.ranks[0].columns    # default: the last rank
    assert median(slow["forward_ns"]) >= 25e6
    assert median(fast["forward_ns"]) < 10e6
    # rank 0 waits for rank 1 in the gradient all-reduce: its communication, not its backward
    assert median(fast["comm_ns"]) >= 15e6, "rank 0 waits for rank 1 in the all-reduce"
    assert median(fast["backward_ns"]) < median(fast["comm_ns"]) / 2
    assert median(slow["comm_ns"]) < median(fast["comm_ns"]) / 2, "the straggler itself hardly waits"
    # both ranks advance in lock step, so their step times agree
    assert median(fast["step_ns"]) == pytest.approx(median(slow["step_ns"]), rel=0.3)


def test_input_bound_example_is_dominated_by_input_wait(sink):
    run_ranks(sink, "input_bound.py", ["--steps", "12"], world=1)
    cols = sink.ranks[0].columns
    assert median(cols["input_ns"]) >= 25e6
    assert median(cols["input_ns"]) > 0.8 * median(cols["step_ns"])
