"""Failure causality (issue 31, item 6), in-process: which rank is named first, what a collective
library's line means, where an error was raised, and what the performance verdicts may read of a
run that failed. The texts are what real runs wrote (2 gloo ranks under ``traceml run``, torch
2.13): rank 1's traceback after its peer ended cleanly, rank 0's stderr when gloo aborted it on
a collective mismatch, an argparse exit. End to end: tests/faults/test_failure_runs.py.
"""

from __future__ import annotations

from pathlib import Path

from traceml_core.report.failure import diagnose, did_not_start
from traceml_core.report.model import ExitRecord, RankSummary
from traceml_core.report.stderr import library_message, script_message
from traceml_core.report.tracebacks import consequence_of, raised_where
from traceml_core.codec import decode
from traceml_core.rundata import RankEvent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"

#: rank 1's traceback after rank 0 ran out of data at step 150 and ended cleanly (a real run)
LOST_PEER_TB = '''Traceback (most recent call last):
  File "/tmp/r/early_exit.py", line 25, in <module>
    main()
  File "/tmp/r/early_exit.py", line 20, in main
    loss.backward()
  File "/v/lib/python3.11/site-packages/torch/_tensor.py", line 623, in backward
    torch.autograd.backward(
  File "<traceml wrapper of backward>", line 14, in _tm_wrapper
  File "/v/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395, in backward
    _engine_run_backward(
  File "/v/lib/python3.11/site-packages/torch/autograd/graph.py", line 979, in _engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:43438. This is typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f
'''
LOST_PEER = LOST_PEER_TB.strip().splitlines()[-1]
#: rank 0's stderr when gloo aborted it: it called one all_reduce the other rank did not (a real run)
MISMATCH_STDERR = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                   "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                   "pair.cc:456] op.preamble.length <= op.nbytes. 2180 vs 4. Received data size doesn't match "
                   "expected size. Is there a distributed collective mismatch in your code?")
GLOO_MISMATCH = "Is there a distributed collective mismatch in your code?"
#: NCCL's watchdog (torch 2.x) and MPI, as they print
NCCL_TIMEOUT = ("[rank0]:[E1207 13:32:28.511000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=2180, NumelOut=2180, "
                "Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n"
                "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618\n"
                "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57")
MPI_TRUNCATE = ("[node1:12345] *** An error occurred in MPI_Allreduce\n"
                "[node1:12345] *** MPI_ERR_TRUNCATE: message truncated\n"
                "[node1:12345] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort)")
ARGPARSE = ("usage: train.py [-h] [--steps STEPS]\n"
            "train.py: error: unrecognized arguments: --stpes 3")


def rank(r, status, *, error=None, tb=None, fail_step=None, in_step=False, steps=10, produced=None,
         at=None, ended=None, exit_=None):
    return RankSummary(rank=r, node=0, host="n0", local_rank=r, status=status, error=error, steps=steps,
                       steps_produced=produced if produced is not None else (None if status == "crashed" else steps),
                       fail_step=fail_step, fail_in_step=in_step, failed_at=at,
                       ended_at=ended if ended is not None else at,
                       exit=ExitRecord(**exit_) if exit_ else None,
                       last_events=[RankEvent("exception", tb, at)] if tb else [])


# --- where an error was raised ------------------------------------------------------------------
def test_traceml_wrapper_frames_are_never_where_an_error_was_raised():
    # (before: "<traceml wrapper of backward>:14 in _tm_wrapper", the innermost frame not in a library)
    assert raised_where(LOST_PEER_TB) == "early_exit.py:20 in main"
    only_ours = '  File "<traceml wrapper of backward>", line 14, in _tm_wrapper\n'
    assert raised_where(only_ours) is None
    inside = ('  File "/v/site-packages/torch/optim/sgd.py", line 80, in step\n'
              '  File "/v/site-packages/traceml_core/sdk/hooks.py", line 12, in wrapped\n')
    assert raised_where(inside) == "sgd.py:80 in step"


# --- what a collective library's line means -------------------------------------------------------
def test_the_libraries_own_sentences_are_read_with_their_kind():
    m = library_message(MISMATCH_STDERR)
    assert (m.library, m.kind) == ("gloo", "mismatch") and m.text.endswith(GLOO_MISMATCH), m
    assert "/__w/" not in m.text and "terminate called" not in m.text and "what()" not in m.text
    closed = library_message(LOST_PEER_TB)
    assert (closed.library, closed.kind) == ("gloo", "closed") and closed.is_consequence
    assert "GLHF" not in closed.text and closed.text.startswith("Connection closed by peer")
    t = library_message(NCCL_TIMEOUT)
    assert (t.library, t.kind) == ("NCCL", "timeout") and "Watchdog caught collective operation timeout" in t.text
    mpi = library_message(MPI_TRUNCATE)
    assert (mpi.library, mpi.kind) == ("MPI", "mismatch") and "MPI_ERR_TRUNCATE" in mpi.text
    assert library_message(ARGPARSE) is None and library_message("") is None
    # a library's warnings and notes are no failure (each real, from torch 2.13's logs)
    chatter = ("[W1207 13:57:39.307840119 socket.cpp:207] [c10d] The hostname of the client socket cannot "
               "be retrieved. err=-3\n"
               "[rank0]:[W1207 ProcessGroupNCCL.cpp:1234] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default\n"
               "node1:123:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n")
    assert library_message(chatter) is None
    # a mismatch is the ranks' own doing, never a lost peer, whatever error type carries it
    assert consequence_of("torch.distributed.DistBackendError: " + MISMATCH_STDERR.splitlines()[-1]) is None
    assert consequence_of(LOST_PEER) == "gloo lost the connection to a peer"


def test_the_scripts_last_words_are_its_error_line():
    assert script_message(ARGPARSE) == "train.py: error: unrecognized arguments: --stpes 3"
    noisy = ARGPARSE + "\n[W1207 13:33:53.289 ProcessGroupGloo.cpp:12] Warning: something\n\n"
    assert script_message(noisy) == "train.py: error: unrecognized arguments: --stpes 3"
    assert script_message("loading config\nconfig.yaml not found") == "config.yaml not found"
    assert script_message(None) is None


# --- who is named first ---------------------------------------------------------------------------
def test_a_rank_that_finished_cleanly_while_another_trained_is_named_first():
    """Rank 0 ran out of data after 150 steps and said a clean goodbye; rank 1 then lost its peer
    in step 150. (Before: "fix the error on rank 1 ... check the node and network", rank 0 never
    named.)"""
    ranks = [rank(0, "clean", steps=150, ended=100.0),
             rank(1, "error", error=LOST_PEER, tb=LOST_PEER_TB, fail_step=150, in_step=True, steps=150, at=100.4)]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0 and v["evidence"]["cause"] == "left_early", v
    assert v["why"].startswith("rank 0 (node 0, n0) finished cleanly after 150 steps while rank 1 was still "
                               "training; its error followed: rank 1 (node 0, n0) raised RuntimeError in step "
                               "150, at early_exit.py:20 in main: Connection closed by peer"), v["why"]
    assert v["reason"] == ("rank 0 finished after 150 steps while rank 1 was still training; "
                           "rank 1's error followed")
    assert "check the node and network" not in v["why"] and "same number of steps" in v["next_step"]
    assert v["evidence"]["consequence_ranks"] == [1] and ranks[1].failure["role"] == "consequence"
    # gloo aborting rank 1 from native code instead (SIGABRT, its stderr saying the peer is gone)
    abort = {"exitcode": -6, "signal": "SIGABRT", "stderr": LOST_PEER}
    ranks = [rank(0, "clean", steps=150, ended=100.0), rank(1, "crashed", steps=148, at=100.4, exit_=abort)]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0 and v["evidence"]["cause"] == "left_early", v


def test_controls_a_clean_rank_is_not_named_when_it_did_not_leave_first():
    # rank 0 finished after the failure: rank 1's own error is the failure
    own = [rank(0, "clean", steps=150, ended=101.0),
           rank(1, "error", error=LOST_PEER, tb=LOST_PEER_TB, fail_step=150, in_step=True, steps=150, at=100.4)]
    assert diagnose(own, {}, "failed")["culprit"]["rank"] == 1
    # rank 1 raised an error of its own after rank 0 left: its own error stays first
    bad = [rank(0, "clean", steps=150, ended=100.0),
           rank(1, "error", error="ValueError: bad label 7", fail_step=150, in_step=True, steps=150, at=100.4)]
    v = diagnose(bad, {}, "failed")
    assert v["culprit"]["rank"] == 1 and v["evidence"]["exception_type"] == "ValueError", v
    # rank 1 crashed in its teardown after every step (a segfault at exit): rank 0 did not leave early
    late = [rank(0, "clean", steps=150, ended=100.0),
            rank(1, "crashed", steps=150, at=100.4, exit_={"exitcode": -11, "signal": "SIGSEGV"})]
    v = diagnose(late, {}, "failed")
    assert v["culprit"]["rank"] == 1 and v["evidence"]["cause"] == "signal", v


def test_a_collective_mismatch_is_named_with_the_librarys_words():
    """Rank 0 called one all_reduce more; gloo aborted it (SIGABRT) and rank 1 lost its peer.
    (Before: "killed by SIGABRT ... a segfault in an extension leaves no Python traceback".)"""
    ranks = [rank(0, "crashed", steps=1, at=100.0,
                  exit_={"exitcode": -6, "signal": "SIGABRT", "stderr": MISMATCH_STDERR}),
             rank(1, "error", error=LOST_PEER, tb=LOST_PEER_TB, fail_step=41, in_step=True, steps=41, at=100.2)]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0 and v["evidence"]["cause"] == "collective_mismatch", v
    assert GLOO_MISMATCH in v["why"] and "gloo reported a collective mismatch" in v["why"]
    assert GLOO_MISMATCH in v["reason"]
    assert "segfault" not in v["next_step"] and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in v["next_step"]
    assert v["evidence"]["library"] == {"library": "gloo", "kind": "mismatch",
                                        "text": library_message(MISMATCH_STDERR).text}
    assert v["evidence"]["consequence_ranks"] == [1]
    # a rank gloo aborted because its peer was gone is a consequence of the rank that failed
    ranks = [rank(0, "error", error="ValueError: bad label 7", fail_step=9, steps=9, at=99.0),
             rank(1, "crashed", steps=9, at=99.3, exit_={"exitcode": -6, "signal": "SIGABRT", "stderr": LOST_PEER})]
    v = diagnose(ranks, {}, "failed")
    assert v["culprit"]["rank"] == 0 and v["evidence"]["consequence_ranks"] == [1], v


def test_an_argparse_exit_before_the_first_step_did_not_start_with_the_scripts_words():
    """(Before: KeyError 'step_words', and a PARTIAL summary.)"""
    exit_ = {"exitcode": 2, "signal": None, "stderr": ARGPARSE}
    ranks = [rank(r, "error", error="sys.exit(2)", fail_step=0, steps=0, at=50.0 + r, exit_=exit_) for r in (0, 1)]
    found = diagnose(ranks, {}, "failed")
    v = did_not_start(ranks, found)
    assert v is not None and v["kind"] == "did_not_start", v
    assert v["why"] == ('no rank reached its first step: rank 0 (node 0, n0) exited with sys.exit(2) after '
                        'printing "train.py: error: unrecognized arguments: --stpes 3"; the other rank '
                        'failed the same way'), v["why"]
    assert v["reason"].startswith("did not start: rank 0 exited with sys.exit(2) after printing")
    assert "step" not in v["reason"].replace("first step", "")


# --- what the performance verdicts read of a failed run ----------------------------------------
def _summary(name: str) -> dict:
    from traceml_core.report.summary import build_summary
    from traceml_core.rundata import RunData
    from traceml_core.rundir import load_checkpoint

    return build_summary(decode(RunData, load_checkpoint(FIXTURES / name)["state"]))


def test_a_failure_does_not_become_the_input_verdicts_cpu_evidence():
    """Two real runs of tests/fixtures/failures/loader_cpu.py (each rank's one DataLoader worker
    computes its samples; 2 ranks on a loaded 2-core machine): the control trains 100 steps, the
    other's rank 1 raises in its worker at step 50. The control's input verdict says the worker
    computes (0.8 CPUs). In the failed run each rank's CPU figures were last taken as it shut down
    after the failure, over a span that includes the failure's stall (the rank waiting for its dead
    peer, exiting): read as the run's, they said the worker used 0.1 CPUs and blamed "storage, the
    network, a lock or a sleep". Only what was measured before the failure is read."""
    control = _summary("loader_ok.state")
    inp = next(v for v in [control["verdict"]] + control["other_verdicts"] if v["kind"] == "input_bound")
    assert inp["evidence"]["cpu"] and inp["evidence"]["cpu"]["workers_cores"] >= 0.5, inp["evidence"]
    failed = _summary("loader_raises.state")
    assert failed["verdict"]["kind"] == "run_failed" and failed["verdict"]["culprit"]["rank"] == 1
    for v in failed["other_verdicts"]:
        assert "storage, the network" not in v["why"], v["why"]
        if v["kind"] == "input_bound":
            assert v["evidence"]["cpu"] is None, v["evidence"]   # not measured, never a wrong figure


def test_recorded_runs_read_whole_and_blame_no_host():
    """Whole summaries of two recorded real runs (tests/fixtures/failures: early_exit.py, rank 0
    out of data after 150 steps; mismatch.py, rank 0's extra all_reduce at step 40, with its
    stderr as `traceml run` kept it): the headline, and no evidence against the host in the node
    store (a collective mismatch and a rank that finished early follow the script, not the node)."""
    from traceml_core.report.document import read
    from traceml_core.report.nodeevidence import run_evidence

    left = _summary("left_early.state")
    v = left["verdict"]
    assert v["evidence"]["cause"] == "left_early" and v["culprit"]["rank"] == 0, v
    assert v["evidence"]["where"] == "early_exit.py:20 in main", v["evidence"]
    mism = _summary("mismatch.state")
    v = mism["verdict"]
    assert v["evidence"]["cause"] == "collective_mismatch" and GLOO_MISMATCH in v["why"], v
    for s in (left, mism):
        failures = [o for o in run_evidence(read(s)).observations if o.kind == "failure"]
        assert failures == [], failures
