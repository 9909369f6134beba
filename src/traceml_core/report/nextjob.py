"""The summary's ``next_job``: lines for the user's next job script, and why.

Two sources, each in its own place: the verdicts' own fix lines (an input-bound run's CPU request,
``evidence.cpu.fix_lines``: report/cpubinding.py), and the cluster plugin, which node 0's aggregator
hands what the run measured of each node (report/nodeevidence.py) and which answers with lines
from the user's history of those nodes (``ClusterEnvironment.run_ended``; the Slurm plugin's
node health, ``traceml_slurm/nodes``). A verdict whose culprit is a node the plugin excludes ends
in the line, so the advice of a slow-node run ends in something to paste.

:func:`amend` adds it to the typed summary in place and never raises: a plugin that fails costs a
note, not the summary. The plugin only reads on the summary's path (``run_ended``); the run's
evidence is kept by the function :func:`amend` returns, which node 0's aggregator calls once the
summary is written (``keep_evidence``): a store that is slow or busy never delays the summary.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from .document import NextJobSection, Summary

#: keeps the run's node evidence after the summary is written; returns notes for the log
Keep = Callable[[], list[str]]


def amend(summary: Summary, cluster: str = "") -> Optional[Keep]:
    """Add ``next_job`` to a final summary: the verdicts' fix lines, then the cluster plugin's.
    Returns what keeps the run's node evidence, to call after the summary is written (None: no
    plugin)."""
    section = NextJobSection()
    keep: Optional[Keep] = None
    for v in summary.verdicts:
        ev = v.evidence.get("cpu") or {}  # the input-bound verdict's CPU cause
        for line, why in zip(ev.get("fix_lines") or [], ev.get("fix_why") or []):
            if line not in section.lines:
                section.lines.append(line)
                section.why.append(why)
    if cluster and cluster != "none":
        keep = _from_plugin(summary, cluster, section)
    if section:
        summary.next_job = section
    return keep


def _from_plugin(summary: Summary, cluster: str, section: NextJobSection) -> Optional[Keep]:
    try:
        from ..plugins import load_cluster_environment
        from .nodeevidence import run_evidence

        cls = load_cluster_environment(cluster)
        if cls is None:
            return None
        plugin, evidence = cls(), run_evidence(summary)
        answer = plugin.run_ended(evidence, os.environ)
    except Exception as exc:  # noqa: BLE001 - the plugin must never cost the summary
        section.notes.append(f"the {cluster} plugin could not judge this run's nodes "
                             f"({type(exc).__name__}: {str(exc)[:200]})")
        _warn(section.notes[-1])
        return None

    def keep() -> list[str]:
        try:
            return list(plugin.keep_evidence(evidence, os.environ))
        except Exception as exc:  # noqa: BLE001 - after the summary: a note in the log, nothing more
            return [f"the {cluster} plugin could not keep this run's node evidence ({type(exc).__name__}: "
                    f"{str(exc)[:200]})"]
    if answer is not None:
        _use(answer, summary, section)
    return keep


def _use(answer: Any, summary: Summary, section: NextJobSection) -> None:
    """The plugin's answer into the section; a verdict naming an excluded host ends in the line."""
    section.notes += list(answer.notes)
    for line, why in zip(answer.lines, answer.why):
        if line not in section.lines:
            section.lines.append(line)
            section.why.append(why)
    if not answer.excluded:
        return
    line = next((ln for ln in answer.lines if "--exclude" in ln), None)
    for v in summary.verdicts:
        host = (v.culprit or {}).get("host")
        if line and host in answer.excluded and line not in v.next_step:
            v.next_step = f"{v.next_step}; in the next job script: {line}".lstrip("; ")


def _warn(text: str) -> None:
    try:
        sys.stderr.write(f"traceml: warning: {text}\n")
    except (OSError, ValueError):
        pass
