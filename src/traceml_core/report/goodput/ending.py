"""How an attempt met its time limit, in facts and one line: the early warning of
``#SBATCH --signal`` (when it came, how long before the limit, whether a checkpoint was saved
after it), the SIGTERM at the limit, and the training since the last checkpoint that a resumed
run redoes.

The facts come from the launchers (each reports the signals it received and node 0's the
scheduled end the cluster gave when the warning came) and the workers' checkpoint spans; nothing
here reads a clock.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from ...rundata import LaunchLifecycle
from .ledger import Ending, Progress

#: the signals ``#SBATCH --signal`` sends as the early warning (SIGTERM early is told apart by
#: the interrupt's own words: report/status)
WARNINGS = ("SIGUSR1", "SIGUSR2")
#: endings after which a warned attempt's unsaved training is lost
STOPPED = ("requeued", "preempted", "cancelled", "interrupted")
#: endings the job did not choose (a limit, the scheduler, a SIGTERM from outside) after which the
#: training since the last checkpoint is redone by a resumed run: the ledger says how much, and
#: the advice weighs it (a cancel is the user's own choice: said, never advised on)
UNSAVED_LOST = ("time_limit", "requeued", "preempted", "interrupted")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _first(lifecycles: Sequence[LaunchLifecycle], name: str) -> Optional[float]:
    times = [lc.signals[name] for lc in lifecycles if name in lc.signals]
    return min(times) if times else None


def since_words(p: Progress) -> str:
    """Where the unsaved training began: "since the checkpoint after step 79" (0-based, as the
    summary numbers steps), or as near as is known."""
    return (f"since the checkpoint after step {p.checkpoint_position - 1:,}" if p.checkpoint_position
            else "since the last checkpoint" if p.last_checkpoint_at is not None
            else "since the attempt's first step: no checkpoint was saved")


def _lost(p: Progress) -> str:
    if not p.unsaved_s:
        return "nothing was lost: no training came after the last checkpoint"
    return f"the last {p.unsaved_s:,.1f} s of training, {since_words(p)}, were not saved: a resumed run redoes them"


def ending_of(lifecycles: Sequence[LaunchLifecycle], progress: Progress, ended: str, end: float) -> Optional[Ending]:
    """The attempt's ending, or None when no early warning came and the time limit (or a stop
    like it) did not end it."""
    warn = next((n for n in WARNINGS if _first(lifecycles, n) is not None), None)
    warn_at = _first(lifecycles, warn) if warn else None
    term_at = _first(lifecycles, "SIGTERM")
    if warn is None and ended != "time_limit":
        return None
    sched = next((lc.scheduled_end for lc in lifecycles if lc.scheduled_end), None) if warn else None
    out = Ending(warning=warn, warning_at=warn_at, scheduled_end=sched, sigterm_at=term_at)
    parts: list[str] = []
    if warn is not None and warn_at is not None:
        head = f"{warn} (the early warning of `#SBATCH --signal`) came "
        if sched is not None:
            out.warning_lead_s = round(sched - warn_at, 3)
            head += f"{out.warning_lead_s:,.1f} s before the job's time limit ({_clock(sched)})"
        else:
            head += f"at {_clock(warn_at)} (the cluster did not say when the time limit was)"
        parts.append(head)
        ck = progress.last_checkpoint_at
        out.saved_after_warning = ck is not None and ck >= warn_at
        if out.saved_after_warning:
            assert ck is not None
            at = (f", after step {progress.checkpoint_position - 1:,}" if progress.checkpoint_position else "")
            parts.append(f"a checkpoint was saved {ck - warn_at:,.1f} s after it{at}")
        else:
            parts.append("no checkpoint was saved after it (no worker saved on it: save in a "
                         f"{warn} handler and end training, docs/goodput.md)")
    if ended == "time_limit":
        stop = f"SIGTERM at the time limit ({_clock(term_at)})" if term_at else "the time limit"
        if warn is None:
            stop += " with no early warning (no `#SBATCH --signal=USR1@N`, or it did not reach the job's steps)"
        else:
            stop = "the job ran on to " + stop
        parts.append(stop)
        parts.append(_lost(progress))
    elif ended in STOPPED:
        parts.append(f"then the attempt was {ended.replace('_', ' ')}: {_lost(progress)}")
    elif sched is not None and end <= sched:
        out.ended_before_limit_s = round(sched - end, 3)
        how = "completed" if ended == "completed" else f"ended ({ended.replace('_', ' ')})"
        parts.append(f"the attempt {how} {out.ended_before_limit_s:,.1f} s before the limit"
                     + ("" if out.saved_after_warning else f": {_lost(progress)}"))
    out.words = "; ".join(parts)
    return out
