"""The upper (and lower) bound of every number TraceML reads from a flag, ``TRACEML_*`` or ``SLURM_*``.

One table, each bound with the reason for its value. The option table (:mod:`.options`), the Slurm
plugin's variables, the aggregator's settings and the template's flags all take their bounds from
here, and ``docs/configuration.md`` lists them (generated). A value past a bound is refused with
one paragraph naming the flag or variable, the value and the range, never a traceback, and no
work at start-up grows past what these bounds allow (the launcher's and the summary's work is
linear in nodes + ranks).

This module imports nothing beyond the standard library: ``traceml --help`` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

Number = Union[int, float]


@dataclass(frozen=True)
class Limit:
    """A closed range ``lo..hi`` for one kind of value, and why ``hi`` is what it is."""

    name: str
    lo: Number
    hi: Number
    why: str
    unit: str = ""

    @property
    def integer(self) -> bool:
        return isinstance(self.lo, int) and isinstance(self.hi, int)

    def text(self) -> str:
        """``between 1 and 65,536`` (with the unit)."""
        unit = f" {self.unit}" if self.unit else ""
        return f"between {_fmt(self.lo)} and {_fmt(self.hi)}{unit}"

    def problem(self, value: Number) -> Optional[str]:
        """None when ``value`` is inside the range, else what is wrong with it (for an error)."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"is not a finite number; use a number {self.text()}"
        if value < self.lo or value > self.hi:
            why = f" ({self.why})" if value > self.hi else ""
            return f"must be {self.text()}{why}"
        return None

    def parse(self, text: str) -> Number:
        """Parse ``text`` as this limit's kind of number; ``ValueError`` says what is wrong.

        Used where no pydantic model reads the value (the template's flags); the settings models
        apply the same range through :func:`traceml_core.settings.bounded`.
        """
        raw = str(text).strip()
        if len(raw) > 64:
            raise ValueError(f"is not a number {self.text()} (it has {len(raw)} characters)")
        try:
            value: Number = int(raw) if self.integer else float(raw)
        except ValueError:
            raise ValueError("is not a whole number" if self.integer else "is not a number") from None
        problem = self.problem(value)
        if problem:
            raise ValueError(problem)
        return value


def _fmt(v: Number) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


DAY = 86_400.0

#: The largest Slurm systems have about 11,000 nodes (El Capitan 11,136, Aurora 10,624, Frontier
#: 9,408); 4x that leaves room and keeps every per-node table small.
NODES = Limit("nodes", 1, 65_536, "the largest Slurm systems have about 11,000 nodes")
NODE_RANK = Limit("node rank", 0, NODES.hi - 1, "node ranks run 0..nodes-1")
#: Workers are processes on one node: one per GPU (at most 16 on any node shipped), or one per
#: core in a CPU job (the largest nodes have 384 cores).
PROCS_PER_NODE = Limit("workers per node", 1, 1_024,
                       "one worker per GPU or per core, and no node has more")
GPUS_PER_NODE = Limit("GPUs per node", 0, PROCS_PER_NODE.hi, "no node has more GPUs")
#: nodes x workers per node: every rank gets a row in the summary (about 1 KiB of JSON) and
#: per-rank state on node 0, so this bounds node 0's memory and the summary's size (~64 MiB);
#: 4x the largest torch.distributed jobs reported (16,384 GPUs).
WORLD_SIZE = Limit("world size (nodes x workers per node)", 1, 65_536,
                   "node 0 keeps state for every rank; 4x the largest torch.distributed jobs reported")
PORT = Limit("port", 1, 65_535, "TCP ports are 16-bit")
PORT_OR_AUTO = Limit("port or 0", 0, 65_535, "TCP ports are 16-bit; 0 picks one automatically")
WAIT_S = Limit("wait", 0.0, DAY, "a day: no node takes that long to start",
               "seconds")
HANG_S = Limit("hang timeout", 0.0, 7 * DAY, "a week: longer than Slurm time limits usually allow", "seconds")
STATUS_INTERVAL_S = Limit("status interval", 0.1, 3_600.0, "from 0.1 s to an hour",
                          "seconds")
REFRESH_S = Limit("refresh interval", 0.05, 60.0, "redrawing more than 20 times a second only burns CPU",
                  "seconds")
EXPORT_INTERVAL_S = Limit("export interval", 1.0, 3_600.0, "from a second (each export builds a summary "
                          "of the run so far) to an hour", "seconds")
#: Slurm job and step ids are 32-bit unsigned integers (slurm.h: NO_VAL is 0xfffffffe)
JOB_ID = Limit("Slurm job id", 0, 4_294_967_294, "Slurm job ids are 32-bit")
RESTARTS = Limit("restart count", 0, 65_535, "Slurm's restart counter is 16-bit")
CPUS_PER_TASK = Limit("CPUs per task", 1, 16_384, "more cores than any node has")
TASKS = Limit("tasks", 1, NODES.hi * PROCS_PER_NODE.hi, "nodes x workers per node")
TASK_RANK = Limit("task rank", 0, TASKS.hi - 1, "task ranks run 0..tasks-1")
LOCAL_RANK = Limit("local task rank", 0, PROCS_PER_NODE.hi - 1, "local ranks run 0..workers per node-1")
#: a point in time (Slurm's SLURM_JOB_START_TIME/END_TIME): seconds since 1970, 32-bit unsigned in Slurm
EPOCH_S = Limit("time", 0, 2**32 - 1, "Slurm stores times as 32-bit seconds since 1970", "seconds since 1970")
#: characters in a node list, a host name, a path
NODELIST_CHARS = Limit("node list length", 1, 1_048_576, "a megabyte: far longer than Slurm's own list of 65,536 "
                       "nodes", "characters")
HOST_CHARS = Limit("host name length", 1, 253, "DNS names are at most 253 characters", "characters")
PATH_CHARS = Limit("path length", 1, 4_096, "PATH_MAX on Linux", "characters")

# --- measured values arriving from peers ----------------------------------------------------------
# wire/frames.py holds every value a rank or a node sends to these physical bounds (one per kind of
# field); docs/wire-protocol.md lists them (generated). A value outside is not a measurement (a bug
# or an attack): a step column past its bound gets its frame refused, a float sample past it (NaN
# and infinity included) becomes "not measured", and both are counted in the summary. The bounds
# also keep every sum node 0 keeps far from what a checkpoint can hold (rundir.py
# stores an integer of any size anyway).
#: one phase of one step, in nanoseconds: 2**52 ns is 52 days
STEP_NS = Limit("duration of a step phase", 0, 2**52, "52 days: no training step lasts that long", "ns")
#: memory (a step's peak, a node's RAM, a GPU's memory) and bytes one step moves in collectives
BYTES = Limit("bytes", 0, 2**50, "1 PiB: more memory than any node has, more than one step moves",
              "bytes")
#: collectives launched in one step
CALLS = Limit("collectives per step", 0, 2**32, "4 billion launches would take hours", "calls")
PERCENT = Limit("utilisation", 0.0, 100.0, "a share of the whole", "%")
CELSIUS = Limit("temperature", -273.15, 1_000.0, "nothing is colder than absolute zero; chips fail far "
                "below 1,000 °C", "°C")
WATTS = Limit("power", 0.0, 100_000.0, "100 kW is a rack, not one GPU", "W")
#: the bounds of measured values, in the order the documentation lists them (EPOCH_S bounds the
#: time stamps of samples and events)
MEASURED: tuple[Limit, ...] = (EPOCH_S, STEP_NS, BYTES, CALLS, PERCENT, CELSIUS, WATTS)

#: every limit, in the order the documentation lists them (names are unique: models refer to them)
ALL: tuple[Limit, ...] = (NODES, NODE_RANK, PROCS_PER_NODE, GPUS_PER_NODE, WORLD_SIZE, PORT, PORT_OR_AUTO,
                          WAIT_S, HANG_S, STATUS_INTERVAL_S, REFRESH_S, EXPORT_INTERVAL_S, JOB_ID, RESTARTS, CPUS_PER_TASK, TASKS, TASK_RANK, LOCAL_RANK, EPOCH_S,
                          NODELIST_CHARS, HOST_CHARS, PATH_CHARS, STEP_NS, BYTES, CALLS, PERCENT, CELSIUS, WATTS)

assert len({lim.name for lim in ALL}) == len(ALL)
