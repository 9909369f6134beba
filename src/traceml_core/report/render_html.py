"""``final_summary.html``: the finished run as one self-contained page.

Everything is inside the file: the summary's data as JSON, uPlot and our chart helpers (see
:mod:`traceml_core.assets`), the page's own script and style. Its Content-Security-Policy
forbids loading anything, so it opens the same from a laptop after ``scp`` with no network as
on the cluster. The page draws from the summary alone (the ``timeline`` section holds the
series), so ``traceml report RUN_DIR`` rebuilds it from ``final_summary.json`` at any time.

The summary's ``compare`` section (per-step histograms for ``traceml compare``) is left out of
the page: nothing on it reads them, and they are the largest part of the JSON.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Optional

from ..assets import chart_assets, fill
from ..codec import decode
from .document import RunSection
from .goodput.buckets import BUCKETS

TEMPLATE = Path(__file__).resolve().parent / "static" / "report.html"
#: summary sections the page does not need
_LEFT_OUT = ("compare",)


def _page_data(doc: dict[str, Any]) -> str:
    # '<', '>' and '&' only occur inside JSON strings, where \\u escapes mean the same thing;
    # escaped, no value can close the <script> element or open a comment
    text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _slim(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in _LEFT_OUT}


def _page(title: str, doc: dict[str, Any]) -> str:
    values = dict(chart_assets())
    values["TITLE"] = html.escape(title)
    values["REPORT_DATA"] = _page_data(doc)
    values["GOODPUT_BUCKETS"] = json.dumps([[b.key, b.label, b.colour, b.measured] for b in BUCKETS])
    return fill(TEMPLATE.read_text(encoding="utf-8"), values)


def render_html(summary: dict[str, Any]) -> str:
    """The report page of one run."""
    try:
        run = decode(RunSection, summary.get("run") or {})
    except ValueError:  # a partial summary's run section: the page is still made
        run = RunSection()
    title = f"TraceML report: {run.name or '?'} ({run.status or '?'})"
    return _page(title, {"kind": "report", "summary": _slim(summary)})


def render_compare_html(comparison: dict[str, Any], a: dict[str, Any], b: dict[str, Any],
                        title: Optional[str] = None) -> str:
    """The side-by-side page of ``traceml compare A B --html``: the comparison on top, then
    each run's report in its own column."""
    title = title or f"TraceML compare: {comparison['a']['name']} vs {comparison['b']['name']}"
    return _page(title, {"kind": "compare", "comparison": comparison, "a": _slim(a), "b": _slim(b)})
