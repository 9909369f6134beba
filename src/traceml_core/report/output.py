"""Write final_summary.json, .txt and .html (atomically, with the logs-dir fallback)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from ..rundir import SUMMARY_HTML, SUMMARY_JSON, SUMMARY_TXT, RunDir, load_checkpoint, write_file
from ..codec import decode, encode
from ..rundata import RunData
from .partial import finite, last_resort, render_partial
from .nextjob import amend
from .render_txt import render
from .goodput.ledger import AttemptLedger
from .goodput.previous import previous_attempts
from .summary_file import dumps
from .document import document
from .summary import build_document


def write_summary(data: RunData, rd: RunDir, run_name: str, *,
                  rebuilt: Optional[dict[str, Any]] = None,
                  provisional: bool = False, cluster: str = "") -> dict[str, Any]:
    """Build, render and write the files; returns ``{"summary_json", "summary_txt",
    "summary_html", "summary", "keep_evidence"}`` (``summary_html`` None when the page could not
    be written; ``keep_evidence``: what keeps the run's node evidence, to call once the files are
    written, report/nextjob.py, or None).

    Paths are decided before rendering so the summary can name them; when the run directory
    fails mid-write, the files move to the fallback and the note says why. The HTML page can
    never cost the JSON or the text: when it cannot be written, they do not name it. A final
    summary gets its ``next_job`` (report/nextjob.py; ``cluster``: the cluster plugin that keeps
    the run's node evidence).
    """
    files = {"json": str(rd.path / SUMMARY_JSON), "txt": str(rd.path / SUMMARY_TXT),
             "html": str(rd.path / SUMMARY_HTML)}
    try:  # the run's earlier attempts (a requeue, a chained job): their ledger rows
        previous = previous_attempts(rd.path, rebuild=rebuild_attempt)
    except Exception as exc:  # noqa: BLE001 - never lose this attempt's summary over them
        _warn(f"the run's earlier attempts could not be read ({type(exc).__name__}: {exc})")
        previous = []
    keep = None
    try:
        doc = build_document(data, files=files, rebuilt=rebuilt, provisional=provisional,
                             previous=previous)
        if not provisional:
            keep = amend(doc, cluster if rebuilt is None else "")
        summary = document(doc)  # the typed summary, written: the file's form from here on
        # the typed form is not read again: freed before the file's bytes and the page are made
        # (a run of 65,535 nodes of which one joined peaked at 1 GiB with both held)
        doc = None
        blob = dumps(summary)
    except Exception as exc:  # noqa: BLE001 - never lose the run's summary (report/partial.py)
        _warn(f"the summary could not be built whole ({type(exc).__name__}: {str(exc)[:200]}); "
              "writing what is known")
        summary = finite(last_resort(encode(data), exc, files=files, rebuilt=rebuilt,
                                     provisional=provisional))[0]
        blob = dumps(summary)
    jpath = write_file(rd, run_name, SUMMARY_JSON, blob, sync=not provisional)
    blob = b""
    if str(jpath) != files["json"]:  # moved to the fallback: say so in both files
        summary["files"] = {"json": str(jpath), "txt": str(jpath.with_name(SUMMARY_TXT)),
                            "html": str(jpath.with_name(SUMMARY_HTML))}
        summary["notes"] = [n for n in (rd.note,) if n]
        jpath = write_file(rd, run_name, SUMMARY_JSON, dumps(summary), sync=not provisional)
    hpath = write_html(summary, rd, run_name, sync=not provisional)
    if hpath is None:  # no page after all: the files must not name one
        summary["files"].pop("html", None)
        jpath = write_file(rd, run_name, SUMMARY_JSON, dumps(summary), sync=not provisional)
    tpath = write_file(rd, run_name, SUMMARY_TXT, render_text(summary).encode(), sync=not provisional)
    return {"summary_json": str(jpath), "summary_txt": str(tpath),
            "summary_html": None if hpath is None else str(hpath), "summary": summary, "keep_evidence": keep}


def rebuild_attempt(checkpoint: Path) -> Optional[AttemptLedger]:
    """An earlier attempt's own ledger row, from the summary its checkpoint rebuilds (it ended
    before writing one)."""
    doc = load_checkpoint(checkpoint)
    ledger = build_document(decode(RunData, doc["state"]), previous=[], rebuilt={
        "checkpoint": str(checkpoint), "taken_at": doc["taken_at"], "final_checkpoint": bool(doc.get("final"))}).goodput
    return ledger.attempts[-1] if ledger is not None and ledger.attempts else None


def render_text(summary: dict[str, Any]) -> str:
    """``final_summary.txt``: the usual text, or, for a partial summary (or when rendering
    fails), the plain lines of report/partial.py."""
    if not (summary.get("partial") or {}).get("whole", True):
        return render_partial(summary)
    try:
        return render(summary)
    except Exception as exc:  # noqa: BLE001 - the JSON is written; the text must be too
        _warn(f"final_summary.txt could not be rendered whole ({type(exc).__name__}: {exc})")
        return render_partial(summary)


def _warn(text: str) -> None:
    try:
        sys.stderr.write(f"traceml: warning: {text}\n")
    except (OSError, ValueError):
        pass


def write_html(summary: dict[str, Any], rd: RunDir, run_name: str, *, sync: bool = False) -> Optional[Any]:
    """Write ``final_summary.html``; on any error, say why on stderr and return None."""
    if not (summary.get("partial") or {}).get("whole", True):
        return None  # the page needs the sections a partial summary lacks
    try:
        from .render_html import render_html

        return write_file(rd, run_name, SUMMARY_HTML, render_html(summary).encode(), sync=sync)
    except Exception as exc:  # the page is a view of the JSON: never lose the run over it
        try:
            sys.stderr.write(f"traceml: warning: final_summary.html not written ({type(exc).__name__}: "
                             f"{exc}); `traceml report {rd.path}` can try again\n")
        except (OSError, ValueError):
            pass
        return None
