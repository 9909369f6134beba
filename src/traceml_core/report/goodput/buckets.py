"""The ledger's buckets: one table, read by the accounting, the JSON, the text, the page and the docs.

Every device-second of an attempt's allocation lands in exactly one bucket. ``productive`` is
the time steps spent computing (forward, backward, optimizer, host-to-device copies) on work that
was not redone; every other bucket is *badput*, named by why the devices were not doing that.
Order is the order the text and the stacked bars show them in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    key: str
    label: str
    #: whether a next step can shrink it (the advice names only avoidable buckets)
    avoidable: bool
    #: how it is measured (docs/goodput.md's table; the page's legend)
    measured: str
    #: the page's colour
    colour: str
    #: paid once per attempt whatever its length (start-up, the tail): between two runs of different
    #: lengths its share moves with the length, so `traceml compare` weighs its seconds per attempt
    per_attempt: bool = False


BUCKETS: tuple[Bucket, ...] = (
    Bucket("productive", "productive step time", False,
           "forward, backward, optimizer and host-to-device time of the traced steps, less the steps "
           "that were redone", "#2e7d32"),
    Bucket("startup", "start-up", True,
           "from the allocation's start (SLURM_JOB_START_TIME, or the controller's StartTime) to the "
           "rank's first step: srun, imports, rendezvous, model and data set-up, the first step's own "
           "start", "#8e24aa", per_attempt=True),
    Bucket("input", "input wait", True,
           "the traced steps' input phase (the DataLoader's __next__)", "#f9a825"),
    Bucket("comm", "exposed communication", True,
           "the traced steps' exposed communication (time waiting for collectives), less the wait "
           "for a straggler", "#1565c0"),
    Bucket("straggler", "waiting for a straggler", True,
           "exposed communication beyond what the least-waiting rank waited per step: time this rank "
           "waited for a slower one", "#64b5f6"),
    Bucket("no_phase", "time in no phase", False,
           "step time no measured phase covers (work the SDK does not time)", "#9e9e9e"),
    Bucket("checkpoint", "checkpointing", True,
           "checkpoint saves timed in the workers (torch.save, torch.distributed.checkpoint.save and "
           "safetensors' save_file/save_model, also when a framework's saver calls them), and the "
           "other ranks' wait for the rank that saved", "#6d4c41"),
    Bucket("between", "between-step work", True,
           "time between traced steps that is not a checkpoint: evaluation, logging, anything the "
           "loop does outside trace_step", "#bcaaa4"),
    Bucket("hang", "hangs", True,
           "from the last step record before a stall node 0 reported (a hang report) to its "
           "resolution, or to the attempt's end", "#c62828"),
    Bucket("redone", "redone after a requeue", True,
           "steps an earlier attempt had already done (global step at or below the highest one "
           "reached before), redone after a requeue or a restart from the last checkpoint",
           "#ef6c00"),
    Bucket("tail", "tail after the last step", True,
           "from the rank's last step to the attempt's end (teardown, the time limit's grace, the "
           "summary), less checkpoints saved there", "#78909c", per_attempt=True),
    Bucket("after_failure", "after a failure", True,
           "from the attempt's first failure (a rank's error or crash, a lost node) to its end",
           "#ad1457"),
)

BY_KEY = {b.key: b for b in BUCKETS}
KEYS = tuple(b.key for b in BUCKETS)
BADPUT = tuple(k for k in KEYS if k != "productive")
