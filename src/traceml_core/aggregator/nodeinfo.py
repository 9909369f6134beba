"""What the aggregator knows of one node: its host, how and when it joined, its launcher's end."""

from __future__ import annotations

from typing import Any, Optional


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
