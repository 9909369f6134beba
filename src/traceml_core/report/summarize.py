"""Rebuild a run's summary from the aggregator's last checkpoint (``traceml summarize RUN_DIR``).

The aggregator checkpoints its whole aggregate to ``<run_dir>/aggregate.state`` every couple of
seconds, so when it is killed (OOM killer, SIGKILL, node 0 rebooted) no run is lost: this
rebuilds ``final_summary.{json,txt,html}`` through the same code as the live summary, marked
``rebuilt`` with the time the checkpoint was taken (data after that is missing, unless the run's
end is in it: then the rebuilt summary is exact and says so). The launcher
calls it itself when its aggregator is gone at the end of a run; users can call it any time.

Usage: ``traceml summarize RUN_DIR`` (or ``python -m traceml_core.report.summarize RUN_DIR``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from ..rundir import (CHECKPOINT_NAME, fallback_dir, fallback_root, load_checkpoint, owned_problem,
                                 prepare_run_dir)
from ..errors import TraceMLError
from ..codec import decode
from ..rundata import LaunchEnd, LaunchLifecycle, NodeData, RunData
from .output import write_summary
from .summary import iso


class SummarizeError(TraceMLError):
    """No usable checkpoint."""


def trust_problem(checkpoint: Path) -> Optional[str]:
    """Why ``checkpoint`` must not be read (None when it may): it, its directory and, for the
    fallback, the directory above must be this user's own (not symlinks), so a checkpoint another
    user planted (say in a shared /tmp) cannot forge a summary."""
    dirs = [checkpoint.parent]
    if checkpoint.parent.parent == fallback_root():
        dirs.append(fallback_root())
    for d in dirs:
        problem = owned_problem(d)
        if problem is not None:
            return f"{d}: {problem}"
    problem = owned_problem(checkpoint, directory=False)
    return f"{checkpoint}: {problem}" if problem is not None else None


def find_checkpoint(run_dir: Path, run_id: Optional[str] = None) -> Path:
    """The newest checkpoint of the run: in RUN_DIR, or in the fallback directory (where the
    aggregator moves when RUN_DIR stops being writable mid-run, leaving an older one behind).
    Only checkpoints in directories this user owns are read (:func:`trust_problem`); with
    ``run_id`` (the launcher's own rebuild) only that run's (another run of the same name may
    have left one in the fallback directory)."""
    found, refused, others = [], [], []
    for cand in (run_dir / CHECKPOINT_NAME, fallback_dir(run_dir.name) / CHECKPOINT_NAME):
        try:
            mtime = os.lstat(cand).st_mtime
        except OSError:
            continue
        problem = trust_problem(cand)
        if problem is not None:
            refused.append(problem)
            continue
        if run_id is not None:
            try:
                theirs = load_checkpoint(cand)["state"]["settings"].get("run_id")
            except (OSError, ValueError, KeyError, AttributeError):
                theirs = None
            if theirs != run_id:
                others.append(f"{cand} (run id {theirs or 'unknown'})")
                continue
        found.append((mtime, cand))
    if found:
        return max(found)[1]
    if refused:
        raise SummarizeError(
            f"Not reading the checkpoint of {run_dir}: {'; '.join(refused)}. TraceML reads checkpoints "
            "only from directories you own, so another user cannot forge a summary. If you trust "
            "it, copy the run directory somewhere of your own and run `traceml summarize` there.")
    if others:
        raise SummarizeError(
            f"No checkpoint of this run (id {run_id}) in {run_dir}: {'; '.join(others)} belong(s) to "
            "another run with the same name. Nothing of this run could be rebuilt.")
    raise SummarizeError(
        f"No TraceML checkpoint found for RUN_DIR {run_dir}: neither {run_dir / CHECKPOINT_NAME} "
        f"nor the fallback {fallback_dir(run_dir.name) / CHECKPOINT_NAME} exists. Pass the run "
        "directory (<logs-dir>/<run-name>) of a run started by `traceml run`; the aggregator "
        "writes its first checkpoint about 2 s after the run starts.")


def summarize(run_dir: Path | str, *, finish: Optional[dict[str, Any]] = None,
              run_id: Optional[str] = None) -> dict[str, Any]:
    """Rebuild the summary files; returns ``{"summary_json", "summary_txt", "summary"}``.

    ``finish`` (``exit_code``, ``interrupted``, ``reason``, ``failed_nodes``) is what the launcher
    knows about the end when the aggregator could not be told; it fills in a checkpoint taken
    before the end. An unwritable run directory falls back like the live aggregator does.
    """
    run_dir = Path(run_dir)
    path = find_checkpoint(run_dir, run_id)
    try:
        doc = load_checkpoint(path)
    except (OSError, ValueError) as exc:
        raise SummarizeError(f"Cannot rebuild the summary of {run_dir}: {exc}. The checkpoint is "
                             "damaged or from another traceml version.") from None
    try:
        data = decode(RunData, doc["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SummarizeError(f"Cannot rebuild the summary of {run_dir}: {path} holds no usable run "
                             f"data ({type(exc).__name__}: {exc}). The checkpoint is damaged or from "
                             "another traceml version.") from None
    # the run's end is in the checkpoint (the final one, written with the summary, or one taken
    # after the launcher's end report): everything the run sent is in it, and the rebuilt
    # summary is exact
    end_recorded = bool(doc.get("final")) or data.finish is not None
    if finish is not None and data.finish is None:  # what the launcher knows about the end
        data.finish = replace(decode(LaunchEnd, finish), source="launcher (after the aggregator was gone)")
        if isinstance(finish.get("lifecycle"), dict):   # node 0's launcher's own record
            node0 = next((n for n in data.nodes if n.node == 0), None)
            if node0 is None:
                data.nodes.insert(0, node0 := NodeData(0))
            node0.lifecycle = decode(LaunchLifecycle, finish["lifecycle"])
    run_name = data.settings.run_name
    try:
        rd = prepare_run_dir(path.parent, run_name)
    except OSError as exc:
        raise SummarizeError(f"Cannot write the rebuilt summary for {run_dir}: {exc}") from None
    rebuilt = {"checkpoint": str(path), "taken_at": doc["taken_at"],
               "taken_at_iso": iso(doc["taken_at"]), "final_checkpoint": end_recorded}
    return write_summary(data, rd, run_name, rebuilt=rebuilt)


def summarize_cli(run_dir: str) -> int:
    """``traceml summarize RUN_DIR``: rebuild, print the text summary, say where the files are.

    Errors are :class:`TraceMLError` (one paragraph); the CLI prints them and exits non-zero.
    """
    out = summarize(run_dir)
    sys.stdout.write(Path(out["summary_txt"]).read_text())
    sys.stdout.flush()
    rb = out["summary"].get("rebuilt") or {}
    sys.stderr.write(f"traceml: summary rebuilt from {rb.get('checkpoint')} (taken at "
                     f"{rb.get('taken_at_iso')}): {out['summary_json']}\n")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m traceml_core.report.summarize RUN_DIR", file=sys.stderr)
        return 2
    try:
        out = summarize(args[0])
    except TraceMLError as exc:
        print(f"traceml: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write(Path(out["summary_txt"]).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
