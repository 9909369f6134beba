"""The run's ledger from its attempts, the advice that pays, and throughput where work is declared.

:func:`assemble` puts the current attempt after the earlier ones (a requeued attempt is marked so
when a later attempt of the same job follows it; the time queued between attempts is beside the
ledger, not in it), adds them up, and names the largest *avoidable* bucket with its figure and a
next step (:func:`advise`: nothing below :data:`ADVICE_MIN_FRACTION` of the allocation, so a
clean run gets no advice it does not need). :func:`throughput` (throughput.py) gives tokens/s and
samples/s per node and MFU when the script declares what a step is worth.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...rundata import RunData
from .buckets import BY_KEY
from .ending import UNSAVED_LOST, since_words
from .ledger import Advice, AttemptLedger, Ledger, Split, Throughput
from .throughput import PEAK_FLOPS, peak_flops, throughput  # noqa: F401 - the table's old home

#: the smallest share of the allocation the advice speaks about
ADVICE_MIN_FRACTION = 0.05
#: the advice's key for the training the last attempt did after its last checkpoint, lost to the
#: time limit, a requeue or a preemption: not a bucket (it was productive, in this attempt), but
#: what the resumed run pays again, so it is weighed against the buckets in device-seconds
UNSAVED = "unsaved"
#: the save that keeps the work since the last checkpoint (docs/goodput.md#the-time-limit-and-its-early-warning)
SAVE_HANDLER = ("a SIGUSR1 handler that saves a checkpoint and ends training (TraceML's launcher lets USR1 "
                "through to your workers)")
SAVE_ON_WARNING = ("save on Slurm's early warning: `#SBATCH --signal=USR1@600` (in place of --signal=TERM@120: "
                   f"a job has one early signal) and {SAVE_HANDLER}")


def advice_label(key: str) -> str:
    """The words for an advice's key: its bucket's label, or the unsaved training's."""
    return "training not saved" if key == UNSAVED else BY_KEY[key].label


def assemble(current: AttemptLedger, previous: Sequence[AttemptLedger], data: Optional[RunData] = None,
             device: str = "unknown") -> Ledger:
    """The run's ledger: the earlier attempts, then ``current``."""
    attempts = [*previous, current]
    for i, a in enumerate(attempts):
        a.attempt = i
        if i > 0:
            before = attempts[i - 1]
            a.queued_before_s = round(max(0.0, a.start - before.end), 3)
            same_job = a.job_id is not None and a.job_id == before.job_id
            if same_job and before.ended in ("interrupted", "failed", "unknown", "running", "cancelled"):
                before.ended = "requeued"
                if "requeue" not in before.reason:   # its own summary could not say (killed first)
                    nth = f"restart {a.restart_count}" if a.restart_count else "a later attempt"
                    before.reason = "; ".join(x for x in (before.reason, f"requeued: {nth} of job {a.job_id} "
                                                          "followed it") if x)
    total = Split.summed(a.split for a in attempts)
    for k in {k for a in attempts for k, v in a.split.ms.items() if v is None}:
        # not measured in some attempt and nothing measured in the others: not measured for the
        # run (never a 0 that hides it); else the sum of what was measured (the attempts' rows
        # say which one did not)
        if all(not a.split.ms.get(k) for a in attempts):
            total.ms[k] = None
    ledger = Ledger(unit=current.unit, attempts=attempts, total=total,
                    queued_s=round(sum(a.queued_before_s or 0.0 for a in attempts), 3))
    ledger.advice = advise(ledger)
    ledger.throughput = throughput(data, current, device) if data is not None else Throughput()
    return ledger


def _dur(s: float) -> str:
    s = max(0.0, s)
    if s >= 5400:
        return f"{s / 3600:.1f} h"
    if s >= 90:
        return f"{s / 60:.0f} min"
    return f"{s:.1f} s"


def _slots_word(ledger: Ledger, slots: int) -> str:
    word = "GPU" if ledger.unit.startswith("GPU") else "rank"
    return word if slots == 1 else word + "s"


def advise(ledger: Ledger) -> Optional[Advice]:
    """The largest avoidable bucket of the whole run, when it is at least ADVICE_MIN_FRACTION."""
    total = ledger.total
    if total.total_ms <= 0:
        return None
    cands = [(v, k) for k, v in total.ms.items() if v and BY_KEY[k].avoidable]
    last = ledger.attempts[-1] if ledger.attempts else None
    if last is not None and last.ended in UNSAVED_LOST and last.progress.unsaved_s:
        # a requeued attempt followed by another is in `redone` already: only the last one's
        cands.append((round(last.progress.unsaved_s * 1000.0) * max(1, last.slots), UNSAVED))
    if not cands:
        return None
    ms, key = max(cands)
    frac = ms / total.total_ms
    if frac < ADVICE_MIN_FRACTION:
        return None
    secs = ms / 1000.0
    unit = ledger.unit
    share = f"{secs:,.1f} {unit} ({frac:.0%} of the allocation)"
    n = len(ledger.attempts)
    slots = max((a.slots for a in ledger.attempts), default=1) or 1
    why, step = _words(key, ledger, secs, share, slots, n)
    return Advice(key, round(secs, 3), round(frac, 4), why, step)


def _words(key: str, ledger: Ledger, secs: float, share: str, slots: int, n: int) -> tuple[str, str]:
    word = _slots_word(ledger, slots)
    per_slot = secs / slots
    if key == "redone":
        redone = sum(a.progress.redone_steps or 0 for a in ledger.attempts)
        gaps = [(a.attempt, ledger.attempts[a.attempt - 1]) for a in ledger.attempts[1:] if a.progress.redone_steps]
        before = gaps[-1][1] if gaps else None
        last = (f"; the last checkpoint before attempt {before.attempt} ended was "
                f"{_dur(before.progress.unsaved_s or 0.0)} before its end") if before and before.progress.unsaved_s is not None else ""
        exact = "" if all(a.progress.exact for a in ledger.attempts if a.progress.redone_steps) else " (inferred)"
        return (f"{redone:,} step(s){exact} were redone after a requeue: {_dur(per_slot)} x {slots} {word} = {share}"
                f"{last}",
                "checkpoint more often (the work since the last checkpoint is what a requeue costs), or "
                + SAVE_ON_WARNING)
    if key == UNSAVED:
        return _unsaved_words(ledger.attempts[-1], share, slots, word)
    if key == "startup":
        per = per_slot / max(1, n)
        return (f"start-up (allocation start to the first step) took {share}: {_dur(per)} per attempt",
                "see where it goes in the run's log (imports, rendezvous, model and data set-up): pre-build the "
                "data set or cache it on node-local disk, keep the environment on a fast file system, and run "
                "fewer, longer jobs" + (" (each requeue pays it again)" if n > 1 else ""))
    if key == "checkpoint":
        cks = sum(a.progress.checkpoints for a in ledger.attempts)
        each = f", {_dur(per_slot / cks)} per save" if cks else ""
        return (f"checkpointing took {share}: {cks:,} save(s){each}, the other ranks waiting for the one that saved",
                "save less often, or asynchronously (torch.distributed.checkpoint.async_save, or copy the state to "
                "CPU and write it in a thread), or to node-local disk first")
    if key == "input":
        return (f"waiting for input took {share}",
                "raise the DataLoader's num_workers, use pin_memory and persistent_workers, prefetch more, or "
                "move decoding off the training process (the INPUT-BOUND verdict names the ranks)")
    if key == "comm":
        return (f"exposed communication took {share}",
                "overlap it with compute: DDP's bucket_cap_mb, gradient accumulation with no_sync, a faster "
                "interconnect (the COMM-BOUND verdict and the link probe show where)")
    if key == "straggler":
        return (f"ranks waiting for a slower rank took {share}",
                "find the slow rank (the STRAGGLER verdict names it and its node): its input, its node's "
                "load, its GPU's clocks")
    if key == "between":
        return (f"work between the traced steps (evaluation, logging, anything outside trace_step) took {share}",
                "evaluate and log less often, or asynchronously; put the training step itself inside trace_step")
    if key == "hang":
        return (f"hangs took {share}",
                "read the hang report (which rank never arrived and where it was); set --hang-timeout so a hung "
                "run ends on its own instead of holding the allocation")
    if key == "after_failure":
        return (f"after the first failure the allocation ran on for {share}",
                "end the job as soon as a rank fails: `srun --kill-on-bad-exit=1`, and a --hang-timeout for "
                "ranks left waiting in a collective")
    if key == "tail":
        ended = ledger.attempts[-1].ended
        if ended in ("time_limit", "requeued", "preempted"):
            return (f"after their last step the attempts held the allocation for {share}",
                    "stop training on Slurm's early warning with a checkpoint (`#SBATCH --signal=USR1@600` in "
                    "place of --signal=TERM@120, and a SIGUSR1 handler that saves and ends training) instead of "
                    "being stopped mid-step")
        return (f"after the last step (teardown, writing files) the allocation was held for {share}",
                "end the job right after training: skip final evaluation and uploads inside the allocation, "
                "or run them in a separate, smaller job")
    return (f"{BY_KEY[key].label} took {share}", "")


def _unsaved_words(last: AttemptLedger, share: str, slots: int, word: str) -> tuple[str, str]:
    """The training after the last checkpoint, and the save that keeps it: on the early warning
    the job already gets (its handler is missing), else on one to ask for, else more often."""
    p, e = last.progress, last.ending
    how = {"time_limit": "the time limit", "requeued": "the requeue", "preempted": "the preemption",
           "interrupted": "the SIGTERM"}.get(last.ended, "the end")
    why = (f"the last {_dur(p.unsaved_s or 0.0)} of training before {how}, {since_words(p)}, were not saved: "
           f"{_dur(p.unsaved_s or 0.0)} x {slots} {word} = {share} that a resumed run redoes")
    if e is not None and e.warning and e.saved_after_warning:
        return why, (f"a checkpoint was saved after {e.warning}, then training went on to {how}: end training "
                     f"once the {e.warning} handler has saved")
    if e is not None and e.warning:
        lead = f" {_dur(e.warning_lead_s)} before the limit" if e.warning_lead_s is not None else ""
        handler = SAVE_HANDLER.replace("SIGUSR1", e.warning).replace("USR1", e.warning.replace("SIG", ""))
        return why, f"Slurm sent {e.warning}{lead} and no worker saved on it: add {handler}; or checkpoint more often"
    return why, SAVE_ON_WARNING + "; or checkpoint more often"
