"""Is the run hung, or working through a long pause? Decided by where the ranks are and whether
they make progress, not by how long the silence is.

A pure function of two readings of every rank (:func:`judge`), taken while no rank completed a
step (aggregator/hangwatch.py takes them: report/hang.py reads each one from the ranks' own
answers and what their relays read of their processes). Between the first and the last reading,
at least ``HANG_CONFIRM_S`` apart, each rank's **progress** is:

* steps it completed, or collectives it launched (the SDK's counters);
* CPU time of its main thread (the one that trains), or of its child processes (DataLoader
  workers), at least ``HANG_WORK_CPU`` of a core;
* bytes it read or wrote, at least ``HANG_WORK_IO_BPS``;
* for a rank waiting in a collective, CPU time of its whole process (the collective library's
  threads moving data) at least ``HANG_COLLECTIVE_CPU`` of a core.

Then, in this order (a cause before its consequences):

1. **stopped**: a rank stopped in both readings (SIGSTOP, Ctrl-Z, a debugger) runs nothing, and
   every collective waits for it: a hang, that rank named.
2. **a peer that makes no progress**: some ranks wait in a collective while others are elsewhere
   (their own code, a DataLoader, C code that holds the GIL): if none of the others progresses,
   a hang that names them; if one does, the run is **working** ("rank 0 has been in
   save_checkpoint for 4 min (working)"), however long it takes.
3. **every rank in a collective**: if none progresses, a hang: all ranks stuck in one collective
   (the network, NCCL, a peer outside the job) or in different ones (mismatched); if data moves,
   working.
4. **no rank in a collective**: nobody waits for anybody. Working when one progresses; otherwise
   no state rule applies (every rank idle in its own code), and only the time backstop can call
   it a hang.

A rank whose process is gone is a failure, not a hang: the launcher sees its exit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .ranklist import ranks_phrase
from .thresholds import HANG_COLLECTIVE_CPU, HANG_WORK_CPU, HANG_WORK_IO_BPS

#: where a rank is, as report/hang.py reads it
IN_COLLECTIVE = "collective"
ELSEWHERE = ("running", "dataloader", "no_dump", "unreachable")


@dataclass(frozen=True)
class Progress:
    """What one rank did between two readings (None: not measured)."""

    seconds: float
    steps: Optional[int] = None
    collectives: Optional[int] = None
    main_cpu: Optional[float] = None       # cores
    children_cpu: Optional[float] = None   # cores
    proc_cpu: Optional[float] = None       # cores
    io_bps: Optional[float] = None

    def working(self, in_collective: bool) -> bool:
        """Whether this is progress (the thresholds say why each value)."""
        return bool(self.steps or self.collectives
                    or (self.main_cpu or 0.0) >= HANG_WORK_CPU
                    or (self.children_cpu or 0.0) >= HANG_WORK_CPU
                    or (self.io_bps or 0.0) >= HANG_WORK_IO_BPS
                    or (in_collective and (self.proc_cpu or 0.0) >= HANG_COLLECTIVE_CPU))

    def words(self) -> str:
        """``0.9 of a core, 12 MB/s of I/O`` (what there was), or ``no CPU, no I/O``."""
        parts = []
        if self.steps:
            parts.append(f"{self.steps} step(s)")
        if self.collectives:
            parts.append(f"{self.collectives} collective(s)")
        cpu = max(self.main_cpu or 0.0, self.children_cpu or 0.0)
        if cpu >= 0.005:
            who = "its DataLoader workers" if (self.children_cpu or 0.0) > (self.main_cpu or 0.0) else "its main thread"
            parts.append(f"{cpu:.2f} of a core in {who}")
        if (self.io_bps or 0.0) >= 1024:
            parts.append(f"{self.io_bps / 1e6:.2f} MB/s of I/O")
        if parts:
            return ", ".join(parts)
        measured = self.main_cpu is not None or self.io_bps is not None
        return "no CPU, no I/O" if measured else "not measured"


def _delta(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return None if a is None or b is None else max(0, b - a)


def progress(first: Mapping[str, Any], last: Mapping[str, Any], seconds: float) -> Progress:
    """One rank's progress from two of its hang-report rows (report/hang.RankAutopsy data). The
    seconds between the relay's two readings (its node's clock) when it read both."""
    if first.get("at_ns") is not None and last.get("at_ns") is not None and last["at_ns"] > first["at_ns"]:
        seconds = (last["at_ns"] - first["at_ns"]) / 1e9
    seconds = max(seconds, 1e-3)

    def rate(key: str, scale: float) -> Optional[float]:
        d = _delta(first.get(key), last.get(key))
        return None if d is None else d / scale / seconds

    return Progress(seconds, steps=_delta(first.get("step"), last.get("step")),
                    collectives=_delta(first.get("launched"), last.get("launched")),
                    main_cpu=rate("main_cpu_ns", 1e9), children_cpu=rate("children_cpu_ns", 1e9),
                    proc_cpu=rate("proc_cpu_ns", 1e9), io_bps=rate("io_bytes", 1.0))


@dataclass
class Judgement:
    """``hang`` (with the rule that fired and the ranks it names), ``working`` (who, where, at
    what rate), or ``undecided`` (nothing the state rules can say: the backstop decides)."""

    state: str
    rule: Optional[str] = None
    culprits: list[int] = field(default_factory=list)
    #: one sentence: why it is a hang (the ranks' lack of progress), or who works
    because: str = ""
    #: rank -> its progress over the window
    progress: dict[int, Progress] = field(default_factory=dict)
    #: the ranks that work, with where they are (``save_checkpoint (train.py:88)``)
    working: list[tuple[int, str]] = field(default_factory=list)


def _place(row: Mapping[str, Any]) -> str:
    """``save_checkpoint (train.py:88)`` from ``train.py:88 in save_checkpoint``."""
    where = row.get("where") or ""
    if " in " in where:
        at, func = where.rsplit(" in ", 1)
        return f"{func} ({at})"
    if row.get("state") == "dataloader":
        return "waiting for a DataLoader batch"
    if row.get("state") == "no_dump":
        return "C code (its interpreter did not answer)"
    if row.get("state") == "unreachable":
        return "an unknown place (nothing heard from it)"
    return where or "?"


def judge(first: Sequence[Mapping[str, Any]], last: Sequence[Mapping[str, Any]],
          seconds: float) -> Judgement:
    """The hang rules (module docstring) over two readings ``seconds`` apart: each a list of
    report/hang.py rank rows."""
    before = {int(r["rank"]): r for r in first}
    now = {int(r["rank"]): r for r in last if int(r["rank"]) in before}
    prog = {rank: progress(before[rank], row, seconds) for rank, row in now.items()}

    def state(rank: int) -> str:
        return str(now[rank].get("state"))

    def stuck_words(ranks: Sequence[int]) -> str:
        secs = min(prog[r].seconds for r in ranks)
        dark = [r for r in ranks if prog[r].main_cpu is None and prog[r].io_bps is None
                and now[r].get("at_ns") is None]
        seen = [r for r in ranks if r not in dark]
        parts = []
        if seen:
            parts.append(f"{ranks_phrase(seen)} made no progress for {secs:.0f} s ("
                         + "; ".join(sorted({prog[r].words() for r in seen})) + ")")
        if dark:
            parts.append(f"nothing was heard from {ranks_phrase(dark)} for {secs:.0f} s (neither the rank "
                         "nor its node's relay answered: its node or its network link may be down)")
        return "; ".join(parts)

    stopped = [r for r, row in now.items() if row.get("state") == "stopped"
               and before[r].get("state") == "stopped"]
    waiting = [r for r in now if state(r) == IN_COLLECTIVE]
    elsewhere = [r for r in now if state(r) in ELSEWHERE]
    if stopped:
        return Judgement("hang", "stopped", sorted(stopped),
                         f"{ranks_phrase(sorted(stopped))} stayed stopped for "
                         f"{min(prog[r].seconds for r in stopped):.0f} s", prog)
    if waiting and elsewhere:
        busy = [r for r in elsewhere if prog[r].working(False)]
        if busy:
            return Judgement("working", None, [], "", prog, [(r, _place(now[r])) for r in busy])
        return Judgement("hang", "peer", sorted(elsewhere),
                         f"{stuck_words(sorted(elsewhere))} while {ranks_phrase(sorted(waiting))} "
                         "waited for it in a collective", prog)
    if waiting and len(waiting) == len(now):
        moving = [r for r in waiting if prog[r].working(True)]
        if moving:
            return Judgement("working", None, [], "", prog,
                             [(r, "a collective, moving data") for r in moving])
        ops = {str(now[r].get("collective")) for r in waiting}
        return Judgement("hang", "all_stuck" if len(ops) == 1 else "mismatch", [],
                         f"no rank made progress for {min(prog[r].seconds for r in waiting):.0f} s, "
                         "every one waiting in a collective", prog)
    busy = [r for r in elsewhere if prog[r].working(False)]
    if busy:
        return Judgement("working", None, [], "", prog, [(r, _place(now[r])) for r in busy])
    return Judgement("undecided", None, [], "", prog)
