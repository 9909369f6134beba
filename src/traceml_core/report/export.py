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
from typing import Any, Iterator, Optional, Union

from ..rundir import atomic_write
from .document import NodeSeries, Summary, Timeline

TB_DIR = "tensorboard"
JSONL_NAME = "steps.jsonl"
#: our event files end with this, so a rewrite removes ours only
TB_SUFFIX = ".traceml"
_GIB = float(1 << 30)
_MIB = float(1 << 20)


def _started(doc: Summary) -> Optional[float]:
    """The run's start as a Unix time, from the summary's ISO timestamp."""
    from datetime import datetime

    iso = doc.run.started_at
    if not iso:
        return None
    try:
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        return None


def _doc(summary: Union[Summary, dict[str, Any]]) -> Summary:
    return summary if isinstance(summary, Summary) else Summary.from_json(summary)


def _at(values: Optional[list[Any]], i: int) -> Any:
    return values[i] if values and i < len(values) else None


def rank_rows(summary: Union[Summary, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One dict per rank and step bucket (the JSONL lines of kind ``rank``)."""
    tl = _doc(summary).timeline or Timeline()
    for r in tl.ranks:
        for i in range(tl.buckets):
            first, last = tl.step_range(i)
            row: dict[str, Any] = {"kind": "rank", "rank": r.rank, "node": r.node, "host": r.host,
                                   "bucket": i, "step_first": first, "step_last": last,
                                   "t_s": r.t_s[i], "step_ms": r.step_ms[i],
                                   "step_max_ms": r.step_max_ms[i], "own_ms": r.own_ms[i]}
            for ph, vals in r.phases_ms.items():
                row[f"{ph}_ms"] = vals[i]
            row["mem_peak_bytes"] = _at(r.mem_max_bytes, i)
            yield row
    env = tl.envelope
    if env:
        for i in range(tl.buckets):
            first, last = tl.step_range(i)
            row = {"kind": "all_ranks", "ranks": env.ranks, "bucket": i,
                   "step_first": first, "step_last": last}
            for metric, series in (("step_ms", env.step_ms), ("own_ms", env.own_ms)):
                for stat in ("min", "median", "max"):
                    row[f"{metric[:-3]}_{stat}_ms"] = series[stat][i]
            yield row


def _node_rows(n: NodeSeries) -> Iterator[dict[str, Any]]:
    for i, t in enumerate(n.t_s):
        row: dict[str, Any] = {"kind": "node", "node": n.node, "host": n.host, "bucket": i, "t_s": t,
                               "cpu_pct": _at(n.cpu_pct, i), "ram_used_bytes": _at(n.ram_used_bytes, i)}
        for g in n.gpus:
            row[f"gpu{g.index}_util_pct"] = _at(g.util_pct, i)
            row[f"gpu{g.index}_mem_used_bytes"] = _at(g.mem_used_bytes, i)
        yield row


def node_rows(summary: Union[Summary, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One dict per node and time bucket (the JSONL lines of kind ``node``)."""
    for n in (_doc(summary).timeline or Timeline()).nodes:
        yield from _node_rows(n)


def write_jsonl(doc: Summary, run_dir: Path) -> str:
    lines = [json.dumps(row, allow_nan=False, separators=(",", ":"))
             for gen in (rank_rows(doc), node_rows(doc)) for row in gen]
    target = Path(run_dir) / JSONL_NAME
    atomic_write(target, ("\n".join(lines) + ("\n" if lines else "")).encode())
    return f"jsonl export: {len(lines)} lines in {target}"


def write_tensorboard(doc: Summary, run_dir: Path) -> str:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return ("tensorboard export skipped: the tensorboardX package is not installed in this "
                "Python (pip install tensorboardX); `traceml report RUN_DIR "
                "--export tensorboard` writes it later from the summary")
    root = Path(run_dir) / TB_DIR
    for old in root.glob(f"*/events.out.tfevents.*{TB_SUFFIX}"):  # ours from an earlier export
        old.unlink()
    tl = doc.timeline or Timeline()
    t0 = _started(doc)
    n = 0

    def wall(t: Optional[float]) -> Optional[float]:
        return None if t is None or t0 is None else t0 + t

    def put(w: Any, tag: str, value: Optional[float], step: int, t: Optional[float]) -> None:
        nonlocal n
        if value is not None:
            w.add_scalar(tag, value, step, walltime=wall(t))
            n += 1

    runs = 0
    for r in tl.ranks:
        w = SummaryWriter(str(root / f"rank_{r.rank:04d}"), filename_suffix=TB_SUFFIX)
        try:
            for i in range(tl.buckets):
                first, last = tl.step_range(i)
                step, t = (first + last) // 2, r.t_s[i]
                put(w, "step_time_ms", r.step_ms[i], step, t)
                put(w, "own_time_ms", r.own_ms[i], step, t)
                for ph, vals in r.phases_ms.items():
                    put(w, f"phase/{ph}_ms", vals[i], step, t)
                mem = _at(r.mem_max_bytes, i)
                if mem is not None:
                    put(w, "memory/peak_mib", mem / _MIB, step, t)
        finally:
            w.close()
        runs += 1
    env = tl.envelope
    if env:
        for stat in ("min", "median", "max"):
            w = SummaryWriter(str(root / f"all_ranks_{stat}"), filename_suffix=TB_SUFFIX)
            try:
                for i in range(tl.buckets):
                    first, last = tl.step_range(i)
                    put(w, "step_time_ms", env.step_ms[stat][i], (first + last) // 2, None)
                    put(w, "own_time_ms", env.own_ms[stat][i], (first + last) // 2, None)
            finally:
                w.close()
            runs += 1
    for node in tl.nodes:
        w = SummaryWriter(str(root / f"node_{node.node:02d}"), filename_suffix=TB_SUFFIX)
        try:
            for row in _node_rows(node):
                step, t = int(round(row["t_s"])), row["t_s"]
                put(w, "system/cpu_pct", row["cpu_pct"], step, t)
                if row["ram_used_bytes"] is not None:
                    put(w, "system/ram_used_gib", row["ram_used_bytes"] / _GIB, step, t)
                for g in node.gpus:
                    put(w, f"gpu{g.index}/util_pct", row[f"gpu{g.index}_util_pct"], step, t)
                    mu = row[f"gpu{g.index}_mem_used_bytes"]
                    put(w, f"gpu{g.index}/mem_used_gib", None if mu is None else mu / _GIB, step, t)
        finally:
            w.close()
        runs += 1
    return (f"tensorboard export: {n} scalars in {runs} runs under {root} "
            f"(tensorboard --logdir {root})")


WRITERS = {"tensorboard": write_tensorboard, "jsonl": write_jsonl}


def export_summary(summary: Union[Summary, dict[str, Any]], run_dir: Path, kind: str) -> list[str]:
    """Write one export kind; returns the lines to log. Never raises."""
    fn = WRITERS.get(kind)
    if fn is None:
        return [f"export {kind!r} skipped: unknown kind (known: {', '.join(WRITERS)})"]
    try:
        doc = _doc(summary)
    except Exception as exc:  # an export must never cost the run anything
        return [f"{kind} export failed ({type(exc).__name__}: {exc}); the summary is complete"]
    if not (doc.timeline and doc.timeline.buckets):
        return [f"{kind} export skipped: the summary has no per-step series (no steps were "
                "measured, or an older traceml wrote it)"]
    try:
        return [fn(doc, Path(run_dir))]
    except Exception as exc:  # an export must never cost the run anything
        return [f"{kind} export failed ({type(exc).__name__}: {exc}); the summary is complete"]


def export_all(summary: Union[Summary, dict[str, Any]], run_dir: Path, kinds: list[str]) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        out += export_summary(summary, run_dir, kind)
    return out


__all__ = ["export_summary", "export_all", "rank_rows", "node_rows"]
