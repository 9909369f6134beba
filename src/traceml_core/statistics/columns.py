"""The step record's columns: what a rank measures per step, and how each column is aggregated.

Why here, below the wire: the column table is the statistics' schema as much as the protocol's.
A column's ``kind`` decides which statistics the window value (:mod:`.window`) keeps for it, and
the ``fold`` frame's layout is that value's field list; the wire protocol re-exports the table
(``traceml_core.wire.protocol.COLUMNS``), so every end still reads it in one place. Adding a
column here (and to the SDK's row) is all it takes for it to reach the summary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One column of a step record. ``kind`` says how receivers aggregate it, so adding a column
    here (and to the SDK's row) is all it takes for it to reach the summary:

    * ``index``: the step index; ``clock``: the wall clock at the step's end (ns);
    * ``duration``: nanoseconds; full statistics (count, sum, max, min, quantile sketch, warm-up
      split, per-step-bucket series), reported as a phase;
    * ``peak``: a level whose maximum matters (bytes of memory): count, sum, max, per-bucket max;
    * ``sum``: only totals matter (count, sum, max, warm-up split), e.g. bytes moved, from which
      rates are derived (sum of bytes / sum of busy time).
    """

    name: str
    kind: str
    doc: str


COLUMN_KINDS = ("index", "clock", "duration", "peak", "sum")

#: step record columns, all integers (nanoseconds, bytes); -1 means "not measured this step"
COLUMNS = (
    Column("step", "index", "user-visible step index (0-based count of trace_step entries on this rank)"),
    Column("t_end_ns", "clock", "wall clock (time.time_ns) at step end"),
    Column("step_ns", "duration", "whole step, from entering trace_step (or the input fetch before it) to exit"),
    Column("input_ns", "duration", "waiting for the next batch (DataLoader / wrap_dataloader __next__) "
                                   "credited to this step; -1 when no such fetch was timed (a get_batch() function)"),
    Column("forward_ns", "duration", "forward passes of the traced model"),
    Column("backward_ns", "duration", "backward passes"),
    Column("optimizer_ns", "duration", "optimizer steps"),
    Column("h2d_ns", "duration", "host-to-device copies (CUDA only)"),
    Column("mem_peak", "peak", "peak memory during the step: CUDA allocator on GPU, process RSS on CPU"),
    # communication (sdk/comm.py; -1 throughout when not measured: no process group, or a DDP
    # model whose all-reduce cannot be timed). forward/backward/optimizer exclude comm_ns.
    Column("comm_ns", "duration", "exposed communication: time the rank waited for collectives"),
    Column("comm_busy_ns", "sum", "time at least one collective was in flight (union of launch..completion)"),
    Column("comm_bytes", "sum", "collective sizes S as nccl-tests defines them, summed (algbw = bytes/busy)"),
    Column("comm_bus_bytes", "sum", "each S times its op's bus factor, summed (busbw = bus_bytes/busy)"),
    Column("comm_calls", "sum", "collectives launched in the step (DDP buckets + explicit calls)"),
)
STEP_COLUMNS = tuple(c.name for c in COLUMNS)
#: the columns with full statistics, in report order (``step_ns`` first)
DURATION_COLUMNS = tuple(c.name for c in COLUMNS if c.kind == "duration")
PEAK_COLUMNS = tuple(c.name for c in COLUMNS if c.kind == "peak")
#: the columns that only need totals (count, sum, max; steady = without the warm-up steps)
SUM_COLUMNS = tuple(c.name for c in COLUMNS if c.kind == "sum")
#: the communication columns (all -1 together when communication is not measured)
COMM_COLUMNS = STEP_COLUMNS[STEP_COLUMNS.index("comm_ns"):]
assert all(c.kind in COLUMN_KINDS for c in COLUMNS) and DURATION_COLUMNS[0] == "step_ns"
