"""``--export tensorboard|jsonl``: the run's series in the tools users already have.

Both are written from the summary's ``timeline`` (see :mod:`.timeline`), by node 0's aggregator
right after the summary at the end of the run, or later by ``traceml report RUN_DIR --export
KIND``; nothing on the training hot path, and the same bounds as the report: a point per step
bucket (at most 256 per rank), every rank up to 64 ranks, beyond that 16 selected ranks plus the
minimum, median and maximum over all ranks.

* ``tensorboard``: event files under ``<run-dir>/tensorboard/``, one TensorBoard "run" per rank
  (``rank_0003``) so the ranks overlay in one chart per tag, and one per node (``node_00``):
  ``step_time_ms``, ``own_time_ms``, ``phase/<name>_ms``, ``memory/peak_mib`` per rank (x = step,
  wall time = when the bucket's last step ended); ``system/cpu_pct``, ``system/ram_used_gib``,
  ``gpu<i>/util_pct``, ``gpu<i>/mem_used_gib`` per node (x = seconds since the start). Written
  with tensorboardX (the ``tensorboard`` extra, or ``pip install tensorboardX``).
  Writing again replaces our earlier event files, never anyone else's.
* ``jsonl``: ``<run-dir>/steps.jsonl``, one JSON object per line: ``{"kind": "rank", ...}`` per
  rank and step bucket, ``{"kind": "node", ...}`` per node and time bucket; ``null`` = not measured.

Errors never propagate: each kind returns the lines to log, and a missing library or a full disk
is one of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

from ..aggregator.persist import atomic_write

TB_DIR = "tensorboard"
JSONL_NAME = "steps.jsonl"
#: our event files end with this, so a rewrite removes ours only
TB_SUFFIX = ".traceml"
_GIB = float(1 << 30)
_MIB = float(1 << 20)


def _started(summary: dict[str, Any]) -> Optional[float]:
    """The run's start as a Unix time, from the summary's ISO timestamp."""
    from datetime import datetime

    iso = (summary.get("run") or {}).get("started_at")
    if not iso:
        return None
    try:
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        return None


def _steps(tl: dict[str, Any], i: int) -> tuple[int, int]:
    w = int(tl.get("steps_per_bucket") or 1)
    return i * w, (i + 1) * w - 1


def rank_rows(summary: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One dict per rank and step bucket (the JSONL lines of kind ``rank``)."""
    tl = summary.get("timeline") or {}
    for r in tl.get("ranks") or []:
        for i in range(int(tl.get("buckets") or 0)):
            first, last = _steps(tl, i)
            row: dict[str, Any] = {"kind": "rank", "rank": r["rank"], "node": r.get("node"),
                                   "host": r.get("host"), "bucket": i, "step_first": first,
                                   "step_last": last, "t_s": r["t_s"][i], "step_ms": r["step_ms"][i],
                                   "step_max_ms": r["step_max_ms"][i], "own_ms": r["own_ms"][i]}
            for ph, vals in (r.get("phases_ms") or {}).items():
                row[f"{ph}_ms"] = vals[i]
            mem = r.get("mem_max_bytes")
            row["mem_peak_bytes"] = mem[i] if mem else None
            yield row
    env = tl.get("envelope")
    if env:
        for i in range(int(tl.get("buckets") or 0)):
            first, last = _steps(tl, i)
            row = {"kind": "all_ranks", "ranks": env.get("ranks"), "bucket": i,
                   "step_first": first, "step_last": last}
            for metric in ("step_ms", "own_ms"):
                for stat in ("min", "median", "max"):
                    row[f"{metric[:-3]}_{stat}_ms"] = env[metric][stat][i]
            yield row


def node_rows(summary: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One dict per node and time bucket (the JSONL lines of kind ``node``)."""
    for n in (summary.get("timeline") or {}).get("nodes") or []:
        for i, t in enumerate(n["t_s"]):
            row: dict[str, Any] = {"kind": "node", "node": n["node"], "host": n.get("host"),
                                   "bucket": i, "t_s": t,
                                   "cpu_pct": (n.get("cpu_pct") or [None] * (i + 1))[i],
                                   "ram_used_bytes": (n.get("ram_used_bytes") or [None] * (i + 1))[i]}
            for g in n.get("gpus") or []:
                row[f"gpu{g['index']}_util_pct"] = (g.get("util_pct") or [None] * (i + 1))[i]
                row[f"gpu{g['index']}_mem_used_bytes"] = (g.get("mem_used_bytes") or [None] * (i + 1))[i]
            yield row


def write_jsonl(summary: dict[str, Any], run_dir: Path) -> str:
    lines = [json.dumps(row, allow_nan=False, separators=(",", ":"))
             for gen in (rank_rows(summary), node_rows(summary)) for row in gen]
    target = Path(run_dir) / JSONL_NAME
    atomic_write(target, ("\n".join(lines) + ("\n" if lines else "")).encode())
    return f"jsonl export: {len(lines)} lines in {target}"


def write_tensorboard(summary: dict[str, Any], run_dir: Path) -> str:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return ("tensorboard export skipped: the tensorboardX package is not installed in this "
                "Python (pip install tensorboardX); `traceml report RUN_DIR "
                "--export tensorboard` writes it later from the summary")
    root = Path(run_dir) / TB_DIR
    for old in root.glob(f"*/events.out.tfevents.*{TB_SUFFIX}"):  # ours from an earlier export
        old.unlink()
    tl = summary.get("timeline") or {}
    t0 = _started(summary)
    n = 0

    def wall(t: Optional[float]) -> Optional[float]:
        return None if t is None or t0 is None else t0 + t

    def put(w: Any, tag: str, value: Optional[float], step: int, t: Optional[float]) -> None:
        nonlocal n
        if value is not None:
            w.add_scalar(tag, value, step, walltime=wall(t))
            n += 1

    runs = 0
    for r in tl.get("ranks") or []:
        w = SummaryWriter(str(root / f"rank_{r['rank']:04d}"), filename_suffix=TB_SUFFIX)
        try:
            mem = r.get("mem_max_bytes")
            for i in range(int(tl.get("buckets") or 0)):
                first, last = _steps(tl, i)
                step, t = (first + last) // 2, r["t_s"][i]
                put(w, "step_time_ms", r["step_ms"][i], step, t)
                put(w, "own_time_ms", r["own_ms"][i], step, t)
                for ph, vals in (r.get("phases_ms") or {}).items():
                    put(w, f"phase/{ph}_ms", vals[i], step, t)
                if mem and mem[i] is not None:
                    put(w, "memory/peak_mib", mem[i] / _MIB, step, t)
        finally:
            w.close()
        runs += 1
    env = tl.get("envelope")
    if env:
        for stat in ("min", "median", "max"):
            w = SummaryWriter(str(root / f"all_ranks_{stat}"), filename_suffix=TB_SUFFIX)
            try:
                for i in range(int(tl.get("buckets") or 0)):
                    first, last = _steps(tl, i)
                    put(w, "step_time_ms", env["step_ms"][stat][i], (first + last) // 2, None)
                    put(w, "own_time_ms", env["own_ms"][stat][i], (first + last) // 2, None)
            finally:
                w.close()
            runs += 1
    for row_node in tl.get("nodes") or []:
        w = SummaryWriter(str(root / f"node_{row_node['node']:02d}"), filename_suffix=TB_SUFFIX)
        try:
            for row in node_rows({"timeline": {"nodes": [row_node]}}):
                step, t = int(round(row["t_s"])), row["t_s"]
                put(w, "system/cpu_pct", row["cpu_pct"], step, t)
                if row["ram_used_bytes"] is not None:
                    put(w, "system/ram_used_gib", row["ram_used_bytes"] / _GIB, step, t)
                for g in row_node.get("gpus") or []:
                    put(w, f"gpu{g['index']}/util_pct", row[f"gpu{g['index']}_util_pct"], step, t)
                    mu = row[f"gpu{g['index']}_mem_used_bytes"]
                    put(w, f"gpu{g['index']}/mem_used_gib", None if mu is None else mu / _GIB, step, t)
        finally:
            w.close()
        runs += 1
    return (f"tensorboard export: {n} scalars in {runs} runs under {root} "
            f"(tensorboard --logdir {root})")


WRITERS = {"tensorboard": write_tensorboard, "jsonl": write_jsonl}


def export_summary(summary: dict[str, Any], run_dir: Path, kind: str) -> list[str]:
    """Write one export kind; returns the lines to log. Never raises."""
    fn = WRITERS.get(kind)
    if fn is None:
        return [f"export {kind!r} skipped: unknown kind (known: {', '.join(WRITERS)})"]
    if not (summary.get("timeline") or {}).get("buckets"):
        return [f"{kind} export skipped: the summary has no per-step series (no steps were "
                "measured, or an older traceml wrote it)"]
    try:
        return [fn(summary, Path(run_dir))]
    except Exception as exc:  # an export must never cost the run anything
        return [f"{kind} export failed ({type(exc).__name__}: {exc}); the summary is complete"]


def export_all(summary: dict[str, Any], run_dir: Path, kinds: list[str]) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        out += export_summary(summary, run_dir, kind)
    return out


__all__ = ["export_summary", "export_all", "rank_rows", "node_rows"]
