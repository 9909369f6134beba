"""The aggregator's side of the hang autopsy: one stack collection in flight, and its report.

Node 0's launcher decides that the run is stalled (launcher/hangwatch.py) and asks its aggregator
for an autopsy. The aggregator sends one ``stacks`` request down to every node's relay, which
passes it to its ranks: each rank's interpreter answers with every thread's stack and the
collective it has in flight (sdk/stackdump.py: on its client thread, no signal), and the relay
adds what the kernel says of each rank's process (launcher/procstate.py: stopped, gone, its CPU
time and I/O). :class:`Autopsy` gathers the answers until every expected rank has told where it
is (or is known not to be able to: stopped, gone) or the deadline passes, then builds the report with
:func:`traceml_core.report.hang.build`. The event loop never waits for it: the server checks
:meth:`Autopsy.done` on its tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..report import hang

#: the most an autopsy waits for the ranks' answers: a rank's interpreter answers in
#: milliseconds unless it cannot run (a C extension holds the GIL); the rest is the way up
#: through the relay on a loaded machine
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
    #: a reading of the hang detection (aggregator/hangwatch.py), not a report asked for
    reading: bool = False
    started: float = field(default_factory=time.monotonic)
    #: what each rank's relay read of its process (``source`` relay)
    procs: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: what each rank's interpreter said (``source`` sdk): its stacks and collective in flight
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, rank: int, data: dict[str, Any]) -> None:
        if data.get("source") == "relay":
            self.procs[rank] = data
        else:
            self.snapshots[rank] = data

    def _told(self, rank: int) -> bool:
        """Both ends answered for the rank, or its relay says the rank cannot (stopped, gone)."""
        proc = self.procs.get(rank)
        if proc is None:
            return False
        return rank in self.snapshots or proc.get("gone") is True or proc.get("state") in ("T", "t")

    def done(self, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        return all(self._told(r) for r in self.expected) or now - self.started >= DEADLINE_S

    def report(self) -> dict[str, Any]:
        rows = []
        for rank, (node, host, step) in sorted(self.expected.items()):
            rows.append({"rank": rank, "node": node, "host": host, "proc": self.procs.get(rank),
                         "snapshot": self.snapshots.get(rank), "step": step, "waited_s": DEADLINE_S})
        out = hang.build(rows, world=self.world, silent_s=self.silent_s, threshold_s=self.threshold_s,
                         threshold_source=self.threshold_source, at=time.time())
        out["records_at"] = self.records_at
        out["collect_s"] = round(time.monotonic() - self.started, 2)
        return out
