"""The goodput ledger over typed run data: each bucket against the run's own timeline, exact sums,
redone work across attempts (exact with the script's global step, inferred without), buckets that
were not measured, the advice, and one run directory across attempts.

The ranks' records go through the aggregator's own rank state (the statistics and per-step series
the summary reads), from a timeline written out here step by step, so every bucket has a truth
to match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aggpeers import relayed

from traceml_core.aggregator.rankstate import RankState
from traceml_core.codec import encode
from traceml_core.attempts import archive_previous, attempt_dirs
from traceml_core.report.goodput.account import Context, account
from traceml_core.report.goodput.advice import ADVICE_MIN_FRACTION, assemble
from traceml_core.report.goodput.buckets import KEYS
from traceml_core.report.goodput.ledger import AttemptLedger, Progress
from traceml_core.report.goodput.previous import previous_attempts
from traceml_core.aggregator.adapter import rank_data as typed_rank
from traceml_core.rundata import LaunchEnd, LaunchLifecycle, NodeData, RankBye, RunData, RunSettings
from traceml_core.wire.protocol import STEP_COLUMNS

T0 = 1_800_000_000.0  # the allocation's start
NS = 1_000_000_000


class Row:
    """One rank's ending as the summary's rank rows give it (status, failed_at)."""

    def __init__(self, rank, status="clean", failed_at=None):
        self.rank, self.status, self.failed_at = rank, status, failed_at


def rank_data(rank, node, steps, *, gstep0=None, checkpoints=(), compute_ms=80.0, input_ms=10.0,
              comm_ms=5.0, no_phase_ms=5.0, facts=True):
    """A rank that ran ``steps`` (a list of step start times): each step is input, forward
    (``compute_ms``), exposed communication and time in no phase; ``checkpoints``: (end, dur_s,
    step) saves between steps; ``gstep0``: the script's global step of the first step;
    ``facts=False``: workers that report no progress marks or spans (step records only)."""
    rs = RankState(rank)
    rs.node = node
    cols = {c: [] for c in STEP_COLUMNS}
    step_ms = compute_ms + input_ms + comm_ms + no_phase_ms
    for i, start in enumerate(steps):
        row = {c: -1 for c in STEP_COLUMNS}
        row.update(step=i, t_end_ns=int((start + step_ms / 1e3) * NS), step_ns=int(step_ms * 1e6),
                   input_ns=int(input_ms * 1e6), forward_ns=int(compute_ms * 1e6), backward_ns=0,
                   optimizer_ns=0, comm_ns=int(comm_ms * 1e6))
        if comm_ms >= 0:
            row.update(comm_busy_ns=int(comm_ms * 1e6), comm_bytes=100, comm_bus_bytes=100, comm_calls=1)
        for c in STEP_COLUMNS:
            cols[c].append(row[c])
    if steps:   # through a relay's window, as node 0 takes them in
        rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": 0, "n": len(steps), "cols": cols, "dropped": 0}))
    if steps and facts:
        rs.facts.apply("progress", {"step": 0, "gstep": gstep0, "start": steps[0], "end": steps[0] + step_ms / 1e3})
        if gstep0 is not None:
            rs.facts.apply("progress", {"step": len(steps) - 1, "gstep": gstep0 + len(steps) - 1,
                                        "start": steps[-1], "end": steps[-1] + step_ms / 1e3})
    for end, dur, step in checkpoints:
        rs.facts.apply("span", {"span": "checkpoint", "dur_ns": int(dur * NS), "end": end, "step": step,
                                "gstep": None if gstep0 is None else gstep0 + step - 1, "in_step": False,
                                "api": "torch.save"})
    rs.bye = RankBye("clean", len(steps))
    return typed_rank(rs)


def run_data(ranks, *, end, nnodes=2, nproc=1, job="17", restarts=0):
    settings = RunSettings("rq", nnodes, nproc, T0 + 2.0, job_id=job, public={"run_id": f"id{restarts}"})
    nodes = [NodeData(n, f"node{n + 1}", T0 + 3, "node",
                      lifecycle=LaunchLifecycle({"preflight": T0 + 1.0}, None, T0, restarts))
             for n in range(nnodes)]
    return RunData(settings, T0 + 2.0, ranks=ranks, nodes=nodes,
                   finish=LaunchEnd(exit_code=0, at=end, source="launcher"))


def ctx(data, end, status="completed", reason="", rows=None):
    rows = rows or [Row(r.rank) for r in data.ranks]
    return Context(rows=rows, status=status, reason=reason, ended=end, device="cpu")


def every_split_sums(ledger):
    for a in ledger.attempts:
        assert a.split.total_ms == sum(v for v in a.split.ms.values() if v is not None)
        assert a.split.total_ms == sum(n.split.total_ms for n in a.nodes)
        for n in a.nodes:
            assert n.split.total_ms == sum(v for v in n.split.ms.values() if v is not None), n
    assert ledger.total.total_ms == sum(a.split.total_ms for a in ledger.attempts)
    assert ledger.total.total_ms == sum(v for v in ledger.total.ms.values() if v is not None)


def test_one_attempt_each_bucket_matches_the_timeline_and_sums_exactly():
    # 2 ranks: start-up 10 s, 100 steps of 100 ms every 120 ms (20 ms between), a 2 s checkpoint
    # after step 50 (the gap after it is 2.02 s), the last step ends; 5 s of tail
    starts, t = [], T0 + 10.0
    for i in range(100):
        starts.append(t)
        t += 0.1 + (2.02 if i == 49 else 0.02)
    last_end = starts[-1] + 0.1
    end = last_end + 5.0
    ck = [(starts[49] + 0.1 + 2.01, 2.0, 50)]
    data = run_data([rank_data(0, 0, starts, checkpoints=ck), rank_data(1, 1, starts)], end=end)
    ledger = assemble(account(data, ctx(data, end), attempt=0, previous=[]), [], data, "cpu")
    every_split_sums(ledger)
    a = ledger.attempts[0]
    wall = end - T0
    assert a.split.total_ms == round(wall * 1000) * 2
    b = {k: (v or 0) / 1000 for k, v in a.split.ms.items()}
    assert b["startup"] == pytest.approx(2 * 10.0, abs=0.01)
    assert b["productive"] == pytest.approx(2 * 100 * 0.080, abs=0.01)
    assert b["input"] == pytest.approx(2 * 100 * 0.010, abs=0.01)
    assert b["comm"] + b["straggler"] == pytest.approx(2 * 100 * 0.005, abs=0.01)
    assert b["no_phase"] == pytest.approx(2 * 100 * 0.005, abs=0.01)
    # rank 0 saved for 2 s; rank 1 waited for it (there: between-step time, as it has no comm to
    # wait in beyond its own): both are checkpointing
    assert b["checkpoint"] == pytest.approx(2 * 2.0, abs=0.02)
    assert b["between"] == pytest.approx(2 * (99 * 0.02 + 0.02), abs=0.05)
    assert b["tail"] == pytest.approx(2 * 5.0, abs=0.01)
    assert b["redone"] == 0 and b["after_failure"] == 0 and b["hang"] == 0
    assert a.progress.checkpoints == 1 and a.progress.source == "inferred"
    assert a.progress.unsaved_s == pytest.approx(last_end - ck[0][0], abs=0.01)
    assert [n.slots for n in a.nodes] == [1, 1]
    # a clean run whose badput is start-up and tail: the advice speaks of the larger, with its figure
    assert ledger.advice is not None and ledger.advice.bucket == "startup"
    assert "20.0 rank-seconds" in ledger.advice.why and "10.0 s per attempt" in ledger.advice.why


def _long_after_checkpoint(status: str, reason: str):
    """2 ranks: 5 s of start-up, 300 steps of 100 ms, a checkpoint after step 40, 3 s of tail:
    26 s of training per rank after the checkpoint."""
    starts = [T0 + 5.0 + 0.1 * i + (0.06 if i >= 40 else 0.0) for i in range(300)]
    last_end = starts[-1] + 0.1
    ck = [(starts[39] + 0.1 + 0.055, 0.05, 40)]   # in the 60 ms between steps 39 and 40
    end = last_end + 3.0
    data = run_data([rank_data(0, 0, starts, checkpoints=ck), rank_data(1, 1, starts, checkpoints=ck)], end=end)
    return assemble(account(data, ctx(data, end, status=status, reason=reason), attempt=0, previous=[]), [],
                    data, "cpu")


def test_training_lost_to_the_time_limit_is_the_advice_when_it_outweighs_every_bucket():
    """The issue's own example: the time limit took the work since the last checkpoint, which a
    resumed run redoes; it outweighs start-up (10 rank-seconds) and names the save that keeps it."""
    ledger = _long_after_checkpoint("interrupted", "the job reached its time limit (SLURM_JOB_END_TIME)")
    every_split_sums(ledger)
    a = ledger.attempts[0]
    assert a.ended == "time_limit" and a.progress.unsaved_s == pytest.approx(26.0, abs=0.05)
    adv = ledger.advice
    assert adv is not None and adv.bucket == "unsaved", adv
    assert adv.seconds == pytest.approx(2 * 26.0, abs=0.1)
    assert "the last 26.0 s of training before the time limit, since the checkpoint after step 39, were not saved" \
        in adv.why and "26.0 s x 2 ranks" in adv.why
    assert "--signal=USR1@600" in adv.next_step
    from traceml_core.report.goodput.render import render_ledger
    assert "advice: TRAINING NOT SAVED:" in "\n".join(render_ledger(ledger))


def test_the_same_training_completed_or_cancelled_gets_no_advice_to_save_it():
    """The controls: a run that completed lost nothing; one the user cancelled was their choice."""
    for status, reason in (("completed", ""), ("interrupted", "the job was cancelled (scancel)")):
        ledger = _long_after_checkpoint(status, reason)
        assert ledger.advice is None or ledger.advice.bucket != "unsaved", (status, ledger.advice)


def test_no_advice_below_its_threshold():
    starts = [T0 + 0.2 + 0.1 * i for i in range(1000)]
    end = starts[-1] + 0.1 + 0.2
    data = run_data([rank_data(0, 0, starts, input_ms=0.0, comm_ms=0.0, no_phase_ms=0.0, compute_ms=100.0)],
                    end=end, nnodes=1)
    ledger = assemble(account(data, ctx(data, end), attempt=0, previous=[]), [], data, "cpu")
    every_split_sums(ledger)
    assert ledger.total.fraction("productive") > 1 - ADVICE_MIN_FRACTION
    assert ledger.advice is None


def _requeued_pair(gstep):
    """Attempt 0: 51 steps (0..50), checkpoint after step 39 (40 steps done), requeued 3 s after
    its last step; attempt 1 resumes at step 40 and runs 40 steps (40..79): 11 redone."""
    s0 = [T0 + 10.0 + 0.12 * i for i in range(51)]
    ck0 = [(s0[39] + 0.1 + 0.5, 0.5, 40)]
    s0 = s0[:40] + [s + 0.5 for s in s0[40:]]
    end0 = s0[-1] + 0.1 + 3.0
    d0 = run_data([rank_data(r, r, s0, gstep0=0 if gstep else None, checkpoints=ck0) for r in (0, 1)],
                  end=end0)
    c0 = ctx(d0, end0, status="interrupted", reason="interrupted by SIGTERM: the job was requeued (...)")
    a0 = account(d0, c0, attempt=0, previous=[])
    t1 = end0 + 20.0
    s1 = [t1 + 8.0 + 0.12 * i for i in range(40)]
    end1 = s1[-1] + 0.1 + 2.0
    d1 = run_data([rank_data(r, r, s1, gstep0=40 if gstep else None) for r in (0, 1)], end=end1, restarts=1)
    d1.nodes[0].lifecycle.allocation_start = t1
    d1.nodes[1].lifecycle.allocation_start = t1
    a1 = account(d1, ctx(d1, end1), attempt=1, previous=[a0])
    return assemble(a1, [a0], d1, "cpu"), s1


@pytest.mark.parametrize("gstep", [True, False], ids=["step-given", "inferred"])
def test_a_requeue_redoes_the_steps_after_the_last_checkpoint(gstep):
    ledger, s1 = _requeued_pair(gstep)
    every_split_sums(ledger)
    a0, a1 = ledger.attempts
    assert a0.ended == "requeued" and a1.ended == "completed"
    assert a1.queued_before_s == pytest.approx(20.0, abs=0.01)
    assert ledger.queued_s == pytest.approx(20.0, abs=0.01)
    assert a0.progress.end_position == 51 and a0.progress.checkpoint_position == 40
    assert a1.progress.first_position == 40 and a1.progress.redone_steps == 11
    assert a1.progress.exact is gstep
    # the truth: from attempt 1's first step to the end of its 11th step, per rank
    truth = (s1[10] + 0.1) - s1[0]
    assert (a1.split.ms["redone"] or 0) / 1000 == pytest.approx(2 * truth, abs=0.01)
    assert (a0.split.ms["redone"] or 0) == 0
    assert ("redone" in a1.notes) is (not gstep)  # inferred says so, and how to make it exact
    assert ledger.advice is not None
    big = max((v, k) for k, v in ledger.total.ms.items() if v and k != "productive")[1]
    assert ledger.advice.bucket == big
    # attempt 0 trained 11 steps (and their gaps) after its last checkpoint: what attempt 1 redid
    assert a0.progress.unsaved_s == pytest.approx(11 * 0.12, abs=0.01)


def test_a_bucket_that_was_not_measured_is_null_with_how_to_measure_it():
    starts = [T0 + 1 + 0.1 * i for i in range(20)]
    end = starts[-1] + 1
    data = run_data([rank_data(0, 0, starts, input_ms=-1e-6, comm_ms=-1e-6)], end=end, nnodes=1)
    ledger = assemble(account(data, ctx(data, end), attempt=0, previous=[]), [], data, "cpu")
    every_split_sums(ledger)
    a = ledger.attempts[0]
    assert a.split.ms["input"] is None and a.split.ms["comm"] is None and a.split.ms["straggler"] is None
    assert "wrap_dataloader" in a.not_measured["input"]
    assert a.nodes[0].split.ms["input"] is None
    doc = encode(ledger)
    assert doc["total"]["buckets"]["input"] is None
    assert set(doc["total"]["buckets"]) == set(KEYS)


def test_after_a_failure_every_rank_counts_the_rest_of_the_attempt():
    starts = [T0 + 5 + 0.1 * i for i in range(30)]
    fail = starts[-1] + 0.1 + 1.0
    end = fail + 12.0
    data = run_data([rank_data(0, 0, starts), rank_data(1, 1, starts)], end=end)
    rows = [Row(0, "error", failed_at=fail), Row(1, "vanished")]
    ledger = assemble(account(data, ctx(data, end, status="failed", rows=rows), attempt=0, previous=[]), [], data, "cpu")
    every_split_sums(ledger)
    a = ledger.attempts[0]
    assert a.ended == "failed"
    assert a.split.ms["after_failure"] / 1000 == pytest.approx(2 * 12.0, abs=0.01)
    assert a.split.ms["tail"] / 1000 == pytest.approx(2 * 1.0, abs=0.01)
    assert ledger.advice.bucket == "after_failure"


def test_a_rank_that_never_stepped_is_all_start_up_or_after_the_failure():
    starts = [T0 + 5 + 0.1 * i for i in range(30)]
    end = starts[-1] + 2.0
    data = run_data([rank_data(0, 0, starts)], end=end)   # rank 1 never joined
    ledger = assemble(account(data, ctx(data, end), attempt=0, previous=[]), [], data, "cpu")
    every_split_sums(ledger)
    node1 = ledger.attempts[0].nodes[1]
    assert node1.split.ms["startup"] == node1.split.total_ms == round((end - T0) * 1000)


def test_the_earlier_attempts_files_move_aside_and_are_read_back(tmp_path):
    run = tmp_path / "rq-17"
    run.mkdir()
    row = AttemptLedger(attempt=0, job_id="17", run_id="first", start=T0, end=T0 + 50, slots=2,
                        ended="interrupted", progress=Progress("step", 51, 0, 51, 40, 1))
    doc = {"goodput": {"attempts": [encode(row)]}}
    (run / "final_summary.json").write_text(json.dumps(doc))
    (run / "final_summary.txt").write_text("attempt 0\n")
    (run / "steps.jsonl").write_text("")
    assert archive_previous(run, "first") is None          # its own files: a restarted aggregator
    note = archive_previous(run, "second")
    assert note and "attempt-0" in note
    assert [n for n, _ in attempt_dirs(run)] == [0]
    assert not (run / "final_summary.json").exists() and (run / "attempt-0" / "steps.jsonl").exists()
    prev = previous_attempts(run)
    assert len(prev) == 1 and prev[0].run_id == "first" and prev[0].progress.end_position == 51
    assert prev[0].summary == str(run / "attempt-0" / "final_summary.json")
    assert archive_previous(run, "second") is None          # nothing at the top any more
    # a third attempt after the second wrote its files: attempt-1
    (run / "final_summary.json").write_text(json.dumps({"goodput": {"attempts": [
        encode(row), {**encode(row), "attempt": 1, "run_id": "second"}]}}))
    assert "attempt-1" in (archive_previous(run, "third") or "")
    assert [a.run_id for a in previous_attempts(run)] == ["first", "second"]


def test_an_attempt_without_a_summary_is_rebuilt_from_its_checkpoint(tmp_path):
    run = tmp_path / "rq"
    (run / "attempt-0").mkdir(parents=True)
    (run / "attempt-0" / "aggregate.state").write_bytes(b"x")
    calls = []

    def rebuild(path: Path):
        calls.append(path)
        return AttemptLedger(attempt=0, run_id="dead")  # the row its rebuilt summary holds

    prev = previous_attempts(run, rebuild=rebuild)
    assert calls == [run / "attempt-0" / "aggregate.state"]
    assert prev[0].run_id == "dead" and prev[0].rebuilt


def test_rank_facts_are_checked_where_they_enter():
    from traceml_core.wire.frames import check_event

    def fact(kind, payload):
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return check_event({"t": "event", "rank": 0, "kind": kind, "text": text, "ts": None})["fact"]

    good = {"span": "checkpoint", "dur_ns": 5, "end": T0, "step": 3, "gstep": 7, "in_step": False, "api": "torch.save"}
    assert fact("span", good) == good
    assert fact("span", {**good, "span": "evaluation"}) is None           # one span kind
    assert fact("span", {**good, "end": 2.0**40}) is None                 # a time past its bound
    assert fact("span", {**good, "dur_ns": -1}) is None
    assert fact("span", {**good, "step": -3, "gstep": "x"})["step"] is None  # a bad field: not measured
    assert fact("progress", {"step": 0, "gstep": 40, "start": T0, "end": float("nan")})["end"] is None
    assert fact("progress", {"gstep": 40}) is None
    assert fact("work", {"tokens_per_step": 1e30, "dtype": "bf16"}) == {
        "tokens_per_step": None, "samples_per_step": None, "flops_per_step": None, "dtype": "bf16", "device": None}
    assert fact("progress", "not json") is None and fact("span", "[1, 2]") is None


def test_without_the_workers_facts_checkpoints_and_redone_work_are_not_measured():
    """Workers that send step records only: a requeued job's checkpoints and redone steps cannot be
    told apart from other work, so both buckets are null with why (never 0) and every split still
    sums exactly; the saves' time is in between-step work."""
    s0 = [T0 + 10.0 + 0.12 * i for i in range(51)]
    s0 = s0[:40] + [s + 0.5 for s in s0[40:]]          # a 0.5 s save after step 39, unseen
    end0 = s0[-1] + 0.1 + 3.0
    d0 = run_data([rank_data(r, r, s0, facts=False) for r in (0, 1)], end=end0)
    # its summary rebuilt from its checkpoint (its node 0 killed before it wrote one): no reason
    a0 = account(d0, ctx(d0, end0, status="unknown", reason=""), attempt=0, previous=[])
    t1 = end0 + 20.0
    s1 = [t1 + 8.0 + 0.12 * i for i in range(40)]
    end1 = s1[-1] + 0.1 + 2.0
    d1 = run_data([rank_data(r, r, s1, facts=False) for r in (0, 1)], end=end1, restarts=1)
    for n in d1.nodes:
        n.lifecycle.allocation_start = t1
    a1 = account(d1, ctx(d1, end1), attempt=1, previous=[a0])
    ledger = assemble(a1, [a0], d1, "cpu")
    every_split_sums(ledger)
    a0, a1 = ledger.attempts
    for a in (a0, a1):
        assert a.split.ms["checkpoint"] is None and "does not time torch.save" in a.not_measured["checkpoint"]
    assert a0.split.ms["redone"] == 0 and a0.progress.first_position == 0     # the first attempt starts at 0
    assert a0.ended == "requeued" and "requeued: restart 1 of job 17 followed it" in a0.reason
    assert a1.split.ms["redone"] is None and a1.progress.redone_steps is None
    assert a1.progress.source == "unknown" and "where this attempt resumed is not known" in a1.not_measured["redone"]
    assert ledger.total.ms["checkpoint"] is None and ledger.total.ms["redone"] is None   # not a silent 0
    # the unseen save is between-step work of attempt 0: 0.5 s more than the 20 ms gaps, per rank
    assert a0.split.ms["between"] / 1000 == pytest.approx(2 * (50 * 0.02 + 0.5), abs=0.02)
    doc = encode(ledger)
    assert doc["attempts"][1]["buckets"]["redone"] is None and doc["attempts"][1]["progress"]["redone_steps"] is None
    assert ledger.advice is None or ledger.advice.bucket not in ("redone", "checkpoint")


def test_declare_work_keeps_what_is_usable_and_warns_about_the_rest(caplog):
    """A bad amount or an unknown dtype is left out with a warning naming it, never raised (a
    telemetry call must not stop training); a declaration made before the session starts is sent
    when it does, with the device's name (``cpu`` here)."""
    from traceml_core.sdk import work

    work._reset_for_tests()
    sent = []
    try:
        work.declare_work(tokens_per_step=4096, samples_per_step=-1, flops_per_step=float("nan"), dtype="bfloat16")
        assert not sent
        work.install(lambda kind, payload: sent.append((kind, payload)) or True)
        assert sent == [("work", {"tokens_per_step": 4096.0, "samples_per_step": None, "flops_per_step": None,
                                  "dtype": "bf16", "device": "cpu"})]
        assert "samples_per_step=-1" in caplog.text and "flops_per_step=nan" in caplog.text
        work.declare_work(tokens_per_step=1, dtype="int4")
        assert sent[-1][1]["dtype"] is None and "dtype='int4'" in caplog.text
        from traceml_core.wire.frames import rank_fact

        assert rank_fact("work", json.dumps({**sent[0][1], "samples_per_step": 8}))["samples_per_step"] == 8.0
    finally:
        work._reset_for_tests()
