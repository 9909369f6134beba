"""The ledger in words: the block that heads ``final_summary.txt`` of a run with several attempts
(a table, a bucket per row, the run and each attempt per column), or a short block for one attempt."""

from __future__ import annotations

import time
from typing import Optional

from .advice import advice_label
from .buckets import BUCKETS, BY_KEY
from .ending import UNSAVED_LOST
from .ledger import AttemptLedger, Ledger, Split

_ENDED_WORDS = {"completed": "completed", "failed": "failed", "requeued": "requeued",
                "time_limit": "time limit", "preempted": "preempted", "cancelled": "cancelled",
                "interrupted": "interrupted", "running": "still running", "unknown": "ended (unknown)"}


def _pct(v: Optional[int], total: int) -> str:
    return "-" if v is None or not total else f"{100.0 * v / total:.1f}%"


def _sec(ms: Optional[int]) -> str:
    return "not measured" if ms is None else f"{ms / 1000:,.1f}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "?"


def _attempt_line(a: AttemptLedger) -> str:
    who = f"job {a.job_id}" if a.job_id else "no job id"
    if a.restart_count:
        who += f", restart {a.restart_count}"
    line = (f"  attempt {a.attempt} ({who}): {_clock(a.start)}-{_clock(a.end)}, {a.wall_s:,.1f} s x "
            f"{a.slots} = {a.split.total_ms / 1000:,.1f} {a.unit}, {_ENDED_WORDS.get(a.ended, a.ended)}")
    if a.queued_before_s:
        line += f"; queued {a.queued_before_s:,.1f} s before it"
    p = a.progress
    if p.source == "unknown":
        line += f"; {p.steps:,} steps, where in training not known"
    elif p.source != "none":
        span = (f"steps {p.first_position:,}-{(p.end_position or 1) - 1:,}" if p.first_position is not None
                and p.end_position is not None else f"{p.steps:,} steps")
        line += f"; {span}" + ("" if p.exact else " (inferred)")
        if p.redone_steps_max is not None:
            line += f", {p.redone_steps:,}-{p.redone_steps_max:,} redone"
        elif p.redone_steps:
            line += f", {p.redone_steps:,} redone"
    if a.rebuilt:
        line += " (rebuilt from its checkpoint)"
    return line


def _shares(split: Split) -> str:
    parts = [(v, b) for b in BUCKETS for v in (split.ms.get(b.key),) if v]
    parts.sort(key=lambda x: -x[0])
    return ", ".join(f"{b.label} {_pct(v, split.total_ms)}" for v, b in parts[:6])


def _advice_lines(ledger: Ledger) -> list[str]:
    out = []
    adv = ledger.advice
    if adv is not None:
        out.append(f"  advice: {advice_label(adv.bucket).upper()}: {adv.why}")
        out.append(f"          next: {adv.next_step}")
    for a in ledger.attempts:
        if a.ending is not None and a.ending.words:
            who = f"attempt {a.attempt}'s end" if len(ledger.attempts) > 1 else "the end"
            out.append(f"  {who}: {a.ending.words}")
    last = ledger.current
    if last is not None and last.ended in UNSAVED_LOST \
            and last.progress.unsaved_s and last.ending is None:
        out.append(f"  not saved: the last {last.progress.unsaved_s:,.1f} s of training in attempt {last.attempt} "
                   "came after its last checkpoint; a run resumed from that checkpoint redoes them")
    return out + _throughput_lines(ledger)


def _throughput_lines(ledger: Ledger) -> list[str]:
    """Tokens/s, samples/s (over the allocation, per node, and while stepping) and MFU; or why not."""
    tp = ledger.throughput
    figures = []
    for key, word in (("tokens_per_s", "tokens"), ("samples_per_s", "samples")):
        v = getattr(tp, key)
        if v is None:
            continue
        per_node = [(n.node, getattr(n, key), getattr(n, key.replace("_per_s", "_per_step_s"))) for n in tp.nodes]
        nodes = ", ".join(f"node {n} {a:,.1f}" + (f" ({b:,.1f} while stepping)" if b is not None else "")
                          for n, a, b in per_node[:16] if a is not None)
        figures.append(f"{v:,.1f} {word}/s over the allocation" + (f" ({nodes})" if nodes else ""))
    if tp.mfu is not None:
        figures.append(f"MFU {tp.mfu:.1%} of {tp.peak_flops / 1e12:,.0f} TFLOP/s ({tp.peak_source})")
    out = [f"  throughput: {'; '.join(figures)}"] if figures else []
    if not tp.not_measured:
        return out
    whys: dict[str, list[str]] = {}
    for key, why in tp.not_measured.items():
        whys.setdefault(why, []).append({"tokens_per_s": "tokens/s", "samples_per_s": "samples/s"}.get(key, key.upper()))
    return out + [f"  throughput: {', '.join(keys)} not measured: {why}" for why, keys in whys.items()]


def _not_measured_lines(ledger: Ledger) -> list[str]:
    seen: dict[str, str] = {}
    notes: dict[str, str] = {}
    for a in ledger.attempts:
        for k, why in a.not_measured.items():
            seen.setdefault(k, why)
        for k, why in a.notes.items():
            notes.setdefault(k, why)
    out = [f"  not measured: {BY_KEY[k].label}: {why}" for k, why in seen.items()]
    out += [f"  note: {BY_KEY[k].label}: {why}" for k, why in notes.items()]
    return out


def render_ledger(ledger: Ledger) -> list[str]:
    """The ledger's lines for the text summary (a table when there are several attempts)."""
    atts = ledger.attempts
    if not atts:
        return []
    total = ledger.total
    if len(atts) == 1:
        a = atts[0]
        out = [f"Goodput: {a.slots} {'GPU(s)' if a.unit.startswith('GPU') else 'rank(s)'} x {a.wall_s:,.1f} s = "
               f"{total.total_ms / 1000:,.1f} {a.unit}: " + _shares(total)]
        if a.progress.checkpoints or a.progress.source == "step":
            p = a.progress
            out.append(f"  {p.checkpoints} checkpoint(s) seen" + (
                f", the last after step {p.checkpoint_position - 1:,}" if p.checkpoint_position else "")
                + ("; global steps from trace_step(step=...)" if p.exact else ""))
        return out + _not_measured_lines(ledger) + _advice_lines(ledger)
    requeues = sum(1 for a in atts if a.ended == "requeued")
    out = [f"Goodput of run over {len(atts)} attempts ({requeues} requeue(s)): "
           f"{total.total_ms / 1000:,.1f} {ledger.unit}, {_pct(total.ms.get('productive'), total.total_ms)} productive"
           + (f"; {ledger.queued_s:,.1f} s queued between attempts (not allocated)" if ledger.queued_s else "")]
    out += [_attempt_line(a) for a in atts]
    cols = ["run"] + [f"attempt {a.attempt}" for a in atts]
    out.append(f"  {'bucket (' + ledger.unit + ')':<30}" + "".join(f"{c:>18}" for c in cols))
    splits = [total] + [a.split for a in atts]
    for b in BUCKETS:
        vals = [s.ms.get(b.key) for s in splits]
        if all(v == 0 for v in vals) and b.key != "productive":
            continue   # a bucket no attempt measured stays, as "not measured"
        cells = [f"{_sec(v)} {_pct(v, s.total_ms)}" if v is not None else "not measured" for v, s in zip(vals, splits)]
        out.append(f"  {b.label:<30}" + "".join(f"{c:>18}" for c in cells))
    out.append(f"  {'total':<30}" + "".join(f"{_sec(s.total_ms) + ' 100%':>18}" for s in splits))
    return out + _not_measured_lines(ledger) + _advice_lines(ledger)
