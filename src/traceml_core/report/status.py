"""How each rank and the run ended: every status rule of the summary, in one place.

A rank's ending (:data:`RANK_ENDINGS`) comes from the strongest evidence there is: its own
goodbye; else torchrun's record of the worker (a failing exit or a signal other than an
interrupt: it crashed); else what the launcher reported about its node and the run. The run's
status (``completed``, ``failed``, ``interrupted``, ``running``, ``unknown``) comes from the
launcher's finish, and from the ranks when the launcher could not report. An interrupt (SIGTERM
from scancel or the time limit, Ctrl-C) that followed a failure of the run's own is a
consequence, so such a run *failed*.

Pure functions of typed run data and the summary's rank rows; the failure headline
(``report/failure.py``) explains a failed run, this module only decides that it failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..rundata import LaunchEnd, NodeData, RankData
from .model import ExitRecord, RankSummary
from .tracebacks import peer_loss, raised_an_exception

#: how a rank ended; "never_joined" is summary-only (the rank never completed a hello)
RANK_ENDINGS = ("clean", "error", "crashed", "vanished", "interrupted", "running", "never_joined")
#: endings that are not a failure of the rank
OK_ENDINGS = ("clean", "running")
#: endings that are (a failure has a cause the failure headline looks for)
FAILED_ENDINGS = ("error", "crashed", "vanished", "interrupted", "never_joined")
#: signals that stop a run from outside (Ctrl-C, scancel, the time limit, torchrun stopping the
#: other workers after one failed): a worker they ended did not fail by itself
INTERRUPT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
#: the run's possible statuses
RUN_STATUSES = ("completed", "failed", "interrupted", "running", "unknown")


def exit_failed_by_itself(exit_: Optional[ExitRecord]) -> bool:
    """torchrun's record of a worker says it failed on its own (a signal other than an interrupt,
    or a failing exit code)."""
    if not exit_:
        return False
    if exit_.signal:
        return exit_.signal not in INTERRUPT_SIGNALS
    return exit_.exitcode not in (None, 0)


def rank_status(r: RankData, finish: Optional[LaunchEnd], node: Optional[NodeData], failed_nodes: set[int],
                provisional: bool, exit_: Optional[ExitRecord] = None) -> str:
    """How a rank that joined ended: its own bye wins; then torchrun's record of it (a worker
    torchrun saw die by a signal or a failing exit crashed, on any node: its node's launcher passes
    the record on); else what the launcher reported decides."""
    if r.bye:
        return r.bye.status
    if exit_failed_by_itself(exit_):
        return "crashed"
    if r.node in failed_nodes or (node is not None and node.left_at is not None):
        return "vanished"
    if finish is None:
        # provisional (SIGTERM, launcher still to report): still connected = still running;
        # otherwise (rebuilt, or all ranks gone) we cannot know more than "vanished"
        return "running" if provisional and r.connected else "vanished"
    if finish.interrupted:
        return "interrupted"
    if finish.exit_code is not None and finish.exit_code != 0:
        return "crashed"
    return "vanished"


def failed_by_itself(rank: RankSummary) -> bool:
    """Whether a rank raised an exception of its own: not one a peer's loss or the run's stop
    explains. (A non-zero ``sys.exit`` does not count: scripts also exit that way from a SIGTERM
    handler.)"""
    return raised_an_exception(rank) and peer_loss(rank) is None


@dataclass(frozen=True)
class NodeFailure:
    """A node whose own launcher or torchrun failed (:func:`node_failures`)."""

    node: int
    host: Optional[str]
    #: ``torchrun_killed`` or ``launcher_lost``
    cause: str
    signal: Optional[str] = None
    #: the node launcher's exit code
    exit_code: Optional[int] = None
    at: Optional[float] = None

    @property
    def name(self) -> str:
        return f"node {self.node}" + (f" ({self.host})" if self.host else "")


def node_failures(nodes: dict[int, NodeData], finish: Optional[LaunchEnd],
                  hostnames: Sequence[str] = ()) -> list[NodeFailure]:
    """Nodes whose own launcher or torchrun ended abnormally, not by the run's stop: torchrun
    killed by a signal its launcher did not send (its node report: ``torchrun.signal``; node 0's
    comes with the launcher's finish), or a launcher that vanished (its link closed without a
    goodbye: the launcher was killed, or the node was lost). Their ranks die with them and the
    other nodes' ranks then fail in their collectives, so such a node is a cause, not a
    consequence (report/failure.py names it)."""
    out = []
    for n in sorted(nodes):
        ni = nodes[n]
        report = finish if n == 0 else ni.bye
        host = ni.host or (hostnames[n] if 0 <= n < len(hostnames) else "") or None
        tr = report.torchrun if report is not None else None
        if tr is not None and tr.signal and tr.signal not in INTERRUPT_SIGNALS:
            out.append(NodeFailure(n, host, "torchrun_killed", tr.signal, report.exit_code,  # type: ignore[union-attr]
                                   tr.at if tr.at is not None else report.at))  # type: ignore[union-attr]
        elif n != 0 and ni.bye is None and ni.left_at is not None:
            out.append(NodeFailure(n, host, "launcher_lost", at=ni.left_at))
    return out


def failed_before_interrupt(nodes: dict[int, NodeData], exits: dict[int, ExitRecord],
                            ranks: Sequence[RankSummary], node_fail: Sequence[NodeFailure] = (),
                            stopped_at: Optional[float] = None) -> bool:
    """Whether the run had failed on its own before node 0's launcher was interrupted: torchrun
    recorded a failed worker (it records none when a SIGTERM stopped it), another node's
    launcher ended in error rather than interrupted, a node's launcher or torchrun failed
    (``node_fail``) before node 0's launcher began stopping its torchrun (``stopped_at``), or a
    rank raised an exception of its own (the task layout has no torchrun, and a node's report
    there is its local rank 0's only). Then the SIGTERM was a consequence (srun
    --kill-on-bad-exit stopping the step after that rank failed), not the cause."""
    if any(exit_failed_by_itself(e) for e in exits.values()):
        return True
    if stopped_at is not None and any(nf.at is not None and nf.at < stopped_at for nf in node_fail):
        return True
    if any(n != 0 and ni.bye is not None and ni.bye.status == "error" for n, ni in nodes.items()):
        return True
    return any(failed_by_itself(r) for r in ranks)


def _from_ranks(ranks: Sequence[RankSummary]) -> str:
    statuses = {r.status for r in ranks}
    if statuses == {"clean"}:
        return "completed"
    return "failed" if statuses & {"error", "crashed"} else "unknown"


def run_status(finish: Optional[LaunchEnd], ranks: Sequence[RankSummary], provisional: bool,
               failed_first: bool = False) -> str:
    """The run's status (:data:`RUN_STATUSES`). ``failed_first``: :func:`failed_before_interrupt`."""
    if finish is None:
        return "running" if provisional else _from_ranks(ranks)
    if finish.interrupted:
        return "failed" if failed_first else "interrupted"
    if finish.exit_code is None:
        return _from_ranks(ranks)
    return "completed" if finish.exit_code == 0 else "failed"


def after_training_note(finish: Optional[LaunchEnd], ranks: Sequence[RankSummary]) -> str:
    """A failing exit although every rank said a clean goodbye: the crash came after training
    (typically at interpreter exit), which torchrun's log alone makes look like a training failure."""
    code = finish.exit_code if finish else None
    if not ranks or type(code) is not int or code == 0:
        return ""
    if any(r.status != "clean" for r in ranks):
        return ""
    return ("every rank finished training and said a clean goodbye; the failing exit (code "
            f"{code}) came afterwards, as the processes ended (torchrun's log names the rank and "
            "its signal). A common cause is a DDP model still alive at interpreter exit, where "
            "gloo can abort the process: after dist.destroy_process_group(), `del model` and "
            "call gc.collect() (or train inside main(), which TraceML collects at exit)")


def failed_run_reason(finish: Optional[LaunchEnd], ranks: Sequence[RankSummary]) -> str:
    """The reason of a failed run that no failure headline explains (the launcher gave none)."""
    if after_training_note(finish, ranks):
        died = [f"rank {r.rank} ({r.exit.signal or 'exit code ' + str(r.exit.exitcode)})"
                for r in ranks if r.exit]
        return ("every rank finished training cleanly; the failure came as the processes exited"
                + (": " + ", ".join(died) if died else ""))
    return "the launcher reported a failing exit code"


def endings(ranks: Sequence[RankSummary]) -> dict[str, int]:
    """How many ranks ended each way (the summary's ``rank_endings``: endings that occurred)."""
    out = {k: 0 for k in RANK_ENDINGS}
    for r in ranks:
        out[r.status] = out.get(r.status, 0) + 1
    return {k: v for k, v in out.items() if v}
