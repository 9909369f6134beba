"""The hang report's reading of ranks whose stack could not be taken (report/hang.py); the real
runs are tests/slurm/test_headline_slurm.py (a SIGSTOPped rank on node 2) and
tests/faults/test_hang_autopsy.py."""

from __future__ import annotations

from traceml_core.report.hang import STOPPED, build

BACKWARD = ('Current thread 0x1 (most recent call first):\n'
            '  File "/v/site-packages/torch/autograd/graph.py", line 9 in _engine_run_backward\n'
            '  File "/v/site-packages/torch/autograd/__init__.py", line 3 in backward\n'
            '  File "/home/u/train.py", line 61 in main\n'
            '  File "/home/u/train.py", line 88 in <module>\n')


def _report(last: dict) -> dict:
    rows = [{"rank": r, "node": r // 2, "host": f"n{r // 2}", "step": 40,
             "snapshot": {"source": "sdk", "text": BACKWARD},
             "proc": {"source": "relay", "gone": False, "state": "S"}} for r in range(3)]
    rows.append({"rank": 3, "node": 1, "host": "n1", "step": 40, **last})
    return build(rows, world=4, silent_s=61.0, threshold_s=60.0, threshold_source="auto", at=0.0)


def test_a_stopped_rank_is_the_one_the_others_wait_for():
    """Issue 27, finding 6: it said "no rank's stack could be read" (ranks 0-2 were read)."""
    h = _report({"proc": {"source": "relay", "gone": False, "state": "T"}})
    assert h["culprits"] == [3]
    assert h["finding"] == ("rank 3 (node 1, n1) never arrived at the collective the others wait in (the "
                            "gradient all-reduce (DDP backward)): its process is stopped (SIGSTOP, Ctrl-Z, "
                            "or a debugger holds it), so it runs nothing"), h["finding"]
    assert [a["state"] for a in h["ranks"]] == ["collective"] * 3 + ["stopped"]


def test_a_rank_without_a_stack_beside_ranks_waiting_in_one_collective_never_arrived():
    h = _report({"proc": {"source": "relay", "gone": False, "state": "S", "wchan": "futex_wait"}})
    assert h["culprits"] == [3]
    assert h["finding"] == ("ranks 0-2 wait in the gradient all-reduce (DDP backward); rank 3 (node 1, n1) "
                            "never arrived at it, and no stack could be read from it"), h["finding"]
    r3 = h["ranks"][3]
    assert r3["state"] == "no_dump" and r3["error"] == (
        "its interpreter did not answer within 6 s (C code holding the GIL, or the process is "
        "overloaded); the kernel says its main thread is sleeping in futex_wait"), r3


def test_an_answer_from_before_a_rank_stopped_is_not_where_it_is():
    """The rank answered, then was stopped before its relay read it: stopped wins (it runs
    nothing now, whatever its stack said a moment ago)."""
    h = _report({"snapshot": {"source": "sdk", "text": BACKWARD},
                 "proc": {"source": "relay", "gone": False, "state": "T"}})
    assert h["ranks"][3]["state"] == "stopped" and h["ranks"][3]["error"] == STOPPED
    assert h["culprits"] == [3]



def test_a_rank_nothing_was_heard_from_is_unreachable_not_a_rank_that_never_arrived():
    """Node 2's link is down: neither rank 3 nor its relay answers (benchmarks/hang_latency.py,
    link-cut)."""
    h = _report({})
    assert h["ranks"][3]["state"] == "unreachable" and h["culprits"] == [3]
    assert h["finding"] == ("ranks 0-2 wait in the gradient all-reduce (DDP backward); nothing was heard "
                            "from rank 3 (node 1, n1): neither the rank nor its node's relay answered, so "
                            "its node or its network link may be down"), h["finding"]
