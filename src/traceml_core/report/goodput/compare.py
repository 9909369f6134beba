"""Two runs' ledgers side by side (``traceml compare``): each bucket's device-seconds and share of
its run's allocation, and the change in percentage points. The change is in shares, not seconds:
two runs of different lengths or sizes compare by where their allocation went; the seconds beside
them say how much that was."""

from __future__ import annotations

from typing import Any, Optional

from .buckets import BUCKETS, Bucket
from .ledger import Ledger

#: a per-attempt bucket (start-up, the tail) whose seconds per slot and attempt differ by less than
#: this ratio between the runs is the same cost in both: its share moved with the runs' lengths,
#: and it is not "the largest change" (a 4x longer run has a quarter of the start-up share)
SAME_COST_RATIO = 1.25
#: ...and seconds per slot and attempt under which both are the same (nothing to compare)
SAME_COST_FLOOR_S = 0.5


def _share(ledger: Ledger, key: str) -> Optional[float]:
    f = ledger.total.fraction(key)
    return None if f is None else round(100.0 * f, 2)


def _seconds(ledger: Ledger, key: str) -> Optional[float]:
    v = ledger.total.get(key)
    return None if v is None else round(v / 1000.0, 3)


def _per_slot_attempt(ledger: Ledger, key: str) -> Optional[float]:
    v = ledger.total.get(key)
    slot_attempts = sum(a.slots for a in ledger.attempts)
    return None if v is None or not slot_attempts else v / 1000.0 / slot_attempts


def _same_cost(bk: Bucket, a: Ledger, b: Ledger) -> bool:
    """A per-attempt bucket that cost both runs about the same per slot and attempt."""
    if not bk.per_attempt:
        return False
    x, y = _per_slot_attempt(a, bk.key), _per_slot_attempt(b, bk.key)
    if x is None or y is None:
        return False
    lo, hi = sorted((x, y))
    return hi < SAME_COST_FLOOR_S or (lo > 0 and hi / lo < SAME_COST_RATIO)


def compare_ledgers(a: Optional[Ledger], b: Optional[Ledger]) -> Optional[dict[str, Any]]:
    """``{"unit_a", "unit_b", "attempts_a", "attempts_b", "total_a_s", "total_b_s", "rows":
    [{"bucket", "label", "a_s", "b_s", "a_pct", "b_pct", "change_pp", "same_cost"}], "largest"}``
    (``largest``: the badput bucket whose share moved most, leaving out a per-attempt bucket that
    cost both runs the same, ``same_cost``); None when either run has no ledger (older
    summaries). A bucket not measured in a run is None there, never 0."""
    if a is None or b is None or not a.attempts or not b.attempts:
        return None
    rows = []
    for bk in BUCKETS:
        pa, pb = _share(a, bk.key), _share(b, bk.key)
        if not pa and not pb and bk.key != "productive":
            continue
        rows.append({"bucket": bk.key, "label": bk.label, "a_s": _seconds(a, bk.key), "b_s": _seconds(b, bk.key),
                     "a_pct": pa, "b_pct": pb,
                     "change_pp": None if pa is None or pb is None else round(pb - pa, 2),
                     "same_cost": _same_cost(bk, a, b)})
    moved = [r for r in rows if r["change_pp"] is not None and r["bucket"] != "productive" and not r["same_cost"]]
    largest = max(moved, key=lambda r: abs(r["change_pp"]))["bucket"] if moved else None
    return {"unit_a": a.unit, "unit_b": b.unit, "attempts_a": len(a.attempts), "attempts_b": len(b.attempts),
            "total_a_s": round(a.total.total_ms / 1000, 3), "total_b_s": round(b.total.total_ms / 1000, 3),
            "rows": rows, "largest": largest}


def render_compare(c: Optional[dict[str, Any]]) -> list[str]:
    if c is None:
        return ["Goodput: not compared (a summary without a ledger: written by an older traceml)"]
    def cell(s: Optional[float], p: Optional[float]) -> str:
        return "not measured" if s is None or p is None else f"{s:,.1f} ({p:.1f}%)"

    out = [f"Goodput (where each run's allocation went; A: {c['total_a_s']:,.1f} {c['unit_a']} in "
           f"{c['attempts_a']} attempt(s), B: {c['total_b_s']:,.1f} {c['unit_b']} in {c['attempts_b']})",
           f"  {'bucket':<28}{'A':>18}{'B':>18}{'change':>11}"]
    for r in c["rows"]:
        ch = "-" if r["change_pp"] is None else f"{r['change_pp']:+.1f} pp"
        mark = "  <- largest change" if r["bucket"] == c["largest"] else ""
        if r.get("same_cost") and r["change_pp"] and abs(r["change_pp"]) >= 0.1:
            mark = "  (the same per attempt: the share moved with the runs' lengths)"
        out.append(f"  {r['label']:<28}{cell(r.get('a_s'), r['a_pct']):>18}{cell(r.get('b_s'), r['b_pct']):>18}"
                   f"{ch:>11}{mark}")
    return out
