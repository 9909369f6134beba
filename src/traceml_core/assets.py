"""The files we inline into HTML pages (the live dashboard and the HTML report), read once.

uPlot (``views/static/uPlot.*``, 50 KB, MIT, vendored from npm ``uplot@1.6.32``) and our chart
helpers (``views/static/charts.js``) go inside the page itself: the dashboard needs no second
route to protect, and a report copied off the cluster opens with no network at all.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "views" / "static"
_SLOT = re.compile(r"/\*([A-Z_]+)\*/")


def script_safe(text: str) -> str:
    """Text that cannot end the ``<script>`` element it is put in."""
    return text.replace("</", "<\\/")


@lru_cache(maxsize=None)
def chart_assets() -> dict[str, str]:
    """``UPLOT_CSS``, ``UPLOT_JS`` and ``CHARTS_JS`` for :func:`fill`."""
    return {"UPLOT_CSS": (STATIC / "uPlot.min.css").read_text(encoding="utf-8"),
            "UPLOT_JS": script_safe((STATIC / "uPlot.iife.min.js").read_text(encoding="utf-8")),
            "CHARTS_JS": script_safe((STATIC / "charts.js").read_text(encoding="utf-8"))}


def fill(template: str, values: dict[str, str]) -> str:
    """Replace each ``/*NAME*/`` slot of ``template`` in one pass (a value that happens to hold
    ``/*NAME*/`` is never expanded again); unknown slots are left as they are."""
    return _SLOT.sub(lambda m: values.get(m.group(1), m.group(0)), template)
