"""``python -m traceml_core.aggregator``: the aggregator process (started by the launcher).

Protocol with the parent (see :mod:`.process`): the parent writes :class:`AggregatorSettings` as
one JSON line on stdin; the child answers one line on stdout, either
``TRACEML_AGGREGATOR_READY {"port": P, "run_dir": ..., "run_dir_note": ..., "pid": ...}`` or
``TRACEML_AGGREGATOR_ERROR {"kind": ..., "message": ...}`` (then exits 3), and never writes to
stdout again. Logs go to stderr (the job's log). Exit status 0 after the summary is written.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from ..exporters import live_kinds
from ..rundata import RunData
from .settings import ERROR, READY


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the ingest path.

    The aggregator allocates a few containers per frame (the decoded map and its column lists)
    and holds them until their statistics are computed, while its long-lived state (per rank:
    phases, sketches, series) is acyclic and large at scale; with the default thresholds a young
    collection runs every ~70 frames and full collections keep re-walking thousands of ranks'
    state (measured: a quarter of the ingest CPU at 4,096 ranks). Start-up objects are frozen
    out of collection, and young collections wait for 50,000 allocations; cycles (rare: an
    exception's traceback) are still collected, just less often."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def claim_run_dir(run_dir: Any, settings: Any) -> Any:
    """This run's claim of its run directory (aggregator/claim.py), or None when the directory
    cannot hold one (the run goes on without: nothing to compare against)."""
    from .claim import claim, me
    from .server import log

    try:
        return claim(run_dir.path, me(settings.run_id, settings.job_id, settings.run_name,
                                        settings.restart_count))
    except OSError as exc:
        log(f"could not claim {run_dir.path} for this run ({exc.strerror or exc}); another run "
            "with the same name and logs directory would not be noticed")
        return None


def main() -> int:
    from ..rundir import fallback_dir, prepare_run_dir
    from .server import BindError, Server, log, open_listener, raise_fd_limit
    from .settings import AggregatorSettings

    try:
        settings = AggregatorSettings.model_validate_json(sys.stdin.readline())
    except (ValueError, TypeError, KeyError) as exc:
        _say(f"{ERROR} " + json.dumps({"kind": "settings", "message": f"bad aggregator settings: {exc}"}))
        return 3
    try:
        run_dir = prepare_run_dir(settings.run_dir, settings.run_name, settings.job_id)
    except OSError as exc:
        _say(f"{ERROR} " + json.dumps({"kind": "run_dir", "message": (
            f"Neither the run directory {settings.run_dir} nor the fallback "
            f"{fallback_dir(settings.run_name)} can be written ({exc.strerror or exc}). Set "
            "--logs-dir (or TRACEML_LOGS_DIR) to a writable directory; training was not started.")}))
        return 3
    claimed = claim_run_dir(run_dir, settings)
    if claimed is not None and claimed.path != run_dir.path:  # another live run owns it: a sibling
        try:
            run_dir = prepare_run_dir(claimed.path, settings.run_name, settings.job_id)
        except OSError:
            pass  # the claimed sibling is not writable after all: share, as before
    if claimed is not None and claimed.note:
        run_dir.note = "; ".join(n for n in (claimed.note, run_dir.note) if n)
    if run_dir.note:
        log(run_dir.note)
    if claimed is not None and not settings.resume_from:  # the directory is ours: an earlier attempt's
        from ..attempts import archive_previous             # files move aside (goodput across attempts)

        moved = archive_previous(run_dir.path, settings.run_id)
        if moved:
            log(moved)
    run_dir.on_move = log  # a move to the fallback mid-run is logged when it happens
    raise_fd_limit()
    try:
        listener = open_listener(settings)
    except BindError as exc:
        _say(f"{ERROR} " + json.dumps({"kind": "bind", "message": str(exc)}))
        return 3

    def finalize(server: Server, data: RunData, provisional: bool) -> dict[str, Any]:
        from ..report.output import write_summary
        out = write_summary(data, server.run_dir, settings.run_name, provisional=provisional,
                            cluster=settings.cluster)
        if not provisional:
            log(f"summary written to {out['summary_json']}")
            at_end = [k for k in settings.export if k not in live_kinds()]
            if at_end:
                try:
                    from ..exporters.atend import export_all

                    for line in export_all(out["summary"], server.run_dir.path, at_end,
                                           settings.export_settings):
                        log(line)
                except Exception as exc:  # never: export_all catches; belt and braces
                    log(f"export failed: {exc}")
            keep, exports = out.get("keep_evidence"), server.exports
            if keep is not None or exports is not None:
                def after_reply() -> None:  # node 0's launcher has the summary (Server.finalize)
                    if keep is not None:     # the node store, bounded (report/nextjob.py)
                        for line in keep():
                            log(f"node health: {line}")
                    if exports is not None:  # the live exports: the rest and the files, bounded, once
                        for line in exports.finish(out["summary"], out):
                            log(line)
                server.after_reply = after_reply
        return {"summary_json": out["summary_json"], "summary_txt": out["summary_txt"]}

    server = Server(settings, listener, run_dir, finalize, claim=claimed)
    server.install_signal_handlers()
    tune_gc()
    _say(f"{READY} " + json.dumps({"port": server.port, "run_dir": str(run_dir.path),
                                   "run_dir_note": run_dir.note, "pid": os.getpid()}))
    try:  # nothing more goes to stdout: the parent stops reading it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    try:
        server.serve_forever()
    except Exception:  # a bug of ours: say so, still try to leave a summary behind
        log("internal error, writing what we have:\n" + traceback.format_exc())
        try:
            server.write_outputs()
        except Exception as exc:
            log(f"could not write the summary either: {exc}")
        return 1
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
