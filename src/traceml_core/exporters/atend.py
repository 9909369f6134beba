"""The at-the-end outputs (``tensorboard``, ``jsonl``, and any registered with ``live = False``):
written once from the final summary, by node 0's aggregator right after it, or later by
``traceml report RUN_DIR --export KIND``. Errors never propagate: each kind returns the lines to
log, and a missing library or a full disk is one of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from ..report.document import Summary, read
from .output import registry


def export_summary(summary: Union[Summary, dict[str, Any]], run_dir: Path, kind: str,
                   settings: Optional[Mapping[str, Any]] = None) -> list[str]:
    """Write one at-the-end kind; returns the lines to log. Never raises."""
    reg = registry()
    ends = reg.end_kinds()
    if kind not in ends:
        return [f"export {kind!r} skipped: not an output written at the end (those: {', '.join(ends)})"]
    try:
        doc = summary if isinstance(summary, Summary) else read(summary)
    except Exception as exc:  # an export must never cost the run anything
        return [f"{kind} export failed ({type(exc).__name__}: {exc}); the summary is complete"]
    if not (doc.timeline and doc.timeline.buckets):
        return [f"{kind} export skipped: the summary has no per-step series (no steps were "
                "measured, or an older traceml wrote it)"]
    try:
        return [reg.outputs[kind].write(doc, Path(run_dir), reg.settings(kind, settings or {}))]
    except Exception as exc:  # an export must never cost the run anything
        return [f"{kind} export failed ({type(exc).__name__}: {exc}); the summary is complete"]


def export_all(summary: Union[Summary, dict[str, Any]], run_dir: Path, kinds: Sequence[str],
               settings: Optional[Mapping[str, Any]] = None) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        out += export_summary(summary, run_dir, kind, settings)
    return out
