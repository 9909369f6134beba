"""The aggregator's side of the hang autopsy: one stack collection in flight, and its report.

Node 0's launcher decides that the run is stalled (launcher/hangwatch.py) and asks its aggregator
for an autopsy. The aggregator sends one ``stacks`` request down to every node's relay; each relay
makes its ranks dump their stacks (launcher/stacks.py: faulthandler, answered in C) and sends each
dump up as that rank's answer, while each rank's interpreter, when it still runs, answers with
the collective it has in flight (sdk/stackdump.py). :class:`Autopsy` gathers the answers until
every expected rank's dump is in or the deadline passes, then builds the report with
:func:`traceml_core.report.hang.build`. The event loop never waits for it: the server checks
:meth:`Autopsy.done` on its tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..report import hang

#: the most an autopsy waits for the ranks' dumps (a node's collector takes at most 3 s; the
#: rest is the way up through the relay)
DEADLINE_S = 6.0


@dataclass
class Autopsy:
    req_id: int
    #: rank -> (node, host, step count so far)
    expected: dict[int, tuple[Optional[int], str, Optional[int]]]
    world: int
    silent_s: float
    threshold_s: float
    threshold_source: str
    records_at: int
    started: float = field(default_factory=time.monotonic)
    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, rank: int, data: dict[str, Any]) -> None:
        if data.get("source") == "faulthandler":
            self.dumps[rank] = data
        else:
            self.snapshots[rank] = data

    def done(self, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        return all(r in self.dumps for r in self.expected) or now - self.started >= DEADLINE_S

    def report(self) -> dict[str, Any]:
        rows = []
        for rank, (node, host, step) in sorted(self.expected.items()):
            dump = self.dumps.get(rank) or {"ok": False, "text": "",
                                            "error": f"no dump reached node 0 within {DEADLINE_S:.0f} s"}
            rows.append({"rank": rank, "node": node, "host": host, "dump": dump,
                         "snapshot": self.snapshots.get(rank), "step": step})
        out = hang.build(rows, world=self.world, silent_s=self.silent_s, threshold_s=self.threshold_s,
                         threshold_source=self.threshold_source, at=time.time())
        out["records_at"] = self.records_at
        out["collect_s"] = round(time.monotonic() - self.started, 2)
        return out
