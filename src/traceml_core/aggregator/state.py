"""The whole aggregate of one run: ranks, nodes, system evidence, counters and the launcher's finish.

:meth:`RunState.to_data` turns it into plain data (dicts, lists, ints, bytes). That one shape is
what checkpoints store, and the report reads it as typed run data (``RunData.from_checkpoint``,
through ``aggregator/adapter.py``), so a summary rebuilt from a checkpoint after the aggregator
died goes through exactly the same code as the live one.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..wire.protocol import DURATION_COLUMNS
from ..wire.server import SERVER_COUNTERS as COUNTERS
from .rankstate import TAIL_RECORDS, RankState
from .settings import AggregatorSettings
from .system import NodeSystem


#: the run's counter of values refused where they entered (wire/frames.measured), beside the
#: framed server's counters
VALUES_REFUSED = "values_refused"


class NodeInfo:
    __slots__ = ("node", "host", "joined_at", "via", "nproc", "connected", "left_at", "bye", "lifecycle")

    def __init__(self, node: int) -> None:
        self.node = node
        self.host = ""
        self.joined_at: Optional[float] = None
        self.via = ""  # "control" (node 0's launcher), "node" (a node launcher) or "rank"
        self.nproc: Optional[int] = None
        self.connected = False  # a node/control connection is open
        self.left_at: Optional[float] = None  # its launcher connection closed without a bye
        self.bye: Optional[dict[str, Any]] = None  # the node launcher's own end (exit code)
        #: when its launch entered each phase (wire/frames.launch_lifecycle), from its bye or,
        #: node 0, its finish
        self.lifecycle: Optional[dict[str, Any]] = None

    def to_data(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "joined_at": self.joined_at, "via": self.via,
                "nproc": self.nproc, "connected": self.connected, "left_at": self.left_at,
                "bye": self.bye, "lifecycle": self.lifecycle}


class RunState:
    def __init__(self, settings: AggregatorSettings) -> None:
        self.settings = settings
        self.aggregator_started_at = time.time()
        self.tail_records = 0 if settings.mode == "summary" else TAIL_RECORDS
        self.ranks: dict[int, RankState] = {}
        self.nodes: dict[int, NodeInfo] = {}
        self.system: dict[int, NodeSystem] = {}
        self.counters = dict.fromkeys((*COUNTERS, VALUES_REFUSED), 0)
        self.finish: Optional[dict[str, Any]] = None
        self.run_dir_note: Optional[str] = None
        #: hang reports, oldest first (aggregator/autopsy.py); kept in checkpoints and the summary
        self.hangs: list[dict[str, Any]] = []
        #: the link probe's section from node 0's launcher (``probe`` frame), or None
        self.probe: Optional[dict[str, Any]] = None
        self.records = 0
        self.dirty = True
        #: ranks holding frames whose statistics are not computed yet (see RankState.flush)
        self.unflushed: set[RankState] = set()
        #: a restarted aggregator: the checkpoint it went on from (aggregator/resume.py)
        self.base: Optional[dict[str, Any]] = None

    def flush(self) -> None:
        """Compute the statistics of every pending frame (before a snapshot, checkpoint, summary)."""
        todo, self.unflushed = self.unflushed, set()
        for rs in todo:
            self.flush_rank(rs)

    def flush_rank(self, rs: RankState) -> None:
        self.unflushed.discard(rs)
        rejected = rs.flush()
        if rejected:
            self.records -= rejected
            self.counters["malformed"] += 1

    def rank(self, rank: int) -> RankState:
        rs = self.ranks.get(rank)
        if rs is None:
            rs = self.ranks[rank] = RankState(rank, self.tail_records, self.settings.sketch_sample_cap)
        return rs

    def node(self, node: int) -> NodeInfo:
        ni = self.nodes.get(node)
        if ni is None:
            ni = self.nodes[node] = NodeInfo(node)
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

    def to_data(self) -> dict[str, Any]:
        """Plain data; for a restarted aggregator, combined with the checkpoint it went on from."""
        from .resume import combine

        return combine(self.base, {
            "settings": self.settings.public(),
            "aggregator_started_at": self.aggregator_started_at,
            "phases": list(DURATION_COLUMNS),
            "ranks": [self.ranks[r].to_data() for r in sorted(self.ranks)],
            "nodes": [self.nodes[n].to_data() for n in sorted(self.nodes)],
            "system": [self.system[n].to_data() for n in sorted(self.system)],
            "counters": dict(self.counters),
            "records": self.records,
            "finish": self.finish,
            "run_dir_note": self.run_dir_note,
            "hangs": list(self.hangs),
            "probe": self.probe,
        })
