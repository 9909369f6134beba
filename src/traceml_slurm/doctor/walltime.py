"""Time checks: time left in the allocation, and whether the end of it leaves TraceML time to write
its summary.

At the time limit Slurm sends SIGTERM to every step, waits ``KillWait`` seconds, then SIGKILLs.
``traceml run`` turns SIGTERM into "stop the workers, write the summary", which takes about
:data:`~.thresholds.SUMMARY_BUDGET_S`. When KillWait is shorter, the advice is the one time-limit
recipe (:mod:`traceml_slurm.timelimit`: ``#SBATCH --signal=TERM@120``, every step's tasks get
SIGTERM 120 s before the limit). Slurm 22.05 shows the
``--signal`` of a job nowhere but in its batch script (``#SBATCH --signal=...``) or the submitting
shell's ``SBATCH_SIGNAL``, so that is where we look. ``traceml run`` passes USR1/USR2 on to the
workers (the script's own handler, e.g. a last checkpoint) and does not stop for them: the summary
still needs time at the SIGTERM.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Optional

from ..timelimit import MARGIN_S, SBATCH_LINE
from .controller import ControllerError, _facts, unavailable
from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext
from .thresholds import SUMMARY_BUDGET_S, TIME_LEFT_FAIL_S, TIME_LEFT_WARN_S

_SBATCH_SIGNAL = re.compile(r"^#SBATCH\s+--signal[=\s]+(\S+)", re.MULTILINE)
_TRAP = re.compile(r"^\s*trap\s+(?:'[^']*'|\"[^\"]*\"|\S+)((?:\s+[A-Za-z0-9]+)+)\s*(?:#.*)?$", re.MULTILINE)
_SCANCEL_STOP = re.compile(r"\bscancel\b[^\n]*--signal[=\s]+[\"']?(?:SIG)?(TERM|INT|HUP)\b")
#: signals `traceml run` turns into "stop and write the summary"
STOPPING = {"TERM", "INT", "HUP"}


@dataclass(frozen=True)
class SignalSpec:
    name: str
    seconds: int
    batch_only: bool
    text: str


def parse_signal(text: str) -> Optional[SignalSpec]:
    """``[{R|B}:]<sig>[@<seconds>]`` (Slurm's --signal); seconds default to 60."""
    raw = text.strip().strip("'\"")
    m = re.fullmatch(r"(?:([RB]{1,2}):)?([A-Za-z0-9]+)(?:@(\d+))?", raw)
    if not m:
        return None
    flags, sig, secs = m.group(1) or "", m.group(2).upper(), int(m.group(3) or 60)
    if sig.isdigit():
        try:
            sig = signal.Signals(int(sig)).name
        except ValueError:
            return None
    sig = sig[3:] if sig.startswith("SIG") else sig
    return SignalSpec(sig, secs, "B" in flags, raw)


def find_signal(ctx: NodeContext) -> Optional[SignalSpec]:
    env = ctx.facts.env.sbatch_signal
    if env:
        return parse_signal(env)
    script = _facts(ctx, "script")
    if isinstance(script, str):
        found = _SBATCH_SIGNAL.findall(script)
        if found:
            return parse_signal(found[-1])
    return None


def forwards_to_steps(script: object, spec: SignalSpec) -> bool:
    """Whether a batch script traps the batch-only signal and passes a stopping signal on to the
    steps with ``scancel --signal`` (what ``traceml slurm template`` generates: srun itself would
    turn a SIGTERM into SIGKILL for its tasks)."""
    if not isinstance(script, str) or not _SCANCEL_STOP.search(script):
        return False
    for m in _TRAP.finditer(script):
        names = {n.upper().removeprefix("SIG") for n in m.group(1).split()}
        if spec.name in names:
            return True
    return False


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def check_time_left(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    if j.time_limit_s is None or j.end_time is None:
        return passed("no time limit", time_limit_s=None)
    left = j.end_time - ctx.clock()
    data = {"left_s": round(left, 1), "time_limit_s": j.time_limit_s, "end_time": j.end_time}
    line = f"{_fmt(max(0, left))} left of {_fmt(j.time_limit_s)}"
    if left < TIME_LEFT_FAIL_S:
        return failed(line + ": too little for a multi-node start and a summary",
                      "Submit with a longer --time (the training needs it anyway).", **data)
    if left < TIME_LEFT_WARN_S:
        return warned(line + ": a multi-node start-up (rendezvous, data loading) may take much of it",
                      "Submit with a longer --time if the training needs more than a few minutes.", **data)
    return passed(line, **data)


def check_signal(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    cfg = _facts(ctx, "config")
    kill_wait = None if isinstance(cfg, ControllerError) else cfg.kill_wait_s
    spec = find_signal(ctx)
    data = {"kill_wait_s": kill_wait, "signal": spec.text if spec else None, "budget_s": SUMMARY_BUDGET_S}
    if j.time_limit_s is None:
        return passed("no time limit: the job ends when training ends (or on scancel)", **data)
    note = ""
    if spec is not None:
        if spec.name in STOPPING and not spec.batch_only and spec.seconds >= SUMMARY_BUDGET_S:
            return passed(f"--signal={spec.text}: every step gets SIG{spec.name} {spec.seconds} s before the limit, "
                          f"enough for TraceML's ~{SUMMARY_BUDGET_S:.0f} s to write the summary", **data)
        if spec.batch_only and spec.seconds >= SUMMARY_BUDGET_S and forwards_to_steps(_facts(ctx, "script"), spec):
            return passed(f"--signal={spec.text}: the batch shell gets SIG{spec.name} {spec.seconds} s before the "
                          f"limit and its trap passes SIGTERM on to the steps (scancel --signal), enough for "
                          f"TraceML's ~{SUMMARY_BUDGET_S:.0f} s to write the summary", forwarded=True, **data)
        if spec.batch_only:
            note = f"; --signal={spec.text} goes to the batch shell only, not to `traceml run` in the steps"
        elif spec.name not in STOPPING:
            note = (f"; --signal={spec.text}: `traceml run` passes SIG{spec.name} on to the training script "
                    f"(its handler can save a checkpoint) but does not stop for it")
        else:
            note = f"; --signal={spec.text} comes only {spec.seconds} s before the limit"
    if kill_wait is None:
        return warned(f"KillWait unknown (the controller did not say){note}",
                      f"Add `{SBATCH_LINE}` so TraceML stops in time to write the summary.",
                      **data)
    if kill_wait >= SUMMARY_BUDGET_S:
        return passed(f"at the time limit: SIGTERM, then SIGKILL after KillWait={kill_wait:.0f} s, enough for TraceML's "
                      f"~{SUMMARY_BUDGET_S:.0f} s{note}", **data)
    return warned(f"KillWait={kill_wait:.0f} s: at the time limit TraceML gets {kill_wait:.0f} s between SIGTERM and "
                  f"SIGKILL, but stopping the workers and writing the summary takes ~{SUMMARY_BUDGET_S:.0f} s{note}",
                  f"Add `{SBATCH_LINE}`: every step then gets SIGTERM {MARGIN_S} s before the limit, and "
                  f"TraceML writes the summary in time.", **data)


CHECKS = (
    CheckSpec("time.left", "Time left in the allocation", check_time_left, scope="job"),
    CheckSpec("time.signal", "Time to write the summary at the limit", check_signal, scope="job"),
)
