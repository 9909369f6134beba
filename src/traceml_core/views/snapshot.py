"""The live snapshot as the views see it: :class:`~traceml_core.livesnapshot.LiveSnapshot` judged.

:func:`read_snapshot` runs **in the launcher**: each rank's state and how long it has been silent,
its rate and the nodes' means since the previous snapshot (:class:`LiveState`, which the terminal
view and the dashboard both render). Staleness is computed from the aggregator's own clock
(``server_time - last_seen``), so clock skew between processes does not matter, and it keeps
growing between snapshots (:meth:`LiveState.aged`): a view never freezes on the last good numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..livesnapshot import PHASES, LiveSnapshot, LiveVerdict, RankSnap

__all__ = ["PHASES", "LiveState", "RankLive", "NodeLive", "GpuLive", "read_snapshot"]

#: a connected rank is stale after max(STALE_MIN_S, STALE_STEPS x its recent step time) without
#: data: clients ship every 50 ms, so 3 s of silence is never batching, and a 10 s step may
#: legitimately be silent for a few steps
STALE_MIN_S = 3.0
STALE_STEPS = 5.0
#: a rank that has not connected this long after the start is flagged
JOIN_GRACE_S = 30.0

#: the verdict so far is asked for (and shown) once a rank has this many steps; before that it
#: could only say "too few steps" (thresholds.WARMUP_STEPS + thresholds.MIN_STEPS)
VERDICT_AFTER_STEPS = 25


@dataclass(frozen=True)
class RankLive(RankSnap):
    """A rank as the aggregator described it, judged."""

    #: "starting" (connected, no step yet), "ok", "stale" (connected, silent too long),
    #: "gone" (connection closed without bye), "ended" (said bye), "waiting" (never connected)
    state: str = "waiting"
    #: seconds since this rank's last data (None: never sent any)
    age_s: Optional[float] = None
    note: str = ""
    #: steps/s between the last two snapshots, by the rank's own step times (see ``_rate``),
    #: None before two snapshots
    rate: Optional[float] = None

    @property
    def short(self) -> str:
        """The state in a few words, for a table cell (``note`` has the sentence)."""
        age = _secs(self.age_s)
        return {"ok": f"ok {age}", "starting": "no step yet", "stale": f"no data {age}",
                "gone": f"lost, no data {age}", "ended": f"ended {self.bye}",
                "waiting": f"waiting {age}" if self.note else "waiting"}.get(self.state, self.state)

    @property
    def stale(self) -> bool:
        return self.state in ("stale", "gone") or (self.state == "waiting" and bool(self.note))


@dataclass
class GpuLive:
    index: int
    util_pct: Optional[float]
    mem_used: Optional[float]
    mem_total: Optional[float]
    temp_c: Optional[float]
    power_w: Optional[float]


@dataclass
class NodeLive:
    node: int
    host: str
    cpu_pct: Optional[float]
    ram_used: Optional[float]
    ram_total: Optional[float]
    gpus: list[GpuLive]
    age_s: Optional[float]


@dataclass
class LiveState:
    run_name: str
    world_size: int
    nnodes: int
    elapsed_s: float
    records: int
    ranks: list[RankLive]
    nodes: list[NodeLive]
    #: the verdict so far (the aggregator's provisional summary), None before one was asked for
    verdict: Optional[LiveVerdict]
    finishing: bool
    #: monotonic time this state was read (for :meth:`aged`)
    read_at: float = field(default_factory=time.monotonic)
    error: Optional[str] = None

    def aged(self, now: Optional[float] = None) -> "LiveState":
        """This state as it looks ``now`` (monotonic): ages and the elapsed time keep growing, so
        a rank (or the whole run) that stops sending is shown as stale even when no new
        snapshot arrives."""
        dt = max(0.0, (time.monotonic() if now is None else now) - self.read_at)
        if dt <= 0:
            return self
        return replace(self, elapsed_s=self.elapsed_s + dt, ranks=[_restale(r, dt) for r in self.ranks],
                       read_at=self.read_at + dt)

    @property
    def stale_ranks(self) -> list[RankLive]:
        return [r for r in self.ranks if r.stale]


def _judge(r: RankSnap, base: str, age: Optional[float]) -> tuple[str, str]:
    """(state, note) of a rank ``base`` ("connected", "gone" or "waiting") from how long it has
    been silent."""
    if base == "waiting":
        return "waiting", f"not connected after {_secs(age)}" if age is not None and age > JOIN_GRACE_S else ""
    if r.bye:
        return "ended", f"ended {r.bye}" + (f": {r.error.splitlines()[-1][:80]}" if r.error else "")
    if base == "gone":
        return "gone", f"connection lost without a bye, no data for {_secs(age)}"
    if r.last_step < 0:
        return "starting", f"connected, no step yet ({_secs(age)})"
    step = r.recent.ms.get("step")
    if age is not None and age > max(STALE_MIN_S, STALE_STEPS * step / 1000.0 if step else 0.0):
        return "stale", f"no data for {_secs(age)}"
    return "ok", f"ok ({_secs(age)} ago)"


def _restale(r: RankLive, dt: float) -> RankLive:
    """``r`` as it looks ``dt`` seconds later without news: its silence grows."""
    if r.state == "ended" or r.age_s is None:
        return r
    age = r.age_s + dt
    state, note = _judge(r, r.state if r.state in ("gone", "waiting") else "connected", age)
    return replace(r, age_s=age, state=state, note=note)


def _secs(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min"


def _means(cur: Any, prev: Any, old: Any, metrics: tuple[str, ...]) -> dict[str, Optional[float]]:
    """Per metric, the mean of a node's (or GPU's) samples since the previous snapshot ``prev``
    (the whole-run mean without one); the value shown before (``old``'s) when none arrived since."""
    out = {}
    for k in metrics:
        c, p, o = getattr(cur, k), getattr(prev, k, None), getattr(old, k, None)
        out[k] = ((c.sum - p.sum) / (c.n - p.n) if c.n > p.n else o) if p is not None else (c.mean if c.n else o)
    return out


def _rate(now: RankSnap, before: RankSnap) -> Optional[float]:
    """Steps/s of one rank between two snapshots, timed by the rank's own clock: the steps it
    finished since the previous snapshot over the time between the ends of the two latest steps.
    Records arrive in bursts (the relay batches them), so steps over the poll's wall time can
    exceed what the rank can do (104 steps/s from 10.7 ms steps). 0 with no new step."""
    t1, t0 = now.recent.last_t_end_ns, before.recent.last_t_end_ns
    steps = now.last_step - before.last_step
    if steps > 0 and t1 is not None and t0 is not None and t1 > t0:
        return round(steps / ((t1 - t0) / 1e9), 3)
    return 0.0 if steps == 0 else None


def read_snapshot(snap: LiveSnapshot, prev: Optional[LiveSnapshot] = None,
                  prev_state: Optional[LiveState] = None, now: Optional[float] = None) -> LiveState:
    """Judge a snapshot: a :class:`LiveState`. ``prev`` (the previous snapshot) gives rates and
    system means since then; ``prev_state`` supplies values (system samples, the verdict) that
    this snapshot did not refresh."""
    now_m = time.monotonic() if now is None else now
    server_time = snap.server_time or time.time()
    prev_ranks = {r.rank: r for r in prev.ranks} if prev is not None else {}
    ranks: dict[int, RankLive] = {}
    for r in snap.ranks:
        age = max(0.0, server_time - r.last_seen) if r.last_seen is not None else None
        state, note = _judge(r, "connected" if r.connected else "gone", age)
        p = prev_ranks.get(r.rank)
        ranks[r.rank] = RankLive(**vars(r), state=state, age_s=age, note=note,
                                 rate=None if p is None else _rate(r, p))
    since_start = max(0.0, server_time - (snap.started_at or server_time))
    nproc = snap.nproc_per_node
    for rank in range(snap.world_size):
        if rank not in ranks:
            ranks[rank] = _restale(RankLive(rank, node=rank // nproc if nproc else 0, age_s=since_start), 0.0)
    prev_nodes = {n.node: n for n in prev.nodes} if prev is not None else {}
    old_nodes = {n.node: n for n in (prev_state.nodes if prev_state else [])}
    nodes = []
    for n in snap.nodes:
        p, old = prev_nodes.get(n.node), old_nodes.get(n.node)
        prev_gpus = {g.index: g for g in (p.gpus if p else [])}
        old_gpus = {g.index: g for g in (old.gpus if old else [])}
        gpus = [GpuLive(g.index, mem_total=g.mem_total.max, **_means(g, prev_gpus.get(g.index), old_gpus.get(
                    g.index), ("util_pct", "mem_used", "temp_c", "power_w"))) for g in n.gpus]
        nodes.append(NodeLive(n.node, n.host, ram_total=n.ram_total.max, gpus=gpus,
                              age_s=max(0.0, server_time - n.last_ts) if n.last_ts else None,
                              **_means(n, p, old, ("cpu_pct", "ram_used"))))
    return LiveState(
        run_name=snap.run_name, world_size=snap.world_size, nnodes=snap.nnodes, elapsed_s=since_start,
        records=snap.records, ranks=[ranks[k] for k in sorted(ranks)], nodes=nodes,
        verdict=snap.verdict or (prev_state.verdict if prev_state else None), finishing=snap.finishing,
        read_at=now_m, error=snap.error)
