"""``traceml report RUN_DIR``: (re)write a finished run's ``final_summary.html`` and exports.

The page is drawn from ``final_summary.json`` alone, so it can be rebuilt any time, anywhere the
JSON was copied (``scp`` the JSON, run ``traceml report`` on a laptop). A run directory with no
summary but the aggregator's checkpoint (the aggregator was killed) is summarised first, as
``traceml summarize`` does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..rundir import CHECKPOINT_NAME, SUMMARY_HTML, SUMMARY_JSON, atomic_write
from ..errors import TraceMLError
from .summary_file import read_summary


class ReportError(TraceMLError):
    """Unusable input (no summary, not JSON, not a TraceML summary, output not writable)."""

    exit_code = 2


def load_summary(arg: str) -> tuple[Path, dict[str, Any]]:
    """(summary path, summary) of a run directory or a ``final_summary.json``."""
    p = Path(arg)
    if p.is_dir():
        f = p / SUMMARY_JSON
        if not f.is_file():
            if (p / CHECKPOINT_NAME).is_file():
                from .summarize import summarize

                out = summarize(p)
                return Path(out["summary_json"]), out["summary"]
            raise ReportError(f"RUN_DIR {arg}: the directory has no {SUMMARY_JSON} (and no "
                              f"{CHECKPOINT_NAME} to rebuild it from). Pass the run directory "
                              "<logs-dir>/<run-name> of a `traceml run`, or its summary file.")
        p = f
    elif not p.exists():
        raise ReportError(f"RUN_DIR {arg}: no such file or directory. Pass a run directory "
                          f"(<logs-dir>/<run-name>) or its {SUMMARY_JSON}.")
    doc = read_summary(p, str(p), ReportError)
    return p, doc


def report_cli(run_dir: str, output: Optional[str] = None, exports: Sequence[str] = (),
               export: Optional[Callable[[dict[str, Any], Path, str], list[str]]] = None) -> int:
    """``traceml report``; ``export``: writes one at-the-end kind from the summary (the caller's:
    exporters/atend.py, which the report package does not import)."""
    from .render_html import render_html

    path, summary = load_summary(run_dir)
    partial = summary.get("partial") or {}
    if not partial.get("whole", True):
        raise ReportError(f"{path} is a partial summary (building it failed: {partial.get('error')}), "
                          "without the statistics a report draws. Run `traceml summarize RUN_DIR` to "
                          "rebuild it from the checkpoint, then `traceml report` again.")
    target = Path(output) if output else path.with_name(SUMMARY_HTML)
    try:
        atomic_write(target, render_html(summary).encode())
    except OSError as exc:
        raise ReportError(f"cannot write the report to {target} ({exc.strerror or exc}); pass "
                          "--output PATH in a writable directory.") from None
    sys.stdout.write(f"traceml: report written to {target}\n")
    if not summary.get("timeline"):
        sys.stdout.write("traceml: this summary has no per-step series (written by an older "
                         "traceml): the page shows the verdict and tables, no charts over time\n")
    for kind in exports:
        if export is None:
            raise ReportError(f"--export {kind}: no exporter was given to write it")
        for line in export(summary, path.parent, kind):
            sys.stdout.write(f"traceml: {line}\n")
    sys.stdout.flush()
    return 0
