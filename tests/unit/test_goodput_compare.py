"""`traceml compare`'s ledgers side by side: the largest change is a change in the job, not in the
runs' lengths. Start-up is paid once per attempt: a 4x longer run has a quarter of the start-up
share with the same start-up, and that must not outrank a real change (a checkpoint that costs 5%)."""

from __future__ import annotations

from traceml_core.report.goodput.compare import compare_ledgers, render_compare
from traceml_core.report.goodput.ledger import AttemptLedger, Ledger, Split


def ledger(total_s: float, slots: int = 2, **buckets_s: float) -> Ledger:
    ms = {k: int(v * 1000) for k, v in buckets_s.items()}
    ms["productive"] = int(total_s * 1000) - sum(ms.values())
    split = Split(int(total_s * 1000), ms)
    return Ledger(attempts=[AttemptLedger(attempt=0, slots=slots, split=split)], total=Split.summed([split]))


def rows(c):
    return {r["bucket"]: r for r in c["rows"]}


def test_the_same_start_up_in_a_longer_run_is_not_the_largest_change():
    # A: 100 rank-seconds, start-up 20 (20%); B: 4x longer, the same start-up (5%), and a checkpoint (5%)
    a = ledger(100, startup=20, checkpoint=0, tail=4)
    b = ledger(400, startup=20, checkpoint=20, tail=4.2)
    c = compare_ledgers(a, b)
    r = rows(c)
    assert r["startup"]["change_pp"] == -15.0 and r["startup"]["same_cost"]
    assert r["checkpoint"]["change_pp"] == 5.0 and not r["checkpoint"]["same_cost"]
    assert c["largest"] == "checkpoint"
    text = "\n".join(render_compare(c))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("start-up"))
    assert line.endswith("(the same per attempt: the share moved with the runs' lengths)"), line
    assert next(ln for ln in text.splitlines() if ln.strip().startswith("checkpointing")).endswith("<- largest change")


def test_a_start_up_that_really_changed_is_still_the_largest_change():
    # the control: B's start-up doubled (20 -> 40 s per run of 2 slots), in a 4x longer run
    a = ledger(100, startup=20, checkpoint=0)
    b = ledger(400, startup=40, checkpoint=20)
    c = compare_ledgers(a, b)
    assert not rows(c)["startup"]["same_cost"] and c["largest"] == "startup"


def test_per_attempt_costs_are_weighed_per_slot_and_attempt():
    # B ran on twice the slots: twice the start-up device-seconds is the same start-up per slot
    a = ledger(100, slots=2, startup=20, between=0)
    b = ledger(800, slots=4, startup=40, between=80)
    c = compare_ledgers(a, b)
    assert rows(c)["startup"]["same_cost"] and c["largest"] == "between"
