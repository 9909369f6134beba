"""The live snapshot: what the aggregator tells the live views, and how the views read it.

Two halves, one data model:

* :func:`snapshot_frame` runs **inside the aggregator's loop** when node 0's launcher sends
  ``{"t": "snapshot", "id": N, "series": bool, "verdict": bool}`` on its control connection
  (see wire/protocol.py). It first computes the statistics of frames still pending, then reads
  the per-rank raw tail (kept in ``cli``/``dashboard`` modes only) and counters the aggregator
  already keeps, costs O(ranks x recent records) (plus a provisional summary when ``verdict`` is asked
  for, every few seconds) and never raises: an internal error comes back as ``"error"`` in the
  frame, so a bug here cannot close the launcher's control connection.
* :func:`read_snapshot` runs **in the launcher** and turns frames into :class:`LiveState`
  (dataclasses the terminal view and the dashboard both render). Staleness is computed from the
  aggregator's own clock (``server_time - last_seen``), so clock skew between processes does not
  matter, and it keeps growing between snapshots (:meth:`LiveState.aged`): a view never freezes
  on the last good numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..aggregator.state import RunState

#: at most this many ranks are described in one frame (live views are single-node: 8-16 ranks)
MAX_RANKS = 128
#: the "recent" statistics of a rank use its last records, at most this many
RECENT_RECORDS = 64
#: recent step times sent per rank for the terminal's sparkline
SPARK_POINTS = 32
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

#: ``comm`` is the exposed communication (the wait), measured on distributed runs only
PHASES = ("step", "input", "forward", "backward", "optimizer", "h2d", "comm")
_COLS = tuple(p + "_ns" for p in PHASES)


# --- aggregator side --------------------------------------------------------------------------------
def snapshot_frame(state: "RunState", msg: dict[str, Any]) -> dict[str, Any]:
    """The ``snapshot`` reply for one request, from the run state alone; never raises."""
    rid = msg.get("id")
    try:
        return _build(state, msg, rid)
    except Exception as exc:  # never let a view's request hurt the aggregator
        return {"t": "snapshot", "id": rid, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _recent(rs: Any, k: int) -> dict[str, list[int]]:
    """The last ``k`` records of a rank's raw tail, per column (oldest first)."""
    parts: list[dict[str, list[int]]] = []
    have = 0
    for _seq, n, cols in reversed(rs.tail):
        take = min(n, k - have)
        parts.append({c: cols[c][n - take:] for c in _COLS + ("t_end_ns", "mem_peak")})
        have += take
        if have >= k:
            break
    out: dict[str, list[int]] = {c: [] for c in _COLS + ("t_end_ns", "mem_peak")}
    for p in reversed(parts):
        for c, v in p.items():
            out[c].extend(v)
    return out


def _median(xs: list[int]) -> Optional[float]:
    vals = sorted(v for v in xs if v >= 0)
    if not vals:
        return None
    m = len(vals) // 2
    return float(vals[m]) if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2.0


def _rank(rs: Any, series: bool) -> dict[str, Any]:
    rec = _recent(rs, RECENT_RECORDS)
    t = rec["t_end_ns"]
    span = (t[-1] - t[0]) / 1e9 if len(t) >= 2 else 0.0
    mem = [m for m in rec["mem_peak"] if m >= 0]
    out = {
        "rank": rs.rank, "node": rs.node, "host": rs.host, "local_rank": rs.local_rank, "pid": rs.pid,
        "connected": rs.connected, "joined_at": rs.joined_at, "last_seen": rs.last_seen,
        "closed_at": rs.closed_at, "bye": (rs.bye or {}).get("status"),
        "error": ((rs.bye or {}).get("error") or "")[:300] or None,
        "received": rs.received, "last_step": rs.last_step, "gaps": rs.gaps,
        "client_dropped": rs.client_dropped,
        "recent": {
            "n": len(t), "span_s": round(span, 4),
            "steps_per_s": round((len(t) - 1) / span, 3) if span > 0 else None,
            "ms": {p: (None if (m := _median(rec[c])) is None else round(m / 1e6, 4))
                   for p, c in zip(PHASES, _COLS)},
            "mem_peak": mem[-1] if mem else None,
            "spark_ms": [round(v / 1e6, 3) for v in rec["step_ns"][-SPARK_POINTS:] if v >= 0],
        },
    }
    if series:  # the whole run so far, per step bucket (the same series as the report's)
        from ..report.timeline import rank_series

        s = rs.series
        per = rank_series({"rank": rs.rank, "node": rs.node, "host": rs.host, "series": s.to_data()},
                          s.width, s.used, 0.0)
        out["series"] = {"width": s.width, "step_ms": per["step_ms"], "own_ms": per["own_ms"],
                         "phases_ms": per["phases_ms"], "mem_max": per["mem_max_bytes"] or [None] * s.used}
    return out


def _build(st: "RunState", msg: dict[str, Any], rid: Any) -> dict[str, Any]:
    s = st.settings
    frame: dict[str, Any] = {
        "t": "snapshot", "id": rid, "server_time": time.time(), "started_at": s.started_at,
        "run_name": s.run_name, "world_size": s.world_size, "nnodes": s.nnodes,
        "nproc_per_node": s.nproc_per_node, "mode": s.mode, "records": st.records,
        "finishing": st.finish is not None,
        "ranks": [_rank(st.ranks[r], bool(msg.get("series"))) for r in sorted(st.ranks)[:MAX_RANKS]],
        "system": [st.system[n].to_data() for n in sorted(st.system)[:MAX_RANKS]],
        "counters": dict(st.counters),
    }
    if msg.get("verdict") and s.world_size <= MAX_RANKS:
        from ..report.summary import build_summary

        summ = build_summary(st.to_data(), provisional=True)
        frame["verdict"] = {k: summ["verdict"].get(k) for k in ("kind", "severity", "why", "next_step", "culprit")}
    return frame


# --- launcher side ----------------------------------------------------------------------------------
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
    series: Optional[dict[str, Any]] = None
    #: steps/s over the last poll (from received counts), None before two snapshots
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
    verdict: Optional[dict[str, Any]]
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
        rate = None
        p = prev_ranks.get(r["rank"])
        if p is not None and prev is not None:
            dt = server_time - float(prev.get("server_time") or server_time)
            if dt > 0:
                rate = round(max(0, r.get("received", 0) - p.get("received", 0)) / dt, 3)
        ranks[r["rank"]] = RankLive(
            rank=r["rank"], node=r.get("node"), host=r.get("host") or "", local_rank=r.get("local_rank"),
            state=state, age_s=age, note=note, last_step=int(r.get("last_step", -1)),
            received=int(r.get("received", 0)), steps_per_s=rec.get("steps_per_s"), ms=ms,
            mem_peak=rec.get("mem_peak"), spark_ms=list(rec.get("spark_ms") or []),
            bye=r.get("bye"), error=r.get("error"), series=r.get("series"), rate=rate)
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
    verdict = frame.get("verdict") or (prev_state.verdict if prev_state else None)
    return LiveState(
        run_name=str(frame.get("run_name") or ""), world_size=world,
        nnodes=int(frame.get("nnodes") or 1), elapsed_s=since_start,
        records=int(frame.get("records") or 0), ranks=[ranks[k] for k in sorted(ranks)],
        nodes=nodes, verdict=verdict, finishing=bool(frame.get("finishing")),
        read_at=now_m, error=frame.get("error"))
