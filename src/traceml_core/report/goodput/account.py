"""One attempt's allocation divided among the ledger's buckets: a pure function of its run data.

Every rank is one *slot* of the allocation (a GPU on GPU nodes, one worker on CPU) for the whole
attempt: from the allocation's start ``A0`` to the last launcher's end ``A1``. A rank's slot is cut
at its first step's start ``f`` and its last step's end ``l``:

    A0 ---- start-up ---- f ======== the traced steps ======== l ---- tail / after a failure ---- A1

and each part is divided by what was measured in it (docs/goodput.md has the rules, bucket by
bucket). Between ``f`` and ``l`` the rank's step time splits into its phases (productive compute,
input wait, exposed communication and the part of it spent waiting for a slower rank, time in no
phase) and the time between steps into checkpoint saves and other between-step work; a stall node
0 reported (a hang), the steps an earlier attempt had done already (redone) and the other ranks'
wait for the rank that saved a checkpoint are carved out of those. After ``l`` come checkpoints
saved after the last step, a hang the attempt ended in, the time after its first failure, and the
tail. Each rank's parts are then rounded to whole milliseconds that sum exactly to its slot.

Nothing here reads a clock or a file: the same run data give the same ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import add
from typing import Any, Optional, Sequence

from ...statistics.series import series_values
from ...rundata import HangReport, RankData, RunData
from .buckets import KEYS
from .ending import ending_of
from .ledger import AttemptLedger, NodeLedger, Progress, Split, apportion
from .spans import confirmed

#: per-node rows kept in an attempt's ledger: a job of 65,536 nodes would otherwise carry 65,536
#: rows (19 MB of JSON and ~370 MB of objects in node 0's aggregator and launcher, past the 1 GiB
#: the node limit is held to); past this, the nodes with the least productive share are kept (the
#: ones a user looks for) and ``nodes_total`` says how many there were. The attempt's own split
#: still adds every node.
MAX_NODE_ROWS = 1024

#: phases of a step that are the model's own work
COMPUTE = ("forward_ns", "backward_ns", "optimizer_ns", "h2d_ns")
#: where time is taken from when a stall, the wait for the rank that saved a checkpoint or the
#: redone steps are carved out: a stall is mostly a collective that does not complete; the saver
#: is waited for in the next collective (beyond the least-waiting rank: the straggler part) or at a
#: barrier between steps
_CARVE_STALL = ("straggler", "comm", "no_phase", "between")
_CARVE_SAVER = ("straggler", "between", "no_phase", "comm")
_CARVE_REDONE = ("productive", "input", "comm", "straggler", "no_phase", "between")
#: how the run's statuses read as an attempt's ending (a requeue is told from its words or from a
#: later attempt of the same job)
_ENDED = {"completed": "completed", "failed": "failed", "running": "running", "unknown": "unknown"}


@dataclass
class Window:
    """The attempt's allocation window (epoch s) and where each end came from."""

    start: float
    start_source: str
    end: float
    end_source: str
    #: start-up's rule was bent (no allocation start known): why, and how to measure it
    start_note: Optional[str] = None


@dataclass
class Context:
    """What the summary's other steps decided, that the ledger reads."""

    #: each rank's ending and, when it failed, when (RankSummary rows: status, failed_at)
    rows: Sequence[Any]
    status: str
    reason: str
    #: when the summary was made (the end, when nothing later is known)
    ended: float
    device: str = "unknown"
    #: the run ended while hung (no step record after the last hang report)
    ended_hung: bool = False
    rebuilt: bool = False
    #: per rank, records it may have produced that never reached node 0 (killed before its
    #: goodbye; summary.py's bound), None: not bounded
    unsent: Optional[dict[int, Optional[int]]] = None


def _lifecycles(data: RunData) -> list[Any]:
    return [n.lifecycle for n in data.nodes if n.lifecycle is not None]


def window(data: RunData, ended: float) -> Window:
    """``A0``: the allocation's start as the cluster said it (any node's launcher may report it);
    else node 0's launcher start, with a note. ``A1``: the last end node 0 knows of (its launcher's
    finish, a node's goodbye or loss), else when the summary was made."""
    lcs = _lifecycles(data)
    alloc = [lc.allocation_start for lc in lcs if lc.allocation_start]
    if not alloc and (data.settings.public or {}).get("job_start_time"):
        alloc = [float(data.settings.public["job_start_time"])]   # the launch config's, at start
    note = None
    if alloc:
        start, source = float(min(alloc)), "the allocation's start (the cluster's job start time)"
    else:
        starts = [t for lc in lcs for t in (lc.phases.get("preflight"),) if t]
        start = float(min(starts)) if starts else float(data.settings.started_at)
        if data.settings.job_id:
            source = "the first launcher's start (the cluster did not say when the allocation began)"
            note = ("measured from the first `traceml run` launcher's start: the cluster did not say when "
                    "the allocation began (SLURM_JOB_START_TIME, Slurm 23.02 and later, or the controller's "
                    "StartTime, which node 0's launcher asks for), so what ran before the launcher (the "
                    "batch script, srun) is not in the ledger")
        else:
            source = "the first launcher's start (no cluster allocation)"
    ends = [(ended, "the summary")]
    if data.finish is not None and data.finish.at:
        ends.append((float(data.finish.at), "node 0's launcher finish"))
    for n in data.nodes:
        if n.bye is not None and n.bye.at:
            ends.append((float(n.bye.at), f"node {n.node}'s launcher goodbye"))
        if n.left_at:
            ends.append((float(n.left_at), f"node {n.node}'s loss"))
    known = [e for e in ends[1:]] or ends
    end, end_source = max(known)
    return Window(start, source, max(end, start), end_source, note)


# --- per rank ----------------------------------------------------------------------------------------
@dataclass
class RankSlot:
    """One rank's slot, in seconds per bucket (before rounding)."""

    rank: int
    node: int
    parts: dict[str, float] = field(default_factory=dict)

    def take(self, amount: float, order: Sequence[str]) -> float:
        """Move up to ``amount`` out of the buckets of ``order`` (in that order); how much moved."""
        left = amount
        for k in order:
            if left <= 0:
                break
            have = self.parts.get(k, 0.0)
            t = min(have, left)
            self.parts[k] = have - t
            left -= t
        return amount - left

    def take_spread(self, amount: float, keys: Sequence[str]) -> float:
        """Move up to ``amount`` out of ``keys`` in proportion to what each holds."""
        pool = sum(self.parts.get(k, 0.0) for k in keys)
        if pool <= 0 or amount <= 0:
            return 0.0
        t = min(amount, pool)
        for k in keys:
            self.parts[k] = self.parts.get(k, 0.0) * (1 - t / pool)
        return t


def _s(ns: Optional[int]) -> float:
    return (ns or 0) / 1e9


def time_after(r: RankData, n: int, first_start: float) -> Optional[float]:
    """When the rank's first ``n`` steps had ended (epoch s): exact at the end of a series bucket,
    interpolated by step count inside one (buckets hold one or two steps early in a run)."""
    if n <= 0:
        return first_start
    t_end = series_values(r.series, "t_end")
    cnt = series_values(r.series, "step_cnt")
    width = int(r.series.get("width") or 1) if isinstance(r.series, dict) else 1
    if not t_end or not cnt:
        return None
    b = min((n - 1) // width, len(t_end) - 1)
    if t_end[b] <= 0:
        return None
    within = n - b * width
    prev = t_end[b - 1] / 1e9 if b > 0 and t_end[b - 1] > 0 else first_start
    if cnt[b] <= 0 or within >= cnt[b]:
        return t_end[b] / 1e9
    return prev + (t_end[b] / 1e9 - prev) * within / cnt[b]


def first_start(r: RankData) -> Optional[float]:
    """When the rank's first step began: the SDK's own mark, else the first record's end less the
    first series bucket's mean step."""
    first = r.facts.progress.first
    if first is not None and first.step == 0 and first.start:
        return float(first.start)
    if r.first_t_end is None:
        return None
    sums, cnt = series_values(r.series, "step_sum"), series_values(r.series, "step_cnt")
    dur = sums[0] / cnt[0] / 1e9 if sums and cnt and cnt[0] > 0 else _s(r.phase("step_ns").min)
    return r.first_t_end / 1e9 - max(0.0, dur)


def steps_of(r: RankData) -> int:
    return max(r.last_step + 1, r.phase("step_ns").count, 0)


def _comm_means(ranks: Sequence[RankData]) -> Optional[float]:
    """The least exposed communication per step among the ranks that measured it (ns)."""
    means = [ph.sum / ph.count for r in ranks for ph in (r.phase("comm_ns"),) if ph.count > 0]
    return min(means) if means else None


def _stalls(hangs: Sequence[HangReport], end: float, ended_hung: bool) -> list[tuple[float, float]]:
    """The stalls node 0 reported, as (start, end) wall-clock spans: from the last records before
    the stall to the first after it (resolved), or to the attempt's end (the last one, when the
    run ended hung)."""
    out = []
    for i, h in enumerate(hangs):
        start = h.at - h.silent_s
        if h.resolved_at is not None and h.stall_s is not None:
            out.append((h.resolved_at - h.stall_s, h.resolved_at))
        elif ended_hung and i == len(hangs) - 1:
            out.append((start, end))
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


@dataclass
class RankPlan:
    """What the attempt-level steps decided for each rank: how many of its first steps were
    redone, and the checkpoint stall every rank waits through."""

    redone: dict[int, int]
    saver_s: float


def account_rank(r: Optional[RankData], rank: int, node: int, w: Window, *, failed_at: Optional[float],
                 comm_base: Optional[float], stalls: Sequence[tuple[float, float]], redone_steps: int,
                 saver_s: float) -> RankSlot:
    """One rank's slot in seconds per bucket (see the module's docstring); sums to the window."""
    A0, A1 = w.start, w.end
    slot = RankSlot(rank, node, {k: 0.0 for k in KEYS})
    p = slot.parts
    F = None if failed_at is None else min(max(failed_at, A0), A1)
    f = first_start(r) if r is not None and r.phase("step_ns").count > 0 else None
    if r is None or f is None or r.last_t_end is None:
        if F is not None:
            p["startup"], p["after_failure"] = F - A0, A1 - F
        else:
            p["startup"] = A1 - A0
        return slot
    f = min(max(f, A0), A1)
    l = min(max(r.last_t_end / 1e9, f), A1)
    p["startup"] = f - A0
    S = l - f
    # --- the traced steps and the time between them
    step = r.phase("step_ns")
    k = min(1.0, S / _s(step.sum)) if step.sum > 0 else 1.0
    in_steps = _s(step.sum) * k
    between = S - in_steps
    ph = {c: _s(r.phase(c).sum) * k for c in ("input_ns", "comm_ns", *COMPUTE) if r.phase(c).count > 0}
    measured = sum(ph.values())
    if measured > in_steps > 0:
        ph = {c: v * in_steps / measured for c, v in ph.items()}
        measured = in_steps
    p["productive"] = sum(ph.get(c, 0.0) for c in COMPUTE)
    p["input"] = ph.get("input_ns", 0.0)
    comm = ph.get("comm_ns", 0.0)
    cph = r.phase("comm_ns")
    if comm_base is not None and cph.count > 0:
        p["straggler"] = min(comm, max(0.0, cph.sum / cph.count - comm_base) * cph.count / 1e9 * k)
    p["comm"] = comm - p["straggler"]
    p["no_phase"] = max(0.0, in_steps - measured)
    p["between"] = between
    # --- checkpoints: inside steps from time in no phase, between steps from between-step work,
    # after the last step from the tail (below)
    ck = confirmed(r).spans
    ck_tail = sum(min(s.dur_ns / 1e9, max(0.0, s.end - l)) for s in ck.recent if not s.in_step and s.end > l)
    p["checkpoint"] += slot.take(_s(ck.in_step_ns), ("no_phase",))
    p["checkpoint"] += slot.take(max(0.0, _s(ck.sum_ns - ck.in_step_ns) - ck_tail), ("between", "no_phase"))
    # every rank waits for the rank that saved (DDP's next collective): that wait is checkpointing
    # (the rank's own saves after its last step are the tail's, below: not counted twice)
    wait = max(0.0, saver_s - _s(ck.sum_ns))
    p["checkpoint"] += slot.take(wait, _CARVE_SAVER)
    # --- stalls node 0 reported, inside the steps
    for s0, s1 in stalls:
        p["hang"] += slot.take(_overlap(s0, s1, f, l), _CARVE_STALL)
    # --- steps an earlier attempt had done already
    if redone_steps > 0:
        t = time_after(r, min(redone_steps, steps_of(r)), f)
        if t is not None:
            t = min(max(t, f), l)
            inside = sum(min(s.dur_ns / 1e9, _overlap(s.start, s.end, f, t)) for s in ck.recent)
            inside += sum(_overlap(s0, s1, f, t) for s0, s1 in stalls)
            p["redone"] += slot.take_spread(max(0.0, (t - f) - inside), _CARVE_REDONE)
    # --- after the last step
    rest = A1 - l
    if F is not None:  # a failure while this rank still stepped (a peer's) ends its tail at once
        Fc = max(F, l)
        p["after_failure"] = A1 - Fc
        rest = Fc - l
    end_rest = l + rest
    for s0, s1 in stalls:
        hung = _overlap(s0, s1, l, end_rest)
        p["hang"] += hung
        rest -= hung
    tail_ck = min(ck_tail, max(0.0, rest))
    p["checkpoint"] += tail_ck
    p["tail"] = max(0.0, rest - tail_ck)
    return slot


# --- progress across attempts ----------------------------------------------------------------------
def progress_of(data: RunData, previous: Sequence[AttemptLedger],
                unsent: Optional[dict[int, Optional[int]]] = None) -> tuple[Progress, dict[int, int]]:
    """The attempt's progress (positions in steps completed) and, per rank, how many of its first
    steps an earlier attempt had done already."""
    stepped = [r for r in data.ranks if r.phase("step_ns").count > 0]
    prog = Progress()
    if not stepped:
        return prog, {}
    given = all(r.facts.progress.given for r in stepped)
    before_end = max((a.progress.end_position for a in previous if a.progress.end_position is not None),
                     default=None)
    prev = previous[-1].progress if previous else None
    if not given and prev is not None and prev.checkpoint_position is None:
        # neither the script's global step nor a checkpoint of the attempt before: where this
        # attempt resumed is not known, so neither is what it redid (not measured, never 0)
        return Progress(source="unknown", steps=max(steps_of(r) for r in stepped), redone_steps=None), {}
    resume = (prev.checkpoint_position if prev is not None and prev.checkpoint_position is not None
              else (prev.first_position if prev is not None else None)) or 0
    before_max = [a.progress.end_position_max or a.progress.end_position for a in previous]
    before_end_max = max((e for e in before_max if e is not None), default=None)
    redone: dict[int, int] = {}
    redone_max = 0
    firsts, ends, ends_max, ck_pos = [], [], [], []
    for r in stepped:
        n = steps_of(r)
        pr = r.facts.progress
        if given:
            first = pr.first.gstep if pr.first is not None else None
            end = pr.gstep_at(max(r.last_step, pr.last.step if pr.last else 0))
            first = int(first or 0)
            end_pos = (end + 1) if end is not None else first + n
        else:
            first, end_pos = resume, resume + n
        firsts.append(first)
        ends.append(end_pos)
        more = (unsent or {}).get(r.rank, 0)
        ends_max.append(None if more is None else end_pos + more)
        last = confirmed(r).spans.last
        if last is not None:
            if given and last.gstep is not None:
                ck_pos.append(last.gstep + (0 if last.in_step else 1))
            elif last.step is not None:
                ck_pos.append(first + last.step)
        redone[r.rank] = max(0, min(n, (before_end or 0) - first)) if before_end is not None else 0
        if before_end_max is not None:
            redone_max = max(redone_max, max(0, min(n, before_end_max - first)))
    ck_all = [confirmed(r).spans for r in stepped]
    last_ck = max((s.last.end for s in ck_all if s.last is not None), default=None)
    last_step_end = max((r.last_t_end or 0) / 1e9 for r in stepped)
    prog = Progress(
        source="step" if given else "inferred", steps=max(steps_of(r) for r in stepped),
        first_position=min(firsts), end_position=max(ends),
        checkpoint_position=max(ck_pos) if ck_pos else (prev.checkpoint_position if prev else None),
        checkpoints=max(s.count for s in ck_all), last_checkpoint_at=last_ck,
        unsaved_s=(round(max(0.0, last_step_end - last_ck), 3) if last_ck is not None
                   else round(max(0.0, last_step_end - min(first_start(r) or last_step_end for r in stepped)), 3)),
        redone_steps=max(redone.values()) if redone else 0)
    if None in ends_max:
        prog.end_position_max = None
    elif max(ends_max) > prog.end_position:
        prog.end_position_max = max(ends_max)
    if redone_max > (prog.redone_steps or 0):
        prog.redone_steps_max = redone_max
    return prog, redone


# --- the attempt ----------------------------------------------------------------------------------
def ended_as(status: str, reason: str) -> str:
    """How an attempt ended, in one word (a requeue also when a later attempt of its job follows)."""
    low = reason.lower()
    if status == "interrupted":
        for word, key in (("requeue", "requeued"), ("time limit", "time_limit"), ("preempt", "preempted"),
                          ("cancel", "cancelled")):
            if word in low:
                return key
        return "interrupted"
    return _ENDED.get(status, "unknown")


def failure_time(ctx: Context, data: RunData) -> Optional[float]:
    """The attempt's first failure (epoch s): the earliest failed rank's, or a node's loss."""
    if ctx.status != "failed":
        return None
    times = [r.failed_at for r in ctx.rows if r.failed_at and r.status in ("error", "crashed", "vanished")]
    times += [n.left_at for n in data.nodes if n.left_at]
    if times:
        return float(min(times))
    ends = [(r.last_t_end or 0) / 1e9 for r in data.ranks if r.last_t_end]
    return max(ends) if ends else None


def account(data: RunData, ctx: Context, *, attempt: int, previous: Sequence[AttemptLedger]) -> AttemptLedger:
    """The attempt's ledger (see the module's docstring)."""
    s = data.settings
    w = window(data, ctx.ended)
    by_rank = data.rank_by_id()
    ranks = list(by_rank.values())
    F = failure_time(ctx, data)
    stalls = _stalls(data.hangs, w.end, ctx.ended_hung)
    comm_base = _comm_means(ranks)
    progress, redone = progress_of(data, previous, ctx.unsent)
    checks = {r.rank: confirmed(r) for r in ranks}
    saver_s = max((_s(c.spans.sum_ns) for c in checks.values()), default=0.0)
    wall_ms = int(round((w.end - w.start) * 1000))
    not_measured = _not_measured(data, ranks, ctx)
    if progress.source == "unknown":
        not_measured["redone"] = (
            "where this attempt resumed is not known: the script does not give TraceML its global step and "
            "no checkpoint of the attempt before was seen (torch.save and torch.distributed.checkpoint.save "
            "are timed, other writers are not), so the steps it redid are in productive step time and the "
            "other step buckets. Pass trace_step(model, step=global_step) to count them exactly")
    hosts = {n.node: n.host for n in data.nodes}
    # per node: its slots and the milliseconds per bucket (KEYS order), added rank by rank; ranks
    # that never joined all have the same parts, so their rounding is done once
    acc: dict[int, list[int]] = {}
    rounded: dict[tuple[float, ...], list[int]] = {}
    world = max([s.world_size] + [k + 1 for k in by_rank])
    for rank in range(world):
        r = by_rank.get(rank)
        node = r.node if r is not None and r.node is not None else (rank // s.nproc_per_node if s.nproc_per_node else 0)
        parts = account_rank(r, rank, node, w, failed_at=F, comm_base=comm_base, stalls=stalls,
                             redone_steps=redone.get(rank, 0), saver_s=saver_s).parts
        key = tuple(parts[k] for k in KEYS)
        ms = rounded.get(key)
        if ms is None:
            split = apportion(parts, wall_ms)
            ms = [split[k] for k in KEYS]
            if r is None:
                rounded[key] = ms
        a = acc.get(node)
        if a is None:
            acc[node] = [1, *ms]
        else:
            a[0] += 1
            for i, v in enumerate(ms, 1):
                a[i] += v
    node_list = []
    whole = [0] * (len(KEYS) + 1)
    for a in acc.values():
        whole = list(map(add, whole, a))
    kept = sorted(acc)
    if len(kept) > MAX_NODE_ROWS:
        p = 1 + KEYS.index("productive")
        kept = sorted(sorted(kept, key=lambda n: (acc[n][p] / max(1, acc[n][0] * wall_ms), n))[:MAX_NODE_ROWS])
    for node in kept:
        a = acc[node]
        ms = dict(zip(KEYS, a[1:]))
        for k in not_measured:
            ms[k] = None
        node_list.append(NodeLedger(node, hosts.get(node) or _host(s, node), a[0], Split(a[0] * wall_ms, ms)))
    slots = whole[0]
    total = Split(slots * wall_ms, dict(zip(KEYS, whole[1:])))
    for k in not_measured:
        total.ms[k] = None
    notes = {}
    if w.start_note:
        notes["startup"] = w.start_note
    dropped = {k: c.dropped for k, c in sorted(checks.items()) if c.dropped}
    if dropped:
        notes["checkpoint"] = (
            "not counted: " + ", ".join(f"{n} checkpoint save(s) rank {k} reported" for k, n in dropped.items())
            + ", for which its own step records have no room (the time between its steps, or in them, where "
              "each ended is shorter than the save): a rank's report is counted only where its timing confirms it")
    if progress.redone_steps_max is not None:
        notes["redone"] = (f"at least {progress.redone_steps:,} and at most {progress.redone_steps_max:,} step(s) "
                           "were redone: steps an earlier attempt's ranks made before they were killed, "
                           "without their goodbye, may not have reached node 0 (the bucket counts the "
                           "ones that did)")
    elif progress.source == "inferred" and progress.redone_steps:
        notes["redone"] = ("inferred: the script does not give its global step, so this attempt is taken to "
                           "resume from the last checkpoint of the one before and to redo every step that "
                           "one made after it. Pass trace_step(model, step=global_step) for the exact count")
    public = s.public or {}
    restarts = [lc.restarts for lc in _lifecycles(data) if lc.restarts is not None]
    ended = ended_as(ctx.status, ctx.reason)
    return AttemptLedger(
        attempt=attempt, job_id=s.job_id, restart_count=restarts[0] if restarts else public.get("restart_count"),
        run_id=public.get("run_id"), start=round(w.start, 3), start_source=w.start_source,
        end=round(w.end, 3), end_source=w.end_source, slots=slots,
        unit="GPU-seconds" if ctx.device == "cuda" else "rank-seconds",
        ended=ended, reason=ctx.reason, split=total, nodes=node_list,
        nodes_total=len(acc),
        not_measured=not_measured, notes=notes, progress=progress, rebuilt=ctx.rebuilt,
        ending=ending_of(_lifecycles(data), progress, ended, w.end))


def _host(s: Any, node: int) -> str:
    return s.hostnames[node] if node < len(s.hostnames) else ""


def _not_measured(data: RunData, ranks: Sequence[RankData], ctx: Context) -> dict[str, str]:
    """Buckets this attempt could not measure, with how to measure them (their time is elsewhere)."""
    out: dict[str, str] = {}
    stepped = [r for r in ranks if r.phase("step_ns").count > 0]
    if not stepped:
        return out
    if not any(r.phase("input_ns").count > 0 for r in stepped):
        out["input"] = ("no rank timed its input (the batches come from a function, not a DataLoader "
                        "TraceML sees): wrap the loader with traceml.wrap_dataloader, or fetch the batch "
                        "inside trace_step; the wait is in time in no phase")
    if not any(r.facts.progress.first is not None for r in stepped):
        # the SDK that times checkpoints also marks each rank's start: none did
        out["checkpoint"] = ("no worker reported its checkpoint saves (the workers run a TraceML older than the "
                             "launcher's, which does not time torch.save: install this version in the workers' "
                             "environment); a save between steps is in between-step work, one inside trace_step "
                             "in time in no phase")
    if not any(r.phase("comm_ns").count > 0 for r in stepped):
        why = ("a single process: nothing to communicate" if data.settings.world_size <= 1 else
               "no rank timed its collectives (no process group in the traced steps, or a DDP model "
               "TraceML could not time); the wait is in time in no phase")
        out["comm"] = why
        out["straggler"] = why
    return out
