"""The last resort around the summary builder: a run always gets a summary.

:func:`~.summary.build_summary` reads every part of the run's data; one value it cannot handle
(a NaN from a checkpoint written before the wire checked for them, a bug of ours on a shape
nobody foresaw) must not cost the run its summary, the launcher its exit status, or
``traceml summarize`` its answer. :func:`last_resort` is what ``report/output.py`` calls when
building or serialising the summary raised:

1. the run's data with every non-finite float (NaN, infinity) replaced by ``None`` ("not
   measured") goes through the builder again; when that works the summary is whole but for those
   values, and says how many there were;
2. otherwise a *partial* summary is written from what can be read without the builder: the run,
   its end as the launcher reported it, the topology, each rank's identity, ending and record
   count, the wire's counters. Its ``partial`` block names the error and what is missing.

Both carry ``partial`` (``{"whole", "error", "missing"}``) and say so in ``notes`` and at the top
of the text, so no reader mistakes them for a complete summary.
"""

from __future__ import annotations

import math
from typing import Any, Optional

#: what a summary built without the builder lacks (the sections a reader looks for)
MISSING_SECTIONS = ("step_time", "phases and per-rank statistics", "verdicts", "failure diagnosis",
                    "communication", "device", "system", "timeline", "compare")


def finite(obj: Any) -> tuple[Any, int]:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) with non-finite floats replaced by None,
    and how many there were. Anything else is kept as it is."""
    count = 0

    def walk(o: Any) -> Any:
        nonlocal count
        if type(o) is float:
            if math.isfinite(o):
                return o
            count += 1
            return None
        if type(o) is dict:
            return {k: walk(v) for k, v in o.items()}
        if type(o) in (list, tuple):
            return [walk(v) for v in o]
        return o

    return walk(obj), count


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def last_resort(data: dict[str, Any], exc: BaseException, *, files: dict[str, Any],
                rebuilt: Optional[dict[str, Any]], provisional: bool) -> dict[str, Any]:
    """The summary to write when the builder (or writing its JSON) raised ``exc``: the whole
    summary of the data without its non-finite values when that can be built, else the partial
    one. Never raises."""
    from ..codec import decode
    from ..rundata import RunData
    from .summary_file import dumps
    from .summary import build_summary

    clean, bad = finite(data)
    error = _describe(exc)
    if bad:
        try:
            summary = build_summary(decode(RunData, clean), files=files, rebuilt=rebuilt,
                                    provisional=provisional)
            dumps(summary)
            note = (f"{bad:,} value(s) of the run's data were not finite numbers (NaN or infinity) and "
                    "are left out as not measured; the rest of the summary is whole")
            summary["partial"] = {"whole": True, "error": error, "missing": [note]}
            summary["notes"] = [note] + list(summary.get("notes") or [])
            return summary
        except Exception as again:  # noqa: BLE001 - fall through to what can be read plainly
            error = f"{error}; then, without the non-finite values: {_describe(again)}"
    return partial_summary(clean, error, files=files, rebuilt=rebuilt, provisional=provisional)


def _get(d: Any, key: str, default: Any = None) -> Any:
    return d.get(key, default) if isinstance(d, dict) else default


def partial_summary(data: dict[str, Any], error: str, *, files: dict[str, Any],
                    rebuilt: Optional[dict[str, Any]], provisional: bool) -> dict[str, Any]:
    """What can be said without the builder, each part read defensively (a part that cannot be
    read is left out and named in ``missing``)."""
    from .summary import SCHEMA_VERSION, iso

    missing = list(MISSING_SECTIONS)
    s = _get(data, "settings") or {}
    finish = _get(data, "finish")
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "provisional": provisional, "rebuilt": rebuilt,
                           "partial": {"whole": False, "error": error, "missing": missing}}
    ranks: list[dict[str, Any]] = []
    try:
        for r in _get(data, "ranks") or []:
            bye = _get(r, "bye") or {}
            ranks.append({"rank": r["rank"], "node": _get(r, "node"), "host": _get(r, "host") or "",
                          "status": _get(bye, "status") or ("running" if _get(r, "connected") else None),
                          "received": _get(r, "received"), "error": _get(bye, "error")})
    except Exception:  # noqa: BLE001
        missing.insert(0, "ranks")
        ranks = []
    try:
        started = _get(s, "started_at")
        ended = _get(finish, "at") or _get(rebuilt, "taken_at")
        out["run"] = {"name": s["run_name"], "job_id": _get(s, "job_id"), "mode": _get(s, "mode"),
                      "script": _get(s, "script") or None, "started_at": iso(started), "ended_at": iso(ended),
                      "status": _status(finish, ranks, provisional),
                      "exit_code": _get(finish, "exit_code"), "reason": _get(finish, "reason") or "",
                      "finish_reported_by": _get(finish, "source")}
    except Exception:  # noqa: BLE001
        missing.insert(0, "run")
    try:
        nnodes, nproc = int(s["nnodes"]), int(s["nproc_per_node"])
        out["topology"] = {"nnodes": nnodes, "nproc_per_node": nproc, "world_size": nnodes * nproc,
                           "nodes": [{"node": _get(n, "node"), "hostname": _get(n, "host") or None,
                                      "joined": _get(n, "joined_at") is not None,
                                      "exit_code": _get(_get(n, "bye"), "exit_code")}
                                     for n in _get(data, "nodes") or []]}
    except Exception:  # noqa: BLE001
        missing.insert(0, "topology")
    out["ranks"] = ranks
    try:
        received = sum(int(r["received"] or 0) for r in ranks)
    except Exception:  # noqa: BLE001
        received = None
    out["telemetry"] = {"records_received": received, "complete": False,
                        "aggregator_restarts": _get(data, "resumed", 0),
                        "wire": dict(_get(data, "counters") or {})}
    out["hangs"] = list(_get(data, "hangs") or [])
    out["files"] = files
    note = ("this summary is partial: building it failed (" + error + "); it holds what could be read "
            "without the builder. Missing: " + ", ".join(missing) + ". `traceml summarize RUN_DIR` "
            "rebuilds it from the checkpoint")
    out["notes"] = [n for n in (note, _get(data, "run_dir_note")) if n]
    return out


def _status(finish: Optional[dict[str, Any]], ranks: list[dict[str, Any]], provisional: bool) -> str:
    """The run's status by the summary's own rule, from the ranks' goodbyes."""
    from ..codec import decode
    from ..rundata import LaunchEnd
    from .model import RankSummary
    from .status import run_status

    try:
        return run_status(None if finish is None else decode(LaunchEnd, finish),
                           [RankSummary(rank=r["rank"], node=r["node"], host=r["host"], local_rank=None,
                                        status=r["status"] or "vanished") for r in ranks], provisional)
    except Exception:  # noqa: BLE001
        return "unknown"


def render_partial(summary: dict[str, Any]) -> str:
    """The text of a partial summary (render_txt needs the sections it lacks)."""
    run = summary.get("run") or {}
    lines = [f"TraceML summary (PARTIAL) - run {run.get('name', '?')}"
             + (f", job {run['job_id']}" if run.get("job_id") else ""),
             f"status: {run.get('status', 'unknown')}"
             + (f" (exit code {run['exit_code']})" if run.get("exit_code") is not None else "")
             + (f": {run['reason']}" if run.get("reason") else "")]
    for r in summary.get("ranks") or []:
        lines.append(f"  rank {r['rank']} (node {r['node']}, {r['host'] or '?'}): {r['status'] or 'unknown'}, "
                     f"{r['received'] if r['received'] is not None else '?'} step records")
    tel = summary.get("telemetry") or {}
    wire = {k: v for k, v in (tel.get("wire") or {}).items() if v and k not in ("connections", "replaced")}
    if wire:
        lines.append("  wire: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in wire.items()))
    lines += [f"note: {n}" for n in summary.get("notes") or []]
    return "\n".join(lines) + "\n"
