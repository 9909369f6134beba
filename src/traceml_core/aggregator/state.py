"""The whole aggregate of one run: ranks, nodes, system evidence, counters and the launcher's finish.

``aggregator/adapter.py`` reads it as typed run data (:class:`~traceml_core.rundata.RunData`),
which checkpoints store through the one codec, so a summary rebuilt from a checkpoint after the
aggregator died goes through exactly the same code as the live one.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..rundata import HangReport, LaunchEnd, NodeData, RunData
from ..statistics.series import run_buckets
from ..wire.server import SERVER_COUNTERS as COUNTERS
from .rankstate import TAIL_RECORDS, RankState
from .resume import seed_node, seed_rank
from .settings import AggregatorSettings
from .system import NodeSystem


#: the run's counter of values refused where they entered (wire/frames.measured), beside the
#: framed server's counters
VALUES_REFUSED = "values_refused"


class RunState:
    def __init__(self, settings: AggregatorSettings) -> None:
        self.settings = settings
        self.aggregator_started_at = time.time()
        self.tail_records = 0 if settings.mode == "summary" else TAIL_RECORDS
        self.ranks: dict[int, RankState] = {}
        self.nodes: dict[int, NodeData] = {}
        self.system: dict[int, NodeSystem] = {}
        self.counters = dict.fromkeys((*COUNTERS, VALUES_REFUSED), 0)
        self.finish: Optional[LaunchEnd] = None
        self.run_dir_note: Optional[str] = None
        #: hang reports, oldest first (aggregator/autopsy.py); kept in checkpoints and the summary
        self.hangs: list[HangReport] = []
        #: the link probe's section from node 0's launcher (``probe`` frame), or None
        self.probe: Optional[dict[str, Any]] = None
        self.records = 0
        self.dirty = True
        #: buckets per rank's series (fewer for very large runs: statistics/series.run_buckets)
        self.buckets = run_buckets(settings.world_size)
        #: a restarted aggregator: the checkpoint it went on from (aggregator/resume.py)
        self.base: Optional[RunData] = None

    def rank(self, rank: int) -> RankState:
        rs = self.ranks.get(rank)
        if rs is None:
            rs = self.ranks[rank] = RankState(rank, self.tail_records, self.buckets)
        return rs

    def node(self, node: int) -> NodeData:
        ni = self.nodes.get(node)
        if ni is None:
            ni = self.nodes[node] = NodeData(node)
        return ni

    def node_system(self, node: int) -> NodeSystem:
        ns = self.system.get(node)
        if ns is None:
            ns = self.system[node] = NodeSystem(node)
        return ns

    def note_join(self, node: int, host: str, via: str, now: float) -> None:
        ni = self.node(node)
        if host and (not ni.host or via != "rank"):
            ni.host = host
        if ni.joined_at is None:
            ni.joined_at = now
            ni.via = via
        elif via != "rank" and ni.via == "rank":
            ni.via = via

    def go_on_from(self, base: RunData) -> None:
        """A restarted aggregator: start where the checkpoint ``base`` left off (resume.py)."""
        self.base = base
        self.records = base.records
        for r in base.ranks:
            seed_rank(self.rank(r.rank), r, self.buckets)
        for n in base.nodes:
            seed_node(self.node(n.node), n)
