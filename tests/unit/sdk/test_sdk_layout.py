"""The SDK's modules form layers (tracer.py's docstring draws them): no import cycle inside
``sdk/``, and none through another package, counting the imports inside functions too (they
close a cycle at run time as surely as module-level ones, only later)."""

from __future__ import annotations

from pathlib import Path

from import_graph import cycles, graph

CORE = Path(__file__).resolve().parents[3] / "src" / "traceml_core"


def test_no_import_cycle_touches_the_sdk():
    g = graph(CORE)
    assert len([m for m in g.modules if m.startswith("traceml_core.sdk.")]) >= 15  # the graph was read
    assert cycles(g.all, "traceml_core.sdk") == []
    through = [c for c in cycles(g.all) if any(m.startswith("traceml_core.sdk") for m in c)]
    assert through == []
