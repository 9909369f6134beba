"""The one time-limit recipe: how a job stops in time for TraceML to write its summary.

    #SBATCH --signal=TERM@120

At ``MARGIN_S`` seconds before the time limit Slurm sends SIGTERM to every task of the job's steps,
and to nothing else (without ``B:`` the batch shell is not signalled, and neither is ``srun``,
which runs in the batch shell's step: srun would turn a SIGTERM into SIGKILL for its tasks). Each
``traceml run`` stops its workers (at most ``STOP_GRACE_S``, 15 s) and node 0 writes the summary
marked ``interrupted``; the launchers exit 143 and the job ends FAILED before its limit, not
TIMEOUT. Slurm checks time limits about every 30 s, so the signal comes up to ~60 s earlier than
asked, and at the limit itself Slurm would give only ``KillWait`` (30 s by default) between SIGTERM
and SIGKILL.

One recipe, used everywhere: ``traceml slurm template`` writes :func:`directive` (its
``--signal-margin`` defaults to :data:`MARGIN_S`), the doctor's ``time.signal`` check advises
:data:`SBATCH_LINE`, and the README, ``docs/`` and ``examples/slurm/`` show the same line (a test
keeps them the same). Tested on a real Slurm 22.05 job with a one-minute limit:
``tests/slurm/test_template_job.py``.

Older generated jobs signalled the batch shell (``--signal=B:TERM@120``) and forwarded SIGTERM to
the steps with ``scancel --signal=TERM`` from a trap; that works too (the doctor recognises it),
but needs fifteen lines in every batch script for the same effect.
"""

from __future__ import annotations

#: the signal `traceml run` turns into "stop the workers, write the summary"
SIGNAL = "TERM"
#: seconds before the time limit: the launchers' stop (<= 15 s), the summary (~25 s on node 0 of a
#: large job, see the doctor's SUMMARY_BUDGET_S) and Slurm's 30 s timer granularity, with room
MARGIN_S = 120


def directive(margin: int = MARGIN_S) -> str:
    """``--signal=TERM@120``: sbatch's option for the early signal, ``margin`` seconds before the limit."""
    return f"--signal={SIGNAL}@{int(margin)}"


#: the line to put in a batch script
SBATCH_LINE = f"#SBATCH {directive()}"
