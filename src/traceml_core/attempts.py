"""One run directory across attempts: a requeued job, or a chain of jobs given the same run name.

A run's directory ``<logs-dir>/<run-name>`` holds the current attempt's files at its top (where
they always were: ``final_summary.*``, ``aggregate.state``, the exports) and each earlier attempt's
under ``attempt-<n>/`` (0, 1, ...). When an attempt begins, its aggregator, once it has claimed the
directory, moves the files of the attempt before (a summary or checkpoint of another run id) into
the next free ``attempt-<n>/`` (:func:`archive_previous`); at the end, the summary reads every
earlier attempt back (``report/goodput/previous.py``) for the run's goodput ledger.

Under Slurm the run name is the same for every requeue of a job (``SLURM_RESTART_COUNT`` is the
attempt's restart count, not part of the name); a job continuing another (``--dependency=afterany``)
joins its ledger when it is given the same run name (``--run-name``, or ``TRACEML_RUN_NAME`` in the
batch script) and logs directory. See docs/goodput.md.

Only this user's attempts count: an ``attempt-<n>`` that is a link or another user's directory, and
a summary or checkpoint in it that is not a regular file of this user's (a FIFO, a link to
``/dev/zero``, a forged file planted in a shared logs directory) are left out of the ledger with a
warning that names them, and never waited on (traceml_core/safeio.py). A file at the top of the
run directory that must be a regular file and is not (a FIFO at ``aggregate.state``) is moved
aside when the attempt begins, and the log names it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional

from .rundir import CHECKPOINT_NAME, SUMMARY_HTML, SUMMARY_JSON, SUMMARY_TXT, load_checkpoint, owned_problem
from .safeio import entry_problem, move_aside, read_file

ATTEMPT_PREFIX = "attempt-"
_ATTEMPT = re.compile(r"^attempt-(\d{1,6})$")
#: what an attempt leaves at the top of the run directory (moved whole when the next one begins):
#: the summary files, the aggregator's checkpoint and the exports' report (exporters/hub.py:
#: REPORT_NAME); each output's own files are said by the output (:func:`attempt_files`)
CORE_ATTEMPT_FILES = (SUMMARY_JSON, SUMMARY_TXT, SUMMARY_HTML, CHECKPOINT_NAME, "exports.json")


def attempt_files() -> tuple[str, ...]:
    """Everything an attempt leaves at the top: core's files, and what each registered output
    says it leaves (exporters/output.py; an MLflow file store or W&B's offline runs are the run's,
    not an attempt's, and stay)."""
    from .exporters.output import registry

    return CORE_ATTEMPT_FILES + tuple(f for f in registry().leaves() if f not in CORE_ATTEMPT_FILES)
#: of the attempt's files, the ones TraceML reads back: each must be a regular file of this user's
READ_BACK = (SUMMARY_JSON, CHECKPOINT_NAME)
#: the largest summary read back for the ledger (tens of MB at thousands of ranks)
MAX_SUMMARY_BYTES = 1 << 30


def read_summary_json(path: Path) -> dict:
    """An attempt's ``final_summary.json``; ``UnsafeFileError`` (not ours, not regular, a link,
    too large), ``FileNotFoundError`` or ``ValueError`` (not a JSON object)."""
    doc = json.loads(read_file(path, MAX_SUMMARY_BYTES))
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a TraceML summary")
    return doc


def attempt_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """The earlier attempts' directories, in order."""
    try:
        entries = list(Path(run_dir).iterdir())
    except OSError:
        return []
    out = []
    for p in entries:
        m = _ATTEMPT.match(p.name)
        if m and (p.is_dir() or p.is_symlink()):  # a link is listed, and refused where it is read
            out.append((int(m.group(1)), p))
    return sorted(out)


def attempts_before(directory: Path) -> list[tuple[int, Path]]:
    """The attempts before the one whose files are in ``directory``: every ``attempt-<n>/`` in it
    (a run directory: its top is the current attempt), or, for an earlier attempt's own
    ``<run>/attempt-<k>/`` (``traceml summarize`` of an attempt that left only its checkpoint),
    its siblings ``attempt-<n>/`` with ``n < k``."""
    d = Path(directory)
    m = _ATTEMPT.match(d.name)
    if m and not d.is_symlink():
        return [(n, p) for n, p in attempt_dirs(d.parent) if n < int(m.group(1))]
    return attempt_dirs(d)


def top_run_id(run_dir: Path) -> tuple[Optional[str], bool]:
    """(the run id of the attempt whose files are at the top of ``run_dir``, whether there are
    any): from its checkpoint, else from its summary's ledger."""
    ck = run_dir / CHECKPOINT_NAME
    js = run_dir / SUMMARY_JSON
    if ck.exists():
        try:
            return str((load_checkpoint(ck)["state"]["settings"]).get("run_id") or ""), True
        except (OSError, ValueError, KeyError, TypeError):
            return None, True
    if js.exists():
        try:
            rows = ((read_summary_json(js).get("goodput") or {}).get("attempts") or [])
            return (str(rows[-1].get("run_id") or "") if rows else None), True
        except (OSError, ValueError, AttributeError):
            return None, True
    return None, False


def refuse_strays(run_dir: Path) -> list[str]:
    """Move aside each file at the top of ``run_dir`` that TraceML reads back and that is not a
    regular file of this user's (a FIFO, a link, a device; the directory is ours, so the entry
    can be renamed); one note per entry, naming it. Never raises."""
    notes = []
    for name in READ_BACK:
        path = Path(run_dir) / name
        problem = entry_problem(path)
        if problem is None or problem == "it does not exist":
            continue
        try:
            aside = move_aside(path)
            notes.append(f"{path} is not read: {problem}. It was moved to {aside}; TraceML reads back only "
                         "regular files of yours there (another user's doing, in a shared logs directory?)")
        except OSError as exc:
            notes.append(f"{path} is not read: {problem}, and it cannot be moved aside ({exc.strerror or exc}); "
                         "this attempt's files replace it")
    return notes


def archive_previous(run_dir: Path, run_id: str) -> Optional[str]:
    """Move the files of the attempt before this one (this one's run id: ``run_id``) into the next
    free ``attempt-<n>/``. None when there was none, or they are this run's own (a restarted
    aggregator); else a note saying where they went. Never raises."""
    run_dir = Path(run_dir)
    if owned_problem(run_dir) is not None:
        return None
    strays = refuse_strays(run_dir)
    theirs, present = top_run_id(run_dir)
    if not present or (theirs and theirs == run_id):
        return "; ".join(strays) or None
    taken = [n for n, _ in attempt_dirs(run_dir)]
    n = (max(taken) + 1) if taken else 0
    dest = run_dir / f"{ATTEMPT_PREFIX}{n}"
    try:
        os.mkdir(dest, 0o755)
        for name in attempt_files():
            src = run_dir / name
            if src.exists() or src.is_symlink():
                os.replace(src, dest / name)
    except OSError as exc:
        return "; ".join(strays + [f"the files of this run's attempt before could not be moved into {dest} "
                                   f"({exc.strerror or exc}); this attempt's files replace them"])
    return "; ".join(strays + [f"this run's attempt {n} (the one before this) is in {dest}"])
