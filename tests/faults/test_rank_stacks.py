"""The hang autopsy's rank end for real: gloo DDP ranks (faulty_train.py under plain torchrun)
whose SDK is connected to a real node relay and aggregator (rankrig.py), asked where they are the
way node 0 asks them. Each rank's interpreter answers with every thread's stack on its client
thread (sdk/stackdump.py: no signal, so no handler running on another thread's stack); its relay
adds what the kernel says of the process (launcher/procstate.py).

* Three hangs, read from the ranks' own answers: rank 1 stuck in its own code while rank 0 waits
  for it in DDP's gradient all-reduce; rank 1 in an all_reduce rank 0 never enters (mismatched
  collectives); rank 1 waiting for a batch its DataLoader worker never delivers.
* The ranks that cannot answer are still described: one stopped (SIGSTOP), one whose C code
  holds the GIL (its interpreter cannot run the answer).
* Stack requests never change a rank's fate: thousands of them at every point of the steps of
  two training ranks, which answer every one, train on and end cleanly.

The full path through `traceml run` is tests/faults/test_hang_autopsy.py and, across two Slurm
nodes, tests/slurm/test_headline_slurm.py; benchmarks/stack_stress.py sends 10,000 requests and more.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from rankrig import RankRig

from traceml_core.report import hang

DDP = ("ddp_backward", "ddp_bucket")
#: where each rank is once the hang has set in: {fault: {rank: (state, collectives or None)}}
SETTLED = {"hang": {0: ("collective", DDP), 1: ("running", None)},
           "hang-in-collective": {0: ("collective", DDP), 1: ("collective", ("all_reduce",))},
           "hang-in-loader": {0: ("collective", DDP), 1: ("dataloader", None)},
           "hold-gil": {0: ("collective", DDP), 1: ("no_dump", None)},
           "stopped": {0: ("collective", None), 1: ("stopped", None)}}


def _settled(report, fault) -> bool:
    ranks = {a["rank"]: a for a in report["ranks"]}
    return ranks.keys() == SETTLED[fault].keys() and all(
        ranks[r]["state"] == state and (ops is None or ranks[r].get("collective") in ops)
        for r, (state, ops) in SETTLED[fault].items())


def _report_once_hung(rig: RankRig, fault: str, bound_s: float = 60.0):
    """Take reports until both ranks are where the hang leaves them (step 20's record is written
    before they get there, and on a loaded machine the way can take a while). Returns the last
    report, the slowest collection's seconds and the number of reports taken."""
    deadline = time.monotonic() + bound_s
    slowest, n = 0.0, 0
    while True:
        t0 = time.monotonic()
        report = rig.autopsy()
        slowest, n = max(slowest, time.monotonic() - t0), n + 1
        assert report is not None, "the aggregator did not answer"
        if _settled(report, fault) or time.monotonic() > deadline:
            return report, slowest, n
        time.sleep(0.5)


@pytest.mark.parametrize("fault", ["hang", "hang-in-collective", "hang-in-loader"])
def test_each_rank_says_where_it_is_and_the_report_names_the_culprit(tmp_path, fault):
    rig = RankRig(tmp_path)
    try:
        rig.start(["--steps", "200", "--fault", fault, "--fault-rank", "1", "--fault-step", "20",
                   "--settle", "0"])
        rig.wait_steps(20)
        report, took, tries = _report_once_hung(rig, fault)
    finally:
        rig.close()
    print(f"{fault}: both ranks answered in {took:.2f} s (the slowest of {tries} reports)")
    # every rank answers from its interpreter: the collection ends long before the deadline
    assert took < 5.0, took
    ranks = {a["rank"]: a for a in report["ranks"]}
    assert _settled(report, fault), ranks
    assert ranks[0]["where"].startswith("faulty_train.py:") and ranks[0]["stack"][-1].endswith("<module>")
    lines = hang.render(report)
    if fault == "hang":
        # rank 1 sleeps in its own code: it never arrived at the all-reduce rank 0 waits in
        assert ranks[1]["where"].startswith("faulty_train.py:"), ranks[1]
        assert report["culprits"] == [1]
        assert "rank 1 (node 0, h) never arrived at the collective the others wait in" in report["finding"]
        assert any("<- never arrived" in ln and ln.lstrip().startswith("rank 1") for ln in lines), lines
    elif fault == "hang-in-loader":
        assert ranks[1]["where"].startswith("faulty_train.py:"), ranks[1]
        assert report["culprits"] == [1]
        assert ("rank 1 (node 0, h) never arrived at the collective the others wait in "
                "(the gradient all-reduce (DDP backward)): it is waiting for a DataLoader batch"
                in report["finding"]), report["finding"]
    else:
        # rank 1 waits in an all_reduce rank 0 never enters: mismatched, nobody singled out of two
        assert "different collectives" in report["finding"] and report["culprits"] == []
    # TraceML's own threads (the one that answered) are not counted as the rank's
    assert all(a["threads"] >= 1 for a in report["ranks"])


def test_ranks_that_cannot_answer_are_described_from_the_kernel(tmp_path):
    """Rank 1 in C code that holds the GIL: its interpreter cannot answer, its relay says where
    the kernel has it; then the same run with rank 1 stopped is reported stopped at once (no
    wait for an answer that cannot come), and once continued it trains on."""
    rig = RankRig(tmp_path)
    try:
        rig.start(["--steps", "200", "--fault", "hold-gil", "--fault-rank", "1", "--fault-step", "20",
                   "--settle", "0"])
        rig.wait_steps(20)
        report, took, _ = _report_once_hung(rig, "hold-gil")
    finally:
        rig.close()
    r1 = {a["rank"]: a for a in report["ranks"]}[1]
    assert r1["state"] == "no_dump", r1
    assert r1["error"].startswith("its interpreter did not answer within 6 s (C code holding the GIL"), r1
    assert "the kernel says its main thread is sleeping" in r1["error"], r1
    assert report["culprits"] == [1] and "no stack could be read from it" in report["finding"], report


def test_a_stopped_rank_is_named_at_once_and_trains_on_when_continued(tmp_path):
    rig = RankRig(tmp_path / "stop")
    try:
        stop_file = tmp_path / "stop.flag"
        rig.start(["--steps", "100000", "--stop-file", str(stop_file)])
        rig.wait_steps(10)
        pid = rig.pids()[1]
        os.kill(pid, signal.SIGSTOP)
        try:
            report, took, _ = _report_once_hung(rig, "stopped")
        finally:
            os.kill(pid, signal.SIGCONT)
        r1 = {a["rank"]: a for a in report["ranks"]}[1]
        assert r1["state"] == "stopped" and r1["error"] == hang.STOPPED, r1
        assert report["culprits"] == [1], report
        assert took < 5.0, f"a stopped rank is known at once, not after the answer deadline: {took:.1f} s"
        before = rig.steps()[1]
        rig.wait_steps(before + 20)       # it trains on after SIGCONT
        stop_file.touch()
        assert rig.wait(120) == 0, rig.stderr()
    finally:
        rig.close()


#: stack requests sent while two ranks train (benchmarks/stack_stress.py sends 10,000 and more)
REQUESTS = 1500


def test_thousands_of_stack_requests_never_change_a_ranks_fate(tmp_path):
    """Requests paced at 1 ms land at every point of the ranks' steps (input, forward, backward,
    the optimizer, the gradient all-reduce, the SDK's own record); each rank answers every one,
    trains on, and ends as training ends: exit 0, its result written."""
    def train(d, requests: int):
        rig = RankRig(d)
        try:
            stop_file = d / "stop.flag"
            rig.start(["--steps", "100000", "--stop-file", str(stop_file)])
            rig.wait_steps(5)
            for i in range(requests):
                rig.request_stacks(1000 + i)
                time.sleep(0.001)
            deadline = time.monotonic() + 120
            while rig.relay.stats().answers_in < 2 * requests and time.monotonic() < deadline:
                assert rig.proc.poll() is None, rig.stderr()
                time.sleep(0.05)
            answered = rig.relay.stats().answers_in
            steps_at_stop = rig.steps()
            stop_file.touch()
            code = rig.wait(120)
            return code, answered, steps_at_stop, (d / "progress" / "rank0.txt").read_text(), rig.stderr()
        finally:
            rig.close()

    code, answered, steps, progress, err = train(tmp_path / "asked", REQUESTS)
    print(f"{REQUESTS} stack requests to 2 ranks: {answered} answers, ranks at steps {steps}, exit {code}")
    assert code == 0, err
    assert answered == 2 * REQUESTS, answered
    assert min(steps.values()) > 5, steps
    result = [ln for ln in progress.splitlines() if ln.startswith("result ")]
    assert len(result) == 1, progress[-500:]
