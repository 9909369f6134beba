"""Two runs' ledgers side by side (``traceml compare``): each bucket's share of its run's
allocation, and the change in percentage points. Shares, not seconds: two runs of different
lengths or sizes compare by where their allocation went."""

from __future__ import annotations

from typing import Any, Optional

from .buckets import BUCKETS
from .ledger import Ledger


def _share(ledger: Ledger, key: str) -> Optional[float]:
    f = ledger.total.fraction(key)
    return None if f is None else round(100.0 * f, 2)


def compare_ledgers(a: Optional[Ledger], b: Optional[Ledger]) -> Optional[dict[str, Any]]:
    """``{"unit_a", "unit_b", "attempts_a", "attempts_b", "rows": [{"bucket", "label", "a_pct",
    "b_pct", "change_pp"}], "largest"}``; None when either run has no ledger (older summaries)."""
    if a is None or b is None or not a.attempts or not b.attempts:
        return None
    rows = []
    for bk in BUCKETS:
        pa, pb = _share(a, bk.key), _share(b, bk.key)
        if not pa and not pb and bk.key != "productive":
            continue
        rows.append({"bucket": bk.key, "label": bk.label, "a_pct": pa, "b_pct": pb,
                     "change_pp": None if pa is None or pb is None else round(pb - pa, 2)})
    moved = [r for r in rows if r["change_pp"] is not None and r["bucket"] != "productive"]
    largest = max(moved, key=lambda r: abs(r["change_pp"]))["bucket"] if moved else None
    return {"unit_a": a.unit, "unit_b": b.unit, "attempts_a": len(a.attempts), "attempts_b": len(b.attempts),
            "total_a_s": round(a.total.total_ms / 1000, 3), "total_b_s": round(b.total.total_ms / 1000, 3),
            "rows": rows, "largest": largest}


def render_compare(c: Optional[dict[str, Any]]) -> list[str]:
    if c is None:
        return ["Goodput: not compared (a summary without a ledger: written by an older traceml)"]
    pct = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    out = [f"Goodput (share of the allocation; A: {c['total_a_s']:,.1f} {c['unit_a']} in {c['attempts_a']} "
           f"attempt(s), B: {c['total_b_s']:,.1f} {c['unit_b']} in {c['attempts_b']})",
           f"  {'bucket':<28}{'A':>9}{'B':>9}{'change':>10}"]
    for r in c["rows"]:
        ch = "-" if r["change_pp"] is None else f"{r['change_pp']:+.1f} pp"
        mark = "  <- largest change" if r["bucket"] == c["largest"] else ""
        out.append(f"  {r['label']:<28}{pct(r['a_pct']):>9}{pct(r['b_pct']):>9}{ch:>10}{mark}")
    return out
