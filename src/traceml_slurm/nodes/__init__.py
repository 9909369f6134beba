"""Node health across the user's own jobs: the evidence store, the rule, ``traceml slurm nodes``.

A run's summary never waits on the store: before it is written, :func:`judge_with` reads the
store (a short bounded wait, skipped with a note when busy) and judges every host of the cluster
from it and this run's evidence, held in memory; after it is written, :func:`keep` adds the
run's record (``SlurmEnvironment.run_ended`` and ``keep_evidence``). A ``traceml slurm doctor``
does both at its end (:func:`record`). Evidence is first :func:`checked`: its hosts must be nodes
of the job's allocation (allocation.py) and Slurm host names. docs/node-health.md describes the
store, the rule and its measured error rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from traceml_core.plugins import NextJob, RunEvidence

from .allocation import within_allocation
from .health import NodeHealth, exclude_line, judge
from .store import WRITE_WAIT_S, NodeStore, Record, valid_evidence

#: reasons the next-job section shows (one per excluded host; the rest: `traceml slurm nodes`)
MAX_REASONS = 8


def checked(evidence: Optional[RunEvidence], job_id: Optional[str],
            job_hosts: Sequence[str]) -> tuple[Optional[RunEvidence], list[str]]:
    """``evidence`` with only the hosts Slurm gave the job and whose names are host names; notes
    that report what was left out (None: nothing to keep)."""
    if evidence is None:
        return None, []
    evidence, notes = valid_evidence(evidence)
    kept, more = within_allocation(evidence, job_id, job_hosts)
    return kept, notes + more


def judge_with(store_path: Path, cluster: Optional[str],
               evidence: Optional[RunEvidence]) -> tuple[list[NodeHealth], list[str]]:
    """Judge every host of ``cluster`` from the store and ``evidence`` (held in memory, replacing
    a stored record of the same job, run and source); reads only, waiting briefly."""
    records, notes = NodeStore(store_path).records(cluster)
    if evidence is not None:
        mine = Record(cluster or "", evidence.job_id or "", evidence.run_name, evidence.source, evidence.at,
                      tuple(sorted(set(evidence.hosts))), tuple(evidence.observations))
        records = [r for r in records if (r.job_id, r.run_name, r.source) != (mine.job_id, mine.run_name, mine.source)
                   or r.cluster != mine.cluster] + [mine]
    return judge(records), notes


def keep(store_path: Path, cluster: Optional[str], evidence: Optional[RunEvidence], *,
         wait_s: float = WRITE_WAIT_S) -> list[str]:
    """Add ``evidence`` to the store (waiting at most ``wait_s``); notes."""
    return NodeStore(store_path).add(cluster or "", evidence, wait_s=wait_s) if evidence is not None else []


def record(store_path: Path, cluster: Optional[str], evidence: Optional[RunEvidence]) -> tuple[list[NodeHealth], list[str]]:
    """Add ``evidence`` (None: only read) and judge every host of ``cluster``: (health, notes)."""
    notes = keep(store_path, cluster, evidence)
    health, more = judge_with(store_path, cluster, evidence)
    return health, notes + [n for n in more if n not in notes]


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
