"""``--export tensorboard``: TensorBoard event files of the run's series, at the end.

Event files under ``<run-dir>/tensorboard/`` (``--tensorboard-dir`` elsewhere), one TensorBoard
"run" per rank (``rank_0003``) so the ranks overlay in one chart per tag, and one per node
(``node_00``): ``step_time_ms``, ``own_time_ms``, ``phase/<name>_ms``, ``memory/peak_mib`` per rank
(x = the run's global step, wall time = when the bucket's last step ended); ``system/cpu_pct``,
``system/ram_used_gib``, ``gpu<i>/util_pct``, ``gpu<i>/mem_used_gib`` per node (x = seconds since
the start). Written from the summary's timeline by node 0's aggregator right after the summary, or
later by ``traceml report RUN_DIR --export tensorboard``, with tensorboardX (the ``tensorboard``
extra). Writing again replaces our earlier event files, never anyone else's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..optionrow import Option

if TYPE_CHECKING:
    from ..report.document import Summary
    from .hub import Exporter

TB_DIR = "tensorboard"
#: our event files end with this, so a rewrite removes ours only
TB_SUFFIX = ".traceml"
_GIB = float(1 << 30)
_MIB = float(1 << 20)


class TensorboardOutput:
    """The output (exporters/output.py): plain class attributes, no dataclass: the registry
    is read by every `traceml` command, and each dataclass costs its generated methods."""

    kind: str = "tensorboard"
    live: bool = False
    where: str = "`<run-dir>/tensorboard/`"
    extra: str = "tensorboard"
    leaves: tuple[str, ...] = (TB_DIR,)
    options: tuple[Option, ...] = ()

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        raise NotImplementedError("tensorboard is written at the end")

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        return write_tensorboard(summary, run_dir)


OUTPUT = TensorboardOutput()


def write_tensorboard(doc: "Summary", run_dir: Path) -> str:
    from ..report.document import Timeline
    from ..report.export import at, node_series_rows, started
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
    t0 = started(doc)
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
                mem = at(r.mem_max_bytes, i)
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
            for row in node_series_rows(node):
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
