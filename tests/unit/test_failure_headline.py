"""How the failure headline reads the evidence (report/failure.py), on summary-shaped ranks.

The end-to-end cases (a raising, a SIGKILLed, an OOM-killed, an exiting rank; a failure on
node 2 under Slurm) run real `traceml run` in tests/faults and tests/slurm; these cover the
readings that those runs cannot all produce (an unreadable cgroup, NCCL's words, two independent
errors, an interrupted run).
"""

from __future__ import annotations

from traceml_core.report.failure import consequence_of, diagnose, raised_where, split_exception
from traceml_core.report.model import ExitRecord, RankSummary
from traceml_core.codec import decode
from traceml_core.rundata import HangReport, LaunchEnd, OomReport, RankEvent

TB = '''Traceback (most recent call last):
  File "/home/u/proj/train.py", line 88, in <module>
    main()
  File "/home/u/proj/train.py", line 61, in main
    loss = model(x)
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1775, in _call_impl
    return forward_call(*args, **kwargs)
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB
'''


def rank(r, status, *, node=0, error=None, tb=None, fail_step=None, in_step=False, steps=10,
         at=None, exit_=None):
    events = [RankEvent("exception", tb, at)] if tb else []
    return RankSummary(rank=r, node=node, host=f"n{node}", local_rank=None, status=status, error=error,
                       steps=steps, steps_produced=steps if status != "crashed" else None,
                       fail_step=fail_step, fail_in_step=in_step, failed_at=at,
                       exit=ExitRecord(**exit_) if exit_ else None, last_events=events)


def test_the_users_own_frame_and_the_exception_are_named():
    assert raised_where(TB) == "train.py:61 in main"
    assert split_exception("torch.distributed.DistBackendError: NCCL error") == (
        "torch.distributed.DistBackendError", "NCCL error")
    assert split_exception("something odd happened") == (None, "something odd happened")


def test_backend_words_for_a_lost_peer_are_consequences():
    assert consequence_of("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert consequence_of("DistBackendError: NCCL communicator was aborted on rank 3")
    assert consequence_of("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)")
    assert consequence_of("RuntimeError: CUDA out of memory") is None
    assert consequence_of("ValueError: bad label 7") is None


def test_an_exception_inside_a_step_beats_the_gloo_errors_it_caused():
    ranks = [rank(0, "error", error="RuntimeError: Connection closed by peer", at=100.5,
                  tb="RuntimeError: [gloo] Connection closed by peer", fail_step=7, in_step=True, steps=7),
             rank(1, "error", error="RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
                  tb=TB, at=100.9, fail_step=7, in_step=True, steps=7),
             rank(2, "crashed", at=101.0, steps=3)]
    v = diagnose(ranks, {0: OomReport(kills=0, limit_bytes=None, source="x")}, "failed")
    assert v["culprit"]["rank"] == 1  # later by the clock, but the only real error
    assert v["reason"] == "rank 1 raised RuntimeError in step 7: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "at train.py:61 in main" in v["why"]
    assert v["evidence"]["consequence_ranks"] == [0, 2]
    assert ranks[2].failure["role"] == "consequence" and ranks[2].failure["step"] == 7


def test_sigkill_where_the_cgroup_was_unreadable_says_so():
    ranks = [rank(0, "crashed", at=5.0, exit_={"exitcode": -9, "signal": "SIGKILL"}),
             rank(1, "error", error="RuntimeError: Connection reset by peer", at=5.2, fail_step=3)]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0 and v["evidence"]["signal"] == "SIGKILL"
    assert v["evidence"]["oom_killed"] is None
    assert "an OOM kill could not be checked" in v["why"]


def test_a_killed_ranks_step_is_a_lower_bound_when_no_rank_got_further():
    """Rank 1 SIGKILLed, rank 0 then stopped by torchrun's SIGTERM: neither said goodbye, so both
    lost the steps they had not sent. Rank 0 got further: rank 1 died "around" there. When none
    got further, the step is what its telemetry reached, and called a lower bound."""
    kill = {"exitcode": -9, "signal": "SIGKILL"}
    term = {"exitcode": -15, "signal": "SIGTERM"}
    ahead = [rank(0, "crashed", at=5.2, steps=40, exit_=term), rank(1, "crashed", at=5.0, steps=34, exit_=kill)]
    v = diagnose(ahead, {}, "failed")
    assert v["evidence"]["step"] == 40 and v["evidence"]["step_at_least"] is False
    assert v["reason"].startswith("rank 1 was killed by SIGKILL around step 40")
    level = [rank(0, "crashed", at=5.2, steps=34, exit_=term), rank(1, "crashed", at=5.0, steps=34, exit_=kill)]
    v = diagnose(level, {}, "failed")
    assert v["culprit"]["rank"] == 1 and v["evidence"]["consequence_ranks"] == [0]
    assert v["evidence"]["step"] == 34 and v["evidence"]["step_at_least"] is True
    assert v["reason"].startswith("rank 1 was killed by SIGKILL after at least 34 steps")
    assert "its telemetry reached 34" in v["why"]


def test_two_independent_errors_are_not_called_consequences():
    ranks = [rank(0, "error", error="ValueError: bad label 7", at=10.0, fail_step=4),
             rank(1, "error", error="KeyError: 'mask'", at=10.3, fail_step=4)]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0
    assert "rank 1 also failed with an error of its own" in v["why"]
    assert v["evidence"]["independent_ranks"] == [1] and v["evidence"]["consequence_ranks"] == []


def test_an_interrupted_run_without_a_real_failure_has_no_failure_headline():
    ranks = [rank(0, "interrupted"), rank(1, "interrupted")]
    assert diagnose(ranks, {}, "interrupted") is None
    assert diagnose([rank(0, "clean")], {}, "completed") is None


# --- the hang report in the summary ---------------------------------------------------------------

DUMP_WAITING = '''Thread 0x00007f6a838296c0 (most recent call first):
  File "/x/traceml_core/wire/client.py", line 332 in _sleep
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f6aa31bab80 (most recent call first):
  File "/v/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/v/site-packages/torch/autograd/__init__.py", line 395 in backward
  File "<traceml wrapper of backward>", line 8 in _tm_wrapper
  File "/v/site-packages/torch/_tensor.py", line 623 in backward
  File "/home/u/train.py", line 93 in main
  File "/home/u/train.py", line 121 in <module>
'''
DUMP_SLEEPING = '''Current thread 0x00007f6aa31bab80 (most recent call first):
  File "/home/u/train.py", line 76 in main
  File "/home/u/train.py", line 121 in <module>
'''


def _hung_summary(records_after: int):
    from pathlib import Path

    from aggpeers import columns, make_settings, relayed
    from traceml_core.aggregator.autopsy import Autopsy
    from traceml_core.aggregator.state import RunState
    from traceml_core.aggregator.adapter import run_data
    from traceml_core.report.summary import build_summary

    st = RunState(make_settings(Path("/nonexistent"), nnodes=2, nproc_per_node=1))
    for rank in (0, 1):
        rs = st.rank(rank)
        rs.node, rs.host = rank, f"node{rank + 1}"
        rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": 0, "n": 40, "dropped": 0, "cols": columns(40)}))
    st.records = 80
    a = Autopsy(1, {0: (0, "node1", 40), 1: (1, "node2", 40)}, world=2, silent_s=61.0,
                threshold_s=60.0, threshold_source="auto", records_at=80)
    a.add(0, {"source": "sdk", "text": DUMP_WAITING, "in_flight": {
        "op": "ddp_bucket", "bytes": 4096, "seq": 80, "started_ns": 0, "group_size": 2}, "step": 40})
    a.add(1, {"source": "sdk", "text": DUMP_SLEEPING})
    for r in (0, 1):
        a.add(r, {"source": "relay", "gone": False, "state": "S"})
    assert a.done()
    st.hangs.append(decode(HangReport, a.report()))
    st.records += records_after
    st.finish = LaunchEnd(exit_code=124, reason="training looks hung")
    return build_summary(run_data(st))


def test_a_run_that_ended_hung_leads_with_the_hang():
    s = _hung_summary(0)
    v = s["verdict"]
    assert v["kind"] == "hang" and v["severity"] == "critical"
    assert v["culprit"] == {"rank": 1, "node": 1, "host": "node2"}
    assert "rank 1 (node 1, node2) never arrived at the collective the others wait in" in v["why"]
    assert s["run"]["reason"].startswith("hung: rank 1 (node 1, node2) never arrived")
    assert not [o for o in s["other_verdicts"] if o["kind"] == "run_failed"]
    r0 = next(a for a in s["hang"]["ranks"] if a["rank"] == 0)
    assert r0["collective"] == "ddp_bucket" and r0["where"] == "train.py:93 in main"
    from traceml_core.report.render_txt import render
    txt = render(s)
    assert "Hang report: no rank completed a step for 61 s" in txt and "<- never arrived" in txt


def test_a_stall_that_resolved_is_a_warning_not_the_headline():
    s = _hung_summary(10)
    assert s["verdict"]["kind"] != "hang" and s["hang"]["resumed"] is True
    also = [o for o in s["other_verdicts"] if o["kind"] == "hang"]
    assert also and also[0]["severity"] == "warning" and "then went on" in also[0]["why"]


def test_a_killed_torchrun_or_a_vanished_launcher_is_the_first_failure_unless_a_rank_failed_before():
    """Issue 27, finding 5 (end to end in tests/slurm/test_headline_slurm.py): node 1's torchrun
    killed by SIGKILL (its node report says so) is named before the gloo errors it caused on node
    0, even those seen earlier by the clock; its own ranks, without evidence, died with it. A
    vanished launcher reads the same way. A rank that raised by itself before the node failed
    stays the first failure."""
    from traceml_core.report.status import node_failures
    from traceml_core.rundata import LaunchEnd, NodeData, TorchrunEnd

    gloo = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection reset by peer"

    def ranks():
        return [rank(0, "error", error=gloo, tb=gloo, at=100.1, fail_step=40),
                rank(1, "error", error=gloo, tb=gloo, at=100.2, fail_step=40),
                rank(2, "vanished", node=1, at=101.0, steps=38), rank(3, "vanished", node=1, at=101.0, steps=38)]

    killed = {0: NodeData(0, "n0"), 1: NodeData(1, "n1", bye=LaunchEnd("error", 137, 103.0, torchrun=TorchrunEnd(
        -9, "SIGKILL", 100.0)))}
    nodes = node_failures(killed, LaunchEnd(exit_code=1, torchrun=TorchrunEnd(1, None, 104.0)))
    assert [(n.node, n.cause, n.signal, n.exit_code) for n in nodes] == [(1, "torchrun_killed", "SIGKILL", 137)]
    rs = ranks()
    v = diagnose(rs, {}, "failed", nodes)
    assert v["culprit"] == {"rank": None, "node": 1, "host": "n1"}, v
    assert v["why"].startswith("node 1 (n1): torchrun was killed by SIGKILL (its launcher exited with exit "
                               "code 137), around step 40; its ranks 2-3 ended with it; ranks 0-1 failed "
                               "as a consequence"), v["why"]
    assert v["reason"] == "node 1's torchrun was killed by SIGKILL (exit code 137)"
    assert v["evidence"]["consequence_ranks"] == [0, 1, 2, 3]
    assert [r.failure["role"] for r in rs] == ["consequence"] * 4

    lost = {0: NodeData(0, "n0"), 1: NodeData(1, "n1", left_at=100.0)}
    v = diagnose(ranks(), {}, "failed", node_failures(lost, None))
    assert v["why"].startswith("node 1 (n1): its TraceML launcher vanished"), v["why"]
    # a torchrun stopped by its launcher's own SIGTERM is no node failure
    stopped = {1: NodeData(1, bye=LaunchEnd("interrupted", 143, torchrun=TorchrunEnd(-15, "SIGTERM")))}
    assert node_failures(stopped, None) == []

    first = [rank(2, "error", node=1, error="ValueError: bad label 7", tb=TB, at=99.0, fail_step=38)] + ranks()[:2]
    v = diagnose(first, {}, "failed", nodes)
    assert v["culprit"]["rank"] == 2 and v["evidence"]["exception_type"] == "ValueError", v
