"""Who sent the SIGTERM that stopped a run: the time limit, scancel, or something else.

Slurm sends SIGTERM both at a job's time limit and on ``scancel`` (and ``srun --kill-on-bad-exit``
after another task failed, and on preemption), so the signal alone does not say which. In order:

0. the controller counts the job's restarts up past this attempt's ``SLURM_RESTART_COUNT``: the
   job is being requeued (``scontrol requeue``, preemption or a node failure with ``--requeue``;
   which one, where the controller's state says), and this attempt's work goes on in the next;
1. the job's end time, when Slurm gives it to the job (``SLURM_JOB_END_TIME``, Slurm 23.02 and
   later, resolved into the launch config): a signal at or after it is the time limit;
2. else, or when the signal came before the end time, the controller (``scontrol show job``,
   2 s at most): ``JobState=TIMEOUT`` is the time limit, ``CANCELLED`` is scancel, and its EndTime
   stands in for 1 on older Slurm;
3. else: "scancel or the time limit, could be either", with what is missing.

Only called once, after the workers stopped (it must not delay the summary by more than ~2 s).
"""

from __future__ import annotations

import signal
import time
from typing import Any, Optional

from .controller import NO_LIMIT_S, limit_or_none

#: a SIGTERM this close to (or after) the end time is the time limit (Slurm's timer ticks)
AT_LIMIT_S = 5.0
#: up to this long before the end, a SIGTERM may be the early warning of `#SBATCH --signal`
EARLY_SIGNAL_S = 900.0
#: seconds the controller may take to answer
CONTROLLER_S = 2.0
NOT_THE_LIMIT = ("the job has no time limit, so not the time limit: scancel, preemption, or srun "
                 "--kill-on-bad-exit after another task failed")

_STATES = {
    "TIMEOUT": "the job reached its time limit (the controller says JobState=TIMEOUT)",
    "CANCELLED": "the job was cancelled (scancel; the controller says JobState=CANCELLED)",
    "PREEMPTED": "the job was preempted (the controller says JobState=PREEMPTED)",
    "NODE_FAIL": "a node of the job failed (the controller says JobState=NODE_FAIL)",
    "DEADLINE": "the job reached its deadline (the controller says JobState=DEADLINE)",
}


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def controller_state(job_id: Optional[str]) -> Optional[dict[str, Any]]:
    """``{"state", "end", "unlimited"}`` from the controller (``end``: StartTime + TimeLimit, the
    scheduled end; the EndTime it shows is rewritten to the cancel time by scancel), or None when it
    cannot be asked in time."""
    if not job_id:
        return None
    try:
        from . import controller

        job = controller.ScontrolBackend(timeout=CONTROLLER_S).job(str(job_id))
    except Exception:  # noqa: BLE001 - no scontrol in the image, controller down, no answer
        return None
    unlimited = limit_or_none(job.time_limit_s) is None
    end = job.start_time + job.time_limit_s if job.start_time and not unlimited else None
    return {"state": job.state, "end": end, "unlimited": unlimited, "restarts": job.restarts,
            "start": job.start_time, "reason": job.reason,
            # while the job is live, EndTime is when the controller will end it (JobFacts)
            "scheduled": job.scheduled_end}


def scheduled_end(config: Any, *, ask: Any = controller_state) -> Optional[float]:
    """When the controller means to end the running job (its time limit), epoch s: its EndTime,
    else StartTime + TimeLimit, else SLURM_JOB_END_TIME (set at the start: an update since is not
    in it); None with no time limit or no answer."""
    facts = ask(config.job_id)
    if facts is not None:
        if facts.get("unlimited"):
            return None
        if facts.get("scheduled") or facts.get("end"):
            return float(facts.get("scheduled") or facts["end"])
    end = config.job_end_time
    return float(end) if end is not None and end - time.time() < NO_LIMIT_S else None


def requeued_words(facts: dict[str, Any], restart_count: Optional[int]) -> Optional[str]:
    """"the job was requeued ..." when the controller's restart count is past this attempt's."""
    n = facts.get("restarts")
    if n is None or n <= (restart_count or 0):
        return None
    state = str(facts.get("state") or "")
    why = ("preempted and requeued" if state.startswith("PREEMPTED") else
           "requeued after a node failure" if state.startswith("NODE_FAIL") else "requeued")
    return (f"the job was {why} (the controller counts restart {n}; scontrol requeue, preemption or a "
            "node failure with --requeue): the next attempt goes on in the same run directory")


def explain(config: Any, signum: int, at: float, *, ask: Any = controller_state) -> Optional[str]:
    if signum != signal.SIGTERM:
        return None
    end = config.job_end_time
    no_limit = end is not None and end - at >= NO_LIMIT_S
    if no_limit:
        end = None  # a year away: Slurm's way of writing "no time limit"; the controller may say more
    if end is not None and at >= end - AT_LIMIT_S:
        return f"the job reached its time limit (SLURM_JOB_END_TIME, {_clock(end)})"
    facts = ask(config.job_id)
    source = "SLURM_JOB_END_TIME"
    if facts is not None:
        requeued = requeued_words(facts, getattr(config, "restart_count", None))
        if requeued:
            return requeued
        for key, words in _STATES.items():
            if str(facts["state"]).startswith(key):
                return words
        if facts.get("reason") == "TimeLimit":   # a job being stopped reads COMPLETING
            return "the job reached its time limit (the controller says Reason=TimeLimit)"
        if facts.get("unlimited") or no_limit:
            return NOT_THE_LIMIT
        if end is None and facts.get("end") is not None:
            end, source = facts["end"], "the controller's StartTime + TimeLimit"
            if at >= end - AT_LIMIT_S:
                return f"the job reached its time limit ({source}, {_clock(end)})"
    if no_limit:
        return NOT_THE_LIMIT
    if end is not None:
        left = end - at
        if left <= EARLY_SIGNAL_S:
            return (f"{left:.0f} s before the job's time limit ({source}, {_clock(end)}): the early warning of "
                    f"`#SBATCH --signal`, or scancel")
        return (f"{left / 60:.0f} min before the job's time limit ({source}, {_clock(end)}), so not the time "
                f"limit: scancel, preemption, or srun --kill-on-bad-exit after another task failed")
    return ("scancel or the job's time limit (could be either: this Slurm does not give the job its end "
            "time, SLURM_JOB_END_TIME, and the controller could not be asked)")
