"""The live snapshot as the views read it: ``snapshot`` frames -> :class:`LiveState`.

The aggregator builds the frames (``aggregator/snapshot.py``, inside its loop, when node 0's
launcher asks on its control connection). :func:`read_snapshot` runs **in the launcher** and turns
frames into :class:`LiveState` (dataclasses the terminal view and the dashboard both render).
Staleness is computed from the aggregator's own clock (``server_time - last_seen``), so clock skew
between processes does not matter, and it keeps growing between snapshots
(:meth:`LiveState.aged`): a view never freezes on the last good numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..aggregator.snapshot import PHASES
from ..report.document import Verdict

__all__ = ["PHASES", "LiveState", "LiveSeries", "RankLive", "NodeLive", "GpuLive", "read_snapshot"]

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


@dataclass
class RankLive:
    rank: int
    node: Optional[int]
    host: str
    local_rank: Optional[int]
    #: "starting" (connected, no step yet), "ok", "stale" (connected, silent too long),
    #: "gone" (connection closed without bye), "ended" (said bye), "waiting" (never connected)
    state: str
    #: seconds since this rank's last data (None: never sent any)
    age_s: Optional[float]
    note: str
    last_step: int
    received: int
    steps_per_s: Optional[float]
    ms: dict[str, Optional[float]]
    mem_peak: Optional[int]
    spark_ms: list[float]
    bye: Optional[str] = None
    error: Optional[str] = None
    #: the whole run so far per step bucket (dashboard only), None when not asked for
    series: Optional["LiveSeries"] = None
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
class LiveSeries:
    """A rank's run so far, per bucket of ``width`` steps (the report's series, up to now)."""

    width: int
    step_ms: list[Optional[float]]
    own_ms: list[Optional[float]]
    phases_ms: dict[str, list[Optional[float]]]
    mem_max: list[Optional[int]]

    @classmethod
    def from_frame(cls, s: Any) -> Optional["LiveSeries"]:
        if not isinstance(s, dict):
            return None
        return cls(int(s.get("width") or 1), list(s.get("step_ms") or []), list(s.get("own_ms") or []),
                   dict(s.get("phases_ms") or {}), list(s.get("mem_max") or []))


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
    verdict: Optional[Verdict]
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
        ranks = [_restale(r, dt) for r in self.ranks]
        return LiveState(self.run_name, self.world_size, self.nnodes, self.elapsed_s + dt,
                         self.records, ranks, self.nodes, self.verdict, self.finishing,
                         self.read_at + dt, self.error)

    @property
    def stale_ranks(self) -> list[RankLive]:
        return [r for r in self.ranks if r.stale]


def _threshold(ms: dict[str, Optional[float]]) -> float:
    step = ms.get("step")
    return max(STALE_MIN_S, STALE_STEPS * step / 1000.0) if step else STALE_MIN_S


def _judge(state: str, age: Optional[float], ms: dict[str, Optional[float]], bye: Optional[str],
           last_step: int, error: Optional[str]) -> tuple[str, str]:
    """(state, note) of a rank from how long it has been silent."""
    if bye:
        return "ended", f"ended {bye}" + (f": {error.splitlines()[-1][:80]}" if error else "")
    if state == "gone":
        return "gone", f"connection lost without a bye, no data for {_secs(age)}"
    if last_step < 0:
        return "starting", f"connected, no step yet ({_secs(age)})"
    if age is not None and age > _threshold(ms):
        return "stale", f"no data for {_secs(age)}"
    return "ok", f"ok ({_secs(age)} ago)"


def _restale(r: RankLive, dt: float) -> RankLive:
    if r.state in ("ended", "waiting") or r.age_s is None:
        if r.state == "waiting" and r.age_s is not None:
            age = r.age_s + dt
            note = f"not connected after {_secs(age)}" if age > JOIN_GRACE_S else ""
            return _replace(r, age_s=age, note=note)
        return r
    age = r.age_s + dt
    base = "gone" if r.state == "gone" else "connected"
    state, note = _judge(base, age, r.ms, r.bye, r.last_step, r.error)
    return _replace(r, age_s=age, state=state, note=note)


def _replace(r: RankLive, **kw: Any) -> RankLive:
    d = dict(r.__dict__)
    d.update(kw)
    return RankLive(**d)


def _secs(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min"


def _delta_mean(cur: dict[str, Any], prev: Optional[dict[str, Any]]) -> Optional[float]:
    """Mean of a running ``{n, sum, max}`` over the samples since the previous snapshot (the
    whole-run mean without one); None when no sample arrived since."""
    n, s = cur.get("n") or 0, cur.get("sum") or 0.0
    if prev is None:
        return s / n if n else None
    pn = prev.get("n") or 0
    if n > pn:
        return (s - (prev.get("sum") or 0.0)) / (n - pn)
    return None


def _keep(new: Optional[float], old: Optional[float]) -> Optional[float]:
    return old if new is None else new


def _rate(now: dict[str, Any], before: dict[str, Any], poll_s: float) -> Optional[float]:
    """Steps/s of one rank between two snapshots, timed by the rank's own clock: the steps it
    finished since the previous snapshot over the time between the ends of the two latest steps.
    Records arrive in bursts (the relay batches them), so steps over the poll's wall time can
    exceed what the rank can do (104 steps/s from 10.7 ms steps). With no new step, 0 over the
    poll; without the rank's times (an older aggregator), received records over the poll."""
    t1 = (now.get("recent") or {}).get("last_t_end_ns")
    t0 = (before.get("recent") or {}).get("last_t_end_ns")
    steps = int(now.get("last_step", -1)) - int(before.get("last_step", -1))
    if steps > 0 and t1 is not None and t0 is not None and t1 > t0:
        return round(steps / ((t1 - t0) / 1e9), 3)
    if poll_s <= 0:
        return None
    if steps == 0:
        return 0.0
    return round(max(0, now.get("received", 0) - before.get("received", 0)) / poll_s, 3)


def read_snapshot(frame: dict[str, Any], prev: Optional[dict[str, Any]] = None,
                  prev_state: Optional[LiveState] = None, now: Optional[float] = None) -> LiveState:
    """Turn a ``snapshot`` frame into a :class:`LiveState`. ``prev`` (the previous frame) gives
    rates and system means since then; ``prev_state`` supplies values (system samples, the
    verdict) that this frame did not refresh."""
    now_m = time.monotonic() if now is None else now
    server_time = float(frame.get("server_time") or time.time())
    world = int(frame.get("world_size") or 0)
    nproc = int(frame.get("nproc_per_node") or 1)
    prev_ranks = {r["rank"]: r for r in (prev or {}).get("ranks", [])}
    ranks: dict[int, RankLive] = {}
    for r in frame.get("ranks", []):
        rec = r.get("recent") or {}
        ms = dict(rec.get("ms") or {})
        last = r.get("last_seen")
        age = max(0.0, server_time - last) if last is not None else None
        base = "connected" if r.get("connected") else "gone"
        if not r.get("connected") and r.get("closed_at") is not None and last is not None:
            age = max(0.0, server_time - last)
        state, note = _judge(base, age, ms, r.get("bye"), int(r.get("last_step", -1)), r.get("error"))
        p = prev_ranks.get(r["rank"])
        rate = None if p is None or prev is None else _rate(r, p, server_time - float(prev.get("server_time") or server_time))
        ranks[r["rank"]] = RankLive(
            rank=r["rank"], node=r.get("node"), host=r.get("host") or "", local_rank=r.get("local_rank"),
            state=state, age_s=age, note=note, last_step=int(r.get("last_step", -1)),
            received=int(r.get("received", 0)), steps_per_s=rec.get("steps_per_s"), ms=ms,
            mem_peak=rec.get("mem_peak"), spark_ms=list(rec.get("spark_ms") or []),
            bye=r.get("bye"), error=r.get("error"), series=LiveSeries.from_frame(r.get("series")),
            rate=rate)
    started = float(frame.get("started_at") or server_time)
    since_start = max(0.0, server_time - started)
    for rank in range(world):
        if rank not in ranks:
            note = f"not connected after {_secs(since_start)}" if since_start > JOIN_GRACE_S else ""
            ranks[rank] = RankLive(rank, rank // nproc if nproc else 0, "", None, "waiting",
                                   since_start, note, -1, 0, None, {}, None, [])
    prev_sys = {n["node"]: n for n in (prev or {}).get("system", [])}
    old_nodes = {n.node: n for n in (prev_state.nodes if prev_state else [])}
    nodes = []
    for n in frame.get("system", []):
        p = prev_sys.get(n["node"])
        old = old_nodes.get(n["node"])
        old_gpus = {g.index: g for g in (old.gpus if old else [])}
        pg = {g["index"]: g for g in (p or {}).get("gpus", [])}
        gpus = []
        for g in n.get("gpus", []):
            q = pg.get(g["index"]) if p is not None else None
            og = old_gpus.get(g["index"])
            vals = {k: _keep(_delta_mean(g.get(k) or {}, (q or {}).get(k) if p is not None else None),
                             getattr(og, k, None))
                    for k in ("util_pct", "mem_used", "temp_c", "power_w")}
            gpus.append(GpuLive(g["index"], vals["util_pct"], vals["mem_used"],
                                (g.get("mem_total") or {}).get("max"), vals["temp_c"], vals["power_w"]))
        last_ts = n.get("last_ts")
        nodes.append(NodeLive(
            n["node"], n.get("host") or "",
            _keep(_delta_mean(n.get("cpu_pct") or {}, (p or {}).get("cpu_pct") if p else None),
                  old.cpu_pct if old else None),
            _keep(_delta_mean(n.get("ram_used") or {}, (p or {}).get("ram_used") if p else None),
                  old.ram_used if old else None),
            (n.get("ram_total") or {}).get("max"), gpus,
            max(0.0, server_time - last_ts) if last_ts else None))
    verdict = (Verdict.from_json(frame["verdict"]) if isinstance(frame.get("verdict"), dict)
               else prev_state.verdict if prev_state else None)
    return LiveState(
        run_name=str(frame.get("run_name") or ""), world_size=world,
        nnodes=int(frame.get("nnodes") or 1), elapsed_s=since_start,
        records=int(frame.get("records") or 0), ranks=[ranks[k] for k in sorted(ranks)],
        nodes=nodes, verdict=verdict, finishing=bool(frame.get("finishing")),
        read_at=now_m, error=frame.get("error"))
