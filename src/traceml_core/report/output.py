"""Write final_summary.json and final_summary.txt (atomically, with the logs-dir fallback)."""

from __future__ import annotations

import json
from typing import Any, Optional

from ..aggregator.persist import SUMMARY_JSON, SUMMARY_TXT, RunDir, write_file
from .render_txt import render
from .summary import build_summary


def write_summary(data: dict[str, Any], rd: RunDir, run_name: str, *,
                  rebuilt: Optional[dict[str, Any]] = None,
                  provisional: bool = False) -> dict[str, Any]:
    """Build, render and write both files; returns ``{"summary_json", "summary_txt", "summary"}``.

    Paths are decided before rendering so the summary can name them; when the run directory
    fails mid-write, both files move to the fallback and the note says why.
    """
    files = {"json": str(rd.path / SUMMARY_JSON), "txt": str(rd.path / SUMMARY_TXT)}
    summary = build_summary(data, files=files, rebuilt=rebuilt, provisional=provisional)
    jpath = write_file(rd, run_name, SUMMARY_JSON, _dumps(summary), sync=not provisional)
    if str(jpath) != files["json"]:  # moved to the fallback: say so in both files
        summary["files"] = {"json": str(jpath), "txt": str(jpath.with_name(SUMMARY_TXT))}
        summary["notes"] = [n for n in (rd.note,) if n]
        jpath = write_file(rd, run_name, SUMMARY_JSON, _dumps(summary), sync=not provisional)
    tpath = write_file(rd, run_name, SUMMARY_TXT, render(summary).encode(), sync=not provisional)
    return {"summary_json": str(jpath), "summary_txt": str(tpath), "summary": summary}


def _dumps(summary: dict[str, Any]) -> bytes:
    return (json.dumps(summary, indent=1, allow_nan=False) + "\n").encode()
