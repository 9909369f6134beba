"""``traceml slurm nodes``: each host's health from the user's node store, and the line to exclude the bad ones."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from ..facts import Facts
from . import record
from .health import BAD_SHARE, MIN_BAD_JOBS, RECENT_JOBS, WINDOW_DAYS, NodeHealth, exclude_line
from .store import OFF

DESCRIPTION = f"""\
Each host's health from your node store: what your runs (`traceml run` under Slurm) and
`traceml slurm doctor` measured of it, compared with the other nodes of the same job. A host is
excluded when it was worse than its peers in at least {MIN_BAD_JOBS} of its last {RECENT_JOBS} jobs
(and in at least {BAD_SHARE:.0%} of them) in the last {WINDOW_DAYS:.0f} days, or showed a hardware fault
once. The last line is what to paste into your next sbatch script."""


def add_nodes_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("nodes", help="node health across your jobs, and the #SBATCH --exclude line",
                       description=DESCRIPTION)
    p.add_argument("--json", action="store_true", help="print JSON (only JSON on stdout)")
    p.add_argument("--store", metavar="PATH", default=None,
                   help="the node store [default: $TRACEML_NODE_STORE, else ~/.cache/traceml/nodes.sqlite; "
                        "TRACEML_NODE_STORE=off turns it off]")
    p.add_argument("--cluster", metavar="NAME", default=None,
                   help="hosts of this Slurm cluster only [default: $SLURM_CLUSTER_NAME, else every cluster in the store]")
    p.add_argument("--all", action="store_true", help="also hosts with no job in the window")
    return p


def run_nodes(ns: argparse.Namespace) -> int:
    facts = Facts.of(os.environ)
    path = Path(ns.store).expanduser() if ns.store else facts.node_store
    if path == OFF:
        text = "the node store is off (TRACEML_NODE_STORE=off): no node health is kept or judged"
        sys.stdout.write(json.dumps({"store": None, "off": True, "nodes": [], "exclude": [], "line": None,
                                     "notes": [text]}, indent=2) + "\n" if ns.json else text + "\n")
        return 0
    cluster = ns.cluster if ns.cluster is not None else (facts.cluster_name or None)
    health, notes = record(path, cluster, None)
    shown = [h for h in health if ns.all or h.jobs]
    line = exclude_line(health)
    if ns.json:
        sys.stdout.write(json.dumps({
            "store": str(path), "cluster": cluster, "window_days": WINDOW_DAYS, "recent_jobs": RECENT_JOBS,
            "min_bad_jobs": MIN_BAD_JOBS, "bad_share": BAD_SHARE, "nodes": [h.to_json() for h in shown],
            "exclude": [h.host for h in health if h.exclude], "line": line, "notes": notes}, indent=2) + "\n")
        return 0
    sys.stdout.write(render(path, cluster, shown, line, notes))
    return 0


def render(path: Path, cluster: Optional[str], health: list[NodeHealth], line: Optional[str],
           notes: list[str]) -> str:
    out = [f"Node health from {path}" + (f" (cluster {cluster})" if cluster else "")
           + f": each host's last {RECENT_JOBS} jobs in the last {WINDOW_DAYS:.0f} days"]
    for n in notes:
        out.append(f"note: {n}")
    if not health:
        out.append("  no evidence yet: every `traceml run` and `traceml slurm doctor` inside a Slurm job adds "
                   "to it")
        return "\n".join(out) + "\n"
    width = max(len(h.host) for h in health)
    multi = len({h.cluster for h in health}) > 1
    out.append(f"  {'host':<{width}}  score  jobs  bad  {'':7}  why")
    for h in health:
        score = "   - " if h.score is None else f"{h.score:5.2f}"
        name = f"{h.host}" + (f"@{h.cluster}" if multi and h.cluster else "")
        seen = time.strftime("%b %d", time.localtime(h.last_seen)) if h.last_seen else "?"
        out.append(f"  {name:<{width}}  {score}  {h.jobs:4d}  {h.bad_jobs:3d}  "
                   f"{'EXCLUDE' if h.exclude else '':7}  {h.why} (last seen {seen})")
    if line:
        out.append("Next job script (paste into your sbatch script):")
        out.append(f"  {line}")
    else:
        out.append("No host is bad enough to exclude.")
    return "\n".join(out) + "\n"
