"""The phases of one node's launch, and the record of when each began.

Every ``traceml run`` process (a node's launcher, or one rank's task in the task layout) goes
through the same phases, in this order, driven by :class:`~.run.NodeLaunch`:

``preflight``
    Refuse a launch that cannot work before anything starts: the script exists, the workers'
    Python imports torch (the torchrun starter asks the torchrun process itself), the worker count
    fits the GPUs (:mod:`.preflight`). A failure ends the launch here with exit status 2, and
    nothing is left behind: no aggregator, no run directory.
``telemetry_up``
    Bring this process's telemetry duties up: node 0's aggregator (:mod:`.keeper`), the node's
    relay and its link to node 0, the system samples and the link probe (:mod:`.nodelink`).
    Telemetry trouble here never stops training, except a clash on node 0's own port, which is
    reported before any worker starts.
``training``
    The workers run (:mod:`.starters`); one monitor loop waits for them and, on node 0, keeps
    the aggregator alive and runs the watchdog (:mod:`.watchdog`: nodes that never join or
    vanish, hung ranks, hang reports).
``finishing``
    The workers have ended. In the task layout rank 0 waits (bounded) for the other ranks; then
    the launcher judges the run (:func:`.outcome.judge`), and node 0 asks its aggregator for the
    summary while the other nodes say ``bye`` with their worker report.
``done``
    The exit status is known.

Phases only move forward; any phase but ``done`` may end the launch early (a pre-flight refusal,
a signal before training, an exception), which goes straight to ``done``.

:class:`LifecycleRecord` keeps when each phase began (wall-clock seconds, so node 0 can line up
every node's record), when this node's relay first received a step record, and two facts from the
cluster plugin: when the allocation started and how often the job was requeued. It travels to
node 0 with the launcher's worker report, in its ``finish`` (node 0) or ``bye`` (other nodes), so
it holds the phases up to ``finishing``; the launcher's exit follows within the summary's (or the
goodbye's) own time. See docs/wire-protocol.md; node 0 keeps each node's record in its run data
(``rundata.LaunchLifecycle``) and the summary's ``topology.nodes[].lifecycle``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from ..wire.protocol import LAUNCH_PHASES


class Phase(str, Enum):
    """The phases, in order; their names are the wire's (wire/protocol.LAUNCH_PHASES)."""

    PREFLIGHT = "preflight"
    TELEMETRY_UP = "telemetry_up"
    TRAINING = "training"
    FINISHING = "finishing"
    DONE = "done"


assert tuple(p.value for p in Phase) == LAUNCH_PHASES

#: the phases each phase may move to: the next one, or straight to the end
NEXT: dict[Optional[Phase], tuple[Phase, ...]] = {
    None: (Phase.PREFLIGHT,),
    Phase.PREFLIGHT: (Phase.TELEMETRY_UP, Phase.DONE),
    Phase.TELEMETRY_UP: (Phase.TRAINING, Phase.DONE),
    Phase.TRAINING: (Phase.FINISHING, Phase.DONE),
    Phase.FINISHING: (Phase.DONE,),
    Phase.DONE: (),
}


@dataclass(frozen=True)
class Transition:
    phase: Phase
    #: when the phase began, epoch seconds (time.time())
    at: float


@dataclass
class LifecycleRecord:
    """When this process's launch entered each phase (see the module's docstring)."""

    transitions: list[Transition] = field(default_factory=list)
    #: when this node's relay first received a step record from one of its ranks (epoch s); None
    #: when none arrived (or this process runs no relay)
    first_step_at: Optional[float] = None
    #: when the cluster allocated the job (epoch s), when the cluster plugin says
    allocation_start: Optional[float] = None
    #: how often the cluster requeued (restarted) the job before this run, when it says
    restarts: Optional[int] = None
    #: the signals this launcher received (name -> first arrival, epoch s): SIGUSR1/SIGUSR2 are
    #: the early warning of ``--signal``, SIGTERM the time limit, scancel or a requeue
    signals: dict[str, float] = field(default_factory=dict)
    #: when the cluster meant to end the job (its time limit), as it said when the early warning
    #: came (epoch s); None when no warning came or the cluster did not say
    scheduled_end: Optional[float] = None

    @property
    def phase(self) -> Optional[Phase]:
        return self.transitions[-1].phase if self.transitions else None

    def enter(self, phase: Phase, at: Optional[float] = None) -> None:
        """Move to ``phase``; a move the state machine does not allow is a bug (ValueError)."""
        if phase not in NEXT[self.phase]:
            raise ValueError(f"launch lifecycle: {self.phase} cannot move to {phase}")
        self.transitions.append(Transition(phase, time.time() if at is None else at))

    def began(self, phase: Phase) -> Optional[float]:
        for t in self.transitions:
            if t.phase == phase:
                return t.at
        return None

    def first_step(self, at: float) -> None:
        if self.first_step_at is None:
            self.first_step_at = at

    def to_wire(self) -> dict[str, Any]:
        """The ``lifecycle`` field of the launcher's ``finish`` or ``bye`` (checked on node 0 by
        ``wire.frames.launch_lifecycle``)."""
        return {"phases": [[t.phase.value, round(t.at, 3)] for t in self.transitions],
                "first_step": None if self.first_step_at is None else round(self.first_step_at, 3),
                "allocation_start": self.allocation_start, "restarts": self.restarts,
                "signals": [[name, round(at, 3)] for name, at in self.signals.items()],
                "scheduled_end": self.scheduled_end}
