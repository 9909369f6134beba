"""How a launch ended: (workers' exit code, signal, hang, what node 0 and the cluster know) ->
(exit status, reason). One rule for both layouts; :func:`judge` is a pure function.

The exit status follows the shell's conventions, whatever torchrun or the worker made of it:

* the workers' exit code (``-N``, killed by signal N, becomes ``128 + N``);
* ``128 + N`` when this launcher was interrupted by signal N (130 for Ctrl-C, 143 for SIGTERM);
* :data:`HANG_EXIT_CODE` (124, timeout(1)'s) when the hang watchdog stopped the run;
* never 0 when there is a reason the run failed.

The reason says why a run failed or stopped, in words, for the log and the summary: what node 0's
watchdog saw (nodes that never joined, vanished or failed; the hang), then the signal and, when
the cluster plugin can tell, who sent it. A clean run has none.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Optional

#: exit status when the hang watchdog (--hang-timeout) stopped the run (timeout(1)'s convention)
HANG_EXIT_CODE = 124


@dataclass(frozen=True)
class WorkersEnded:
    """What this launcher saw when its workers ended."""

    #: the workers' exit code (torchrun's, or the task's one worker's); negative: killed by -code
    code: int
    #: the signal that interrupted this launcher (SIGTERM, SIGINT, SIGHUP), or None
    signal: Optional[int] = None
    #: the hang watchdog stopped the run
    hung: bool = False


@dataclass(frozen=True)
class Outcome:
    status: int
    reason: Optional[str]
    interrupted: bool

    def summary_exit_code(self, knows_every_worker: bool) -> Optional[int]:
        """The run's exit code for node 0's summary. A launcher that knows only its own worker
        (rank 0's task) cannot vouch that the run was clean: then it says null, and the summary
        judges the run by how every rank ended."""
        return self.status if (self.status != 0 or knows_every_worker) else None


def status_of(ended: WorkersEnded) -> int:
    """The exit status alone; non-zero exactly when the run failed or was stopped (the launcher
    then asks node 0's watchdog why, which :func:`judge` takes as ``failure``)."""
    if ended.signal is not None:
        return 128 + int(ended.signal)
    if ended.hung:
        return HANG_EXIT_CODE
    return 128 - ended.code if ended.code < 0 else ended.code


def interrupt_words(signum: int, cause: Optional[str] = None) -> str:
    """``interrupted by SIGTERM: the job reached its time limit (...)``."""
    words = f"interrupted by {signal.Signals(signum).name}" + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    return f"{words}: {cause}" if cause else words


def judge(ended: WorkersEnded, *, failure: Optional[str] = None, cause: Optional[str] = None) -> Outcome:
    """``failure``: what node 0's watchdog says failed (None elsewhere, or when nothing did);
    ``cause``: who sent the signal, from the cluster plugin (:func:`explain_interrupt`)."""
    status = status_of(ended)
    reason = failure if status != 0 else None
    if ended.signal is not None:
        words = interrupt_words(int(ended.signal), cause)
        reason = f"{reason}; {words}" if reason else words
    if reason and status == 0:
        status = 1
    return Outcome(status, reason, ended.signal is not None)


def explain_interrupt(config: Any, signum: int, at: float) -> Optional[str]:
    """Who sent ``signum``, in the cluster plugin's words (it may ask the scheduler: a few seconds
    at most); None when it cannot tell or there is no plugin. Never raises."""
    if config.cluster in ("none", ""):
        return None
    try:
        from ..plugins import load_cluster_environment

        cls = load_cluster_environment(config.cluster)
        return cls().explain_interrupt(config, signum, at) if cls is not None else None
    except Exception:  # noqa: BLE001 - an explanation must never cost the summary
        return None


def _ask_cluster(config: Any, method: str) -> Optional[float]:
    """``method(config)`` of the cluster plugin (it may ask the scheduler: a few seconds at most);
    None when it cannot tell or there is no plugin. Never raises: a time must never cost the run."""
    if config.cluster in ("none", "") or not config.job_id:
        return None
    try:
        from ..plugins import load_cluster_environment

        cls = load_cluster_environment(config.cluster)
        return getattr(cls(), method)(config) if cls is not None else None
    except Exception:  # noqa: BLE001
        return None


def allocation_start(config: Any) -> Optional[float]:
    """When the cluster started the job's allocation."""
    return _ask_cluster(config, "allocation_start")


def scheduled_end(config: Any) -> Optional[float]:
    """When the cluster means to end the job (its time limit)."""
    return _ask_cluster(config, "scheduled_end")
