"""The run's earlier attempts, read back for its ledger (the layout: traceml_core/attempts.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

from ...attempts import attempts_before, read_summary_json
from ...codec import decode
from ...rundir import CHECKPOINT_NAME, SUMMARY_JSON, owned_problem
from ...safeio import UnsafeFileError, entry_problem
from .ledger import AttemptLedger

#: an attempt's own ledger row rebuilt from its checkpoint's path: report/output.py passes it
Rebuild = Callable[[Path], Optional[AttemptLedger]]


def own_row(doc: Any) -> Optional[AttemptLedger]:
    """An attempt's own ledger row: the last of its summary's ``goodput.attempts``."""
    rows = ((doc or {}).get("goodput") or {}).get("attempts") or [] if isinstance(doc, dict) else []
    return decode(AttemptLedger, rows[-1]) if rows else None


def previous_attempts(run_dir: Path, rebuild: Optional[Rebuild] = None) -> list[AttemptLedger]:
    """Every earlier attempt's own ledger row, in order: from its ``final_summary.json``, else
    rebuilt from its checkpoint (its node 0 was killed before the summary); an attempt with
    neither is left out, and said so on stderr. ``run_dir`` may be an earlier attempt's own
    ``attempt-<k>/``: then the attempts before it (:func:`attempts_before`).

    Only this user's attempts count (traceml_core/attempts.py): a directory or file that is not
    a regular one of this user's (a link, a FIFO, another user's forgery) is never waited on and
    is left out, said on stderr with its path."""
    out: list[AttemptLedger] = []
    for _, path in attempts_before(Path(run_dir)):
        problem = owned_problem(path)
        if problem is not None:
            _warn(f"{path} is not read: {problem}; the run's ledger leaves this attempt out (TraceML counts "
                  "only attempts in directories of yours)")
            continue
        row = None
        js = path / SUMMARY_JSON
        try:
            row = own_row(read_summary_json(js))
        except FileNotFoundError:
            row = None
        except UnsafeFileError as exc:
            _warn(f"{exc.strerror}; the run's ledger does not read it")
        except (OSError, ValueError):
            row = None
        if row is None and rebuild is not None and entry_problem(path / CHECKPOINT_NAME) != "it does not exist":
            try:
                row = rebuild(path / CHECKPOINT_NAME)
            except Exception as exc:  # noqa: BLE001 - a damaged attempt must not cost the run's summary
                _warn(f"{path}: this earlier attempt's checkpoint could not be read ({type(exc).__name__}: {exc})")
            if row is not None:
                row.rebuilt = True
        if row is None:
            _warn(f"{path}: this earlier attempt left no summary or checkpoint TraceML can read; "
                  "the run's ledger leaves it out")
            continue
        row.summary = str(js)
        out.append(row)
    return out


def _warn(text: str) -> None:
    try:
        sys.stderr.write(f"traceml: warning: {text}\n")
    except (OSError, ValueError):
        pass
