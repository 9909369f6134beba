"""Node health across the user's own jobs: the evidence store, the rule, ``traceml slurm nodes``.

:func:`record` is what every run (``SlurmEnvironment.run_ended``) and every ``traceml slurm
doctor`` call: store what was measured of each node, judge every host of the cluster from the
store, and answer with the line for the next job script (``#SBATCH --exclude=...``) when a host is
bad enough. docs/node-health.md describes the store, the rule and its measured error rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from traceml_core.plugins import NextJob, RunEvidence

from .health import NodeHealth, exclude_line, judge
from .store import NodeStore

#: reasons the next-job section shows (one per excluded host; the rest: `traceml slurm nodes`)
MAX_REASONS = 8


def record(store_path: Path, cluster: Optional[str], evidence: Optional[RunEvidence]) -> tuple[list[NodeHealth], list[str]]:
    """Add ``evidence`` (None: only read) and judge every host of ``cluster``: (health, notes)."""
    store = NodeStore(store_path)
    notes = store.add(cluster or "", evidence) if evidence is not None else []
    records, more = store.records(cluster)
    return judge(records), notes + [n for n in more if n not in notes]


def next_job(health: list[NodeHealth], notes: list[str]) -> Optional[NextJob]:
    """The exclude line with its reasons, and the store's notes; None when there is nothing to say."""
    line = exclude_line(health)
    bad = [h for h in health if h.exclude]
    why = "; ".join(h.reason or f"{h.host}: {h.why}" for h in bad[:MAX_REASONS])
    if len(bad) > MAX_REASONS:
        why += f"; and {len(bad) - MAX_REASONS} more (traceml slurm nodes)"
    if line is None and not notes:
        return None
    return NextJob(lines=(line,) if line else (), why=(why,) if line else (), notes=tuple(notes),
                   excluded=tuple(h.host for h in bad))
