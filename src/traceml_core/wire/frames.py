"""One validator per frame type, applied once, where the frame enters from a peer.

:data:`VALIDATORS` maps each frame type to the function that checks it (and returns it, trimmed
where a field may be long); :data:`ACCEPTS` says which types each kind of connection may send.
:func:`validate` is what the servers call at their trust boundary: the relay for a rank's frames,
the aggregator for a relay's and the launcher's, the client for the server's. Everything after
that point may rely on the shapes checked here.

Requests (``req``/``resp``, see wire/protocol.py) are one table, :data:`REQUESTS`: a kind, a
validator of its arguments and one of its answer's ``data``. To add a request kind (e.g. stack
dumps for a hang autopsy): add a :class:`Request` row here, a responder in
``traceml_core/sdk/responders.py``, and read the answers where the aggregator collects them
(``aggregator/ingest.py``, ``Ingest.resp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import gt, itemgetter
from typing import Any, Callable, Optional

from .. import limits
from ..limits import Limit
from ..statistics import window as _window
from ..statistics.window import MAX_VALUE
from . import fold
from .protocol import (BYE_STATUSES, DURATION_COLUMNS, GPU_FIELDS, LAUNCH_PHASES, LAUNCHER_SIGNALS, PEAK_COLUMNS, STEP_COLUMNS,
                       STEP_SOURCES, SUM_COLUMNS, SYSTEM_FIELDS, ProtocolError, host_name)

# MAX_VALUE: larger values are refused as malformed (2**62: what a window of the statistics
# holds, statistics/window.py); each column has its own, lower, physical bound (COLUMN_LIMITS)
MAX_TEXT = 4000
MAX_RANKS_IN_REQ = 1 << 20

# --- measured values: one physical bound per kind of field (traceml_core/limits.py) ----------------
#: the bound of each step column (a frame holding a value past it is refused, its records lost and
#: counted); the step index and the clock keep the protocol's own range
COLUMN_LIMITS: dict[str, int] = {
    "step": MAX_VALUE, "t_end_ns": MAX_VALUE, **{name: limits.STEP_NS.hi for name in DURATION_COLUMNS},
    "mem_peak": limits.BYTES.hi, "comm_busy_ns": limits.STEP_NS.hi, "comm_bytes": limits.BYTES.hi,
    "comm_bus_bytes": limits.BYTES.hi, "comm_calls": limits.CALLS.hi,
}
assert set(COLUMN_LIMITS) == set(STEP_COLUMNS), "every step column needs its bound"
#: the bound of each field of a system sample (wire/protocol.SYSTEM_FIELDS, GPU_FIELDS)
SAMPLE_LIMITS: dict[str, Limit] = {"cpu_pct": limits.PERCENT, "ram_used": limits.BYTES, "ram_total": limits.BYTES}
GPU_LIMITS: dict[str, Limit] = {"util_pct": limits.PERCENT, "mem_used": limits.BYTES, "mem_total": limits.BYTES,
                                "temp_c": limits.CELSIUS, "power_w": limits.WATTS}
assert ("ts", *SAMPLE_LIMITS, "gpus") == SYSTEM_FIELDS and ("index", *GPU_LIMITS) == GPU_FIELDS
#: samples in one ``system`` frame, GPUs in one sample
MAX_SAMPLES_PER_FRAME = 10_000
MAX_GPUS = 64
#: where a validator counts the values it refused (left out as not measured) in the frame it
#: returns; the receiver adds it to the run's ``values_refused`` (a peer cannot set it: validate
#: removes it first)
REFUSED = "refused_values"
_NUM = (int, float)


def measured(msg: dict[str, Any], v: Any, lim: Limit, what: str) -> Any:
    """``v`` when it is a measurement within ``lim``; None (not measured, counted in
    ``msg[REFUSED]``) for a number outside it, NaN and infinity included. None stays None; a
    value that is not a number is a malformed frame."""
    if v is None:
        return None
    if type(v) not in _NUM:
        raise ProtocolError(f"{msg.get('t')}: {what} is not a number")
    if lim.lo <= v <= lim.hi:  # False for NaN
        return v
    msg[REFUSED] = msg.get(REFUSED, 0) + 1
    return None


def _int(msg: dict[str, Any], key: str, *, lo: int = 0, optional: bool = False) -> None:
    v = msg.get(key)
    if v is None and optional:
        return
    if type(v) is not int or v < lo or v > MAX_VALUE:
        raise ProtocolError(f"{msg.get('t')}: {key} must be an integer >= {lo}")


def _str(msg: dict[str, Any], key: str, limit: int = MAX_TEXT, optional: bool = False) -> None:
    v = msg.get(key)
    if v is None and optional:
        return
    if not isinstance(v, str):
        raise ProtocolError(f"{msg.get('t')}: {key} must be a string")
    if len(v) > limit:
        msg[key] = v[:limit]


_INT_ONLY = {int}


def check_columns(cols: Any, n: int) -> None:
    """Every column of :data:`STEP_COLUMNS` a list of ``n`` integers from -1 to the column's bound
    (:data:`COLUMN_LIMITS`; C-level passes: the set of element types, ``max``, ``min``; no Python
    statement per value)."""
    if type(cols) is not dict:
        raise ProtocolError("steps: cols must be a map")
    for name in STEP_COLUMNS:
        col = cols.get(name)
        if type(col) is not list or len(col) != n:
            raise ProtocolError(f"steps: column {name!r} is not a list of {n} values")
        if not n:
            continue
        if set(map(type, col)) != _INT_ONLY:
            raise ProtocolError(f"steps: column {name!r} holds non-integers")
        if max(col) > COLUMN_LIMITS[name] or min(col) < -1:
            raise ProtocolError(f"steps: column {name!r} holds a value out of range (-1..{COLUMN_LIMITS[name]})")


def check_steps(msg: dict[str, Any]) -> dict[str, Any]:
    _int(msg, "rank")
    _int(msg, "seq")
    _int(msg, "n")
    if msg.setdefault("dropped", 0) is not None:
        _int(msg, "dropped")
    _int(msg, "open", optional=True)
    check_columns(msg.get("cols"), msg["n"])
    return msg


#: where a window's value holds each column's maximum, and that column's bound: a window whose
#: maxima are within the bounds holds only values within them (the rule of check_columns)
_BOUNDED = (*DURATION_COLUMNS, *PEAK_COLUMNS, *SUM_COLUMNS)
_fold_maxima = itemgetter(*(_window.AT[f"{c}.max"] for c in _BOUNDED))
_FOLD_LIMITS = tuple(COLUMN_LIMITS[c] for c in _BOUNDED)


def check_fold(msg: dict[str, Any]) -> dict[str, Any]:
    """A relay's ``fold`` frame (wire/fold.py): the accounting fields of ``steps``, then the
    window's value, checked by the value's own rules (statistics/window.WindowStats.from_wire) and kept
    in ``msg["value"]``; after this node 0 merges it without another check."""
    _int(msg, "rank")
    _int(msg, "seq")
    _int(msg, "n", lo=1)
    if msg.setdefault("dropped", 0) is not None:
        _int(msg, "dropped")
    _int(msg, "open", optional=True)
    try:
        msg["value"] = value = fold.value_of(msg)
    except ValueError as exc:
        raise ProtocolError(f"fold: {exc}") from None
    if any(map(gt, _fold_maxima(value.v), _FOLD_LIMITS)):
        raise ProtocolError("fold: a column's maximum is past its bound")
    return msg


def check_tail(msg: dict[str, Any]) -> dict[str, Any]:
    """A relay's ``tail`` frame (wire/fold.py): a window's last records, for the live views."""
    _int(msg, "rank")
    _int(msg, "seq")
    _int(msg, "n", lo=1)
    if msg["n"] > fold.TAIL_MAX:
        raise ProtocolError(f"tail: at most {fold.TAIL_MAX} records")
    check_columns(msg.get("cols"), msg["n"])
    return msg


def _json_object(text: str) -> Optional[dict[str, Any]]:
    """An event's JSON payload (at most 2,000 characters), when it is an object."""
    import json

    if len(text) > 2000:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def step_source(text: str) -> Optional[dict[str, Any]]:
    """The ``step_source`` event's payload, validated: ``{"source"}`` (one of STEP_SOURCES) plus
    optional ``accumulation``/``backward_per_step`` (int >= 0), ``backward_steps`` ([int, int]),
    ``forward`` (bool), ``framework``/``note`` (short strings). None if it is not that."""
    raw = _json_object(text)
    if raw is None or raw.get("source") not in STEP_SOURCES:
        return None
    out: dict[str, Any] = {"source": raw["source"]}
    for key in ("accumulation", "backward_per_step"):
        v = raw.get(key)
        if type(v) is int and 0 <= v < 1_000_000:
            out[key] = v
    bs = raw.get("backward_steps")
    if isinstance(bs, list) and len(bs) == 2 and all(type(x) is int and x >= 0 for x in bs):
        out["backward_steps"] = bs
    if type(raw.get("forward")) is bool:
        out["forward"] = raw["forward"]
    for key in ("framework", "note"):
        v = raw.get(key)
        if isinstance(v, str):
            out[key] = v[:200]
    return out


#: the most tokens and FLOPs one step may be declared to be worth (far beyond any model today)
MAX_TOKENS_PER_STEP = 1e12
MAX_FLOPS_PER_STEP = 1e24


def rank_fact(kind: str, text: str) -> Optional[dict[str, Any]]:
    """The payload of a ``span``, ``progress`` or ``work`` event (traceml_core/rankfacts.py),
    checked: every field within its bound or dropped (a time outside :data:`limits.EPOCH_S`, a
    negative step); None when the text is not such a payload at all (then the event is ignored)."""
    from ..rankfacts import SPAN_KINDS

    raw = _json_object(text)
    if raw is None:
        return None

    def count(v: Any) -> Optional[int]:
        return v if type(v) is int and 0 <= v <= MAX_VALUE else None

    def when(v: Any) -> Optional[float]:
        return float(v) if type(v) in _NUM and limits.EPOCH_S.lo < v <= limits.EPOCH_S.hi else None

    def amount(v: Any, hi: float) -> Optional[float]:
        return float(v) if type(v) in _NUM and 0 <= v <= hi else None

    def word(v: Any, n: int) -> Optional[str]:
        return v[:n] if isinstance(v, str) else None

    if kind == "span":
        dur, end = raw.get("dur_ns"), when(raw.get("end"))
        if raw.get("span") not in SPAN_KINDS or type(dur) is not int or not 0 <= dur <= limits.STEP_NS.hi \
                or end is None:
            return None
        return {"span": raw["span"], "dur_ns": dur, "end": end, "step": count(raw.get("step")),
                "gstep": count(raw.get("gstep")), "in_step": raw.get("in_step") is True,
                "api": word(raw.get("api"), 64) or ""}
    if kind == "progress":
        if count(raw.get("step")) is None:
            return None
        return {"step": raw["step"], "gstep": count(raw.get("gstep")), "start": when(raw.get("start")),
                "end": when(raw.get("end"))}
    if kind == "work":
        return {"tokens_per_step": amount(raw.get("tokens_per_step"), MAX_TOKENS_PER_STEP),
                "samples_per_step": amount(raw.get("samples_per_step"), MAX_TOKENS_PER_STEP),
                "flops_per_step": amount(raw.get("flops_per_step"), MAX_FLOPS_PER_STEP),
                "dtype": word(raw.get("dtype"), 16), "device": word(raw.get("device"), 128)}
    return None


def check_event(msg: dict[str, Any]) -> dict[str, Any]:
    """An event; kind ``step_source`` carries how the rank's steps are found (``source``: the
    checked payload, or None when it is not one); kinds ``span``, ``progress`` and ``work`` carry
    rank facts (``fact``: the checked payload of :func:`rank_fact`, or None)."""
    from ..rankfacts import FACT_KINDS

    _int(msg, "rank")
    _str(msg, "kind", 64)
    if msg["kind"] == "step_source":
        msg["source"] = step_source(msg["text"]) if isinstance(msg.get("text"), str) else None
    elif msg["kind"] in FACT_KINDS:
        msg["fact"] = rank_fact(msg["kind"], msg["text"]) if isinstance(msg.get("text"), str) else None
    _str(msg, "text", 2000)
    ts = msg.get("ts")
    msg["ts"] = measured(msg, ts, limits.EPOCH_S, "ts") if type(ts) in _NUM else None
    return msg


#: worker rows a node may report (more are dropped: torchrun reports failures of one node)
MAX_WORKER_ROWS = 1024
#: characters kept of a failed worker's error line and of its traceback (the innermost part)
MAX_WORKER_MESSAGE = 500
MAX_WORKER_TRACEBACK = 2000
#: characters kept of the end of a failed worker's stderr (launcher/stderrtee.py sends as many)
MAX_WORKER_STDERR = 2000


def worker_report(msg: dict[str, Any]) -> dict[str, Any]:
    """The worker report of a node ``bye`` or a ``finish``: ``{"workers": [...], "oom": {...} or
    None}``; missing fields are empty. Raises ProtocolError for wrong types."""
    rows = msg.get("workers") or []
    if type(rows) is not list:
        raise ProtocolError("workers must be a list")
    workers = []
    for w in rows[:MAX_WORKER_ROWS]:
        if type(w) is not dict:
            raise ProtocolError("a workers entry must be a map")
        rank, code = w.get("rank"), w.get("exitcode")
        if type(rank) is not int or type(code) is not int or rank < 0:
            raise ProtocolError("workers: rank and exitcode must be integers")
        sig = w.get("signal")
        ts = w.get("ts")
        ts = measured(msg, ts, limits.EPOCH_S, "workers ts") if type(ts) in _NUM else None
        message, tb, err = w.get("message"), w.get("traceback"), w.get("stderr")
        workers.append({"rank": rank, "local_rank": w.get("local_rank") if type(w.get("local_rank")) is int else None,
                        "pid": w.get("pid") if type(w.get("pid")) is int else None, "exitcode": code,
                        "signal": sig[:32] if isinstance(sig, str) else None,
                        "ts": None if ts is None else float(ts),
                        # Python's error of the worker, from torchrun's record (launcher/agent.py)
                        "message": message[:MAX_WORKER_MESSAGE] if isinstance(message, str) else None,
                        "traceback": tb[-MAX_WORKER_TRACEBACK:] if isinstance(tb, str) else None,
                        # the end of its stderr (what a native library or the script said last)
                        "stderr": err[-MAX_WORKER_STDERR:] if isinstance(err, str) else None})
    oom = msg.get("oom")
    if oom is not None:
        if type(oom) is not dict or type(oom.get("kills")) is not int or oom["kills"] < 0:
            raise ProtocolError("oom must be a map with an integer kills")
        limit = oom.get("limit_bytes")
        src = oom.get("source")
        oom = {"kills": oom["kills"], "limit_bytes": limit if type(limit) is int else None,
               "source": src[:200] if isinstance(src, str) else None}
    tr = msg.get("torchrun")
    if tr is not None:  # how the node's torchrun ended (launcher/run.py: torchrun_record)
        if type(tr) is not dict:
            raise ProtocolError("torchrun must be a map")
        sig, code = tr.get("signal"), tr.get("exitcode")
        tr = {"exitcode": code if type(code) is int else None,
              "signal": sig[:32] if isinstance(sig, str) else None,
              **{k: measured(msg, tr.get(k), limits.EPOCH_S, f"torchrun {k}") if type(tr.get(k)) in _NUM else None
                 for k in ("at", "stopped_at")}}
    return {"workers": workers, "oom": oom, **({"torchrun": tr} if tr is not None else {})}


def launch_lifecycle(msg: dict[str, Any]) -> None:
    """The launcher's ``lifecycle`` record in a ``finish`` or a node ``bye`` (optional;
    launcher/lifecycle.py), normalised in place: ``{"phases": [[phase, at], ...], "first_step",
    "allocation_start", "restarts", "signals": [[name, at], ...], "scheduled_end"}``, each phase
    of :data:`LAUNCH_PHASES` and each signal of :data:`LAUNCHER_SIGNALS` at most once; a time
    outside :data:`limits.EPOCH_S` or a count outside :data:`limits.RESTARTS` is not measured
    (None, counted). Anything else is dropped (None): the record never costs its frame."""
    raw = msg.get("lifecycle")
    if type(raw) is not dict or type(raw.get("phases")) is not list:
        msg["lifecycle"] = None
        return

    def when(v: Any) -> Optional[float]:
        return measured(msg, v, limits.EPOCH_S, "lifecycle time") if type(v) in _NUM else None

    phases: list[list[Any]] = []
    for entry in raw["phases"][:len(LAUNCH_PHASES)]:
        if type(entry) is list and len(entry) == 2 and entry[0] in LAUNCH_PHASES \
                and all(p[0] != entry[0] for p in phases) and when(entry[1]) is not None:
            phases.append([entry[0], float(entry[1])])
    signals: list[list[Any]] = []
    for entry in (raw.get("signals") if type(raw.get("signals")) is list else [])[:len(LAUNCHER_SIGNALS)]:
        if type(entry) is list and len(entry) == 2 and entry[0] in LAUNCHER_SIGNALS \
                and all(s[0] != entry[0] for s in signals) and when(entry[1]) is not None:
            signals.append([entry[0], float(entry[1])])
    restarts = raw.get("restarts")
    msg["lifecycle"] = {
        "signals": signals, "scheduled_end": when(raw.get("scheduled_end")),
        "phases": phases, "first_step": when(raw.get("first_step")),
        "allocation_start": when(raw.get("allocation_start")),
        "restarts": measured(msg, restarts, limits.RESTARTS, "restarts") if type(restarts) is int else None}


def check_bye(msg: dict[str, Any]) -> dict[str, Any]:
    """A rank's ``bye`` (it has ``rank``), or a node launcher's (no ``rank``: with its worker
    report, checked and normalised in place)."""
    if "rank" not in msg:
        if not isinstance(msg.get("status"), str):
            msg["status"] = None
        code = msg.get("exit_code")
        if code is not None and type(code) is not int:
            raise ProtocolError("bye: exit_code must be an integer")
        msg.update(worker_report(msg))
        launch_lifecycle(msg)
        return msg
    _int(msg, "rank")
    if msg.get("status") not in BYE_STATUSES:
        raise ProtocolError(f"bye: unknown status {str(msg.get('status'))[:20]!r}")
    _int(msg, "steps", optional=True)
    _int(msg, "dropped", optional=True)
    err = msg.get("error")
    msg["error"] = err[:MAX_TEXT] if isinstance(err, str) else None
    fail_step = msg.get("fail_step")
    msg["fail_step"] = fail_step if type(fail_step) is int and 0 <= fail_step <= MAX_VALUE else None
    msg["fail_in_step"] = msg.get("fail_in_step") is True
    return msg


def check_join(msg: dict[str, Any]) -> dict[str, Any]:
    _int(msg, "rank")
    for key, typ in (("local_rank", int), ("pid", int), ("host", str)):
        if type(msg.get(key)) is not typ:
            msg[key] = None
    msg["host"] = host_name(msg.get("host")) or None
    msg["new"] = bool(msg.get("new", True))
    _int(msg, "seq_end", optional=True)
    return msg


def check_loss(msg: dict[str, Any]) -> dict[str, Any]:
    """``gone`` and ``dropped``."""
    _int(msg, "rank")
    _int(msg, "relay_dropped")
    _int(msg, "seq_end")
    _int(msg, "open", optional=True)
    return msg


def check_node(msg: dict[str, Any]) -> dict[str, Any]:
    """A group relay's ``node`` frame: a node relay of its group connected (``host``, ``nproc``)
    or, with ``gone`` true, its link closed."""
    _int(msg, "node")
    msg["gone"] = msg.get("gone") is True
    if msg["gone"]:
        return msg
    _str(msg, "host", 255, optional=True)
    msg["host"] = host_name(msg.get("host"))
    if type(msg.get("nproc")) is not int:
        msg["nproc"] = None
    return msg


def check_system(msg: dict[str, Any]) -> dict[str, Any]:
    """A node's samples (wire/protocol.SYSTEM_FIELDS), each value held to its field's bound:
    a number past it (NaN and infinity included) becomes None, "not measured", and is counted; a
    sample whose time stamp is not a time is left out (counted once). Anything that is not a
    number where a number belongs makes the frame malformed. After this the aggregator
    (aggregator/system.py) adds the samples up without another check."""
    _int(msg, "node")
    _str(msg, "host", 255, optional=True)
    msg["host"] = host_name(msg.get("host")) or None
    samples = msg.get("samples")
    if type(samples) is not list or len(samples) > MAX_SAMPLES_PER_FRAME:
        raise ProtocolError("system: samples must be a list")
    out = []
    for s in samples:
        if type(s) is not dict:
            raise ProtocolError("system: a sample is not a map")
        if type(s.get("ts")) not in _NUM:
            raise ProtocolError("system: sample without a numeric ts")
        ts = measured(msg, s["ts"], limits.EPOCH_S, "ts")
        if ts is None:  # not a time: the sample cannot be placed (its other values are not read)
            continue
        gpus = s.get("gpus") or []
        if type(gpus) is not list or len(gpus) > MAX_GPUS:
            raise ProtocolError("system: gpus must be a list")
        checked = {k: measured(msg, s.get(k), lim, k) for k, lim in SAMPLE_LIMITS.items()}
        checked["gpus"] = []
        for g in gpus:
            if type(g) is not dict or type(g.get("index")) is not int or not 0 <= g["index"] < 4096:
                raise ProtocolError("system: a GPU sample needs an integer index")
            checked["gpus"].append({"index": g["index"], **{k: measured(msg, g.get(k), lim, f"gpu {k}")
                                                            for k, lim in GPU_LIMITS.items()}})
        checked["ts"] = float(ts)
        out.append(checked)
    msg["samples"] = out
    return msg


def check_finish(msg: dict[str, Any]) -> dict[str, Any]:
    _int(msg, "exit_code", lo=-(1 << 31), optional=True)
    failed = msg.get("failed_nodes") or []
    if type(failed) is not list or not all(type(n) is int for n in failed):
        raise ProtocolError("finish: failed_nodes must be a list of node ranks")
    msg["failed_nodes"] = failed[:100000]
    msg["interrupted"] = bool(msg.get("interrupted"))
    msg["reason"] = str(msg.get("reason") or "")[:500]
    msg.update(worker_report(msg))
    launch_lifecycle(msg)
    return msg


#: bounds of a link probe result (``probe`` on the control connection): nodes and transfers
MAX_PROBE_NODES = 4096


def check_probe(msg: dict[str, Any]) -> dict[str, Any]:
    """``probe {"result"}``: node 0's launcher hands over the link probe's section
    (traceml_core.linkprobe.analysis.analyse). Its shape is checked, its numbers bounded."""
    res = msg.get("result")
    if type(res) is not dict:
        raise ProtocolError("probe: result must be a map")
    nodes, pairs = res.get("nodes") or [], res.get("pairs") or []
    if type(nodes) is not list or type(pairs) is not list or len(nodes) > MAX_PROBE_NODES \
            or len(pairs) > 4 * MAX_PROBE_NODES:
        raise ProtocolError("probe: nodes and pairs must be lists of at most a few per node")

    def num(v: Any) -> Any:
        return v if type(v) in (int, float) and 0 <= v < 1e15 else None

    def text(v: Any, n: int = 300) -> Any:
        return v[:n] if isinstance(v, str) else None

    def node_ref(v: Any) -> Any:
        return v if type(v) is int and 0 <= v < MAX_PROBE_NODES else None

    out: dict[str, Any] = {
        "bytes_per_pair": num(res.get("bytes_per_pair")) or 0, "seconds": num(res.get("seconds")) or 0.0,
        "error": text(res.get("error")),
        "nodes": [{"node": node_ref(n.get("node")), "host": text(n.get("host"), 255),
                   "gbps": num(n.get("gbps")), "recv_gbps": num(n.get("recv_gbps"))}
                  for n in nodes if type(n) is dict],
        "pairs": [{"src": node_ref(p.get("src")), "dst": node_ref(p.get("dst")),
                   "src_host": text(p.get("src_host"), 255), "dst_host": text(p.get("dst_host"), 255),
                   "nbytes": num(p.get("nbytes")) or 0, "seconds": num(p.get("seconds")) or 0.0,
                   "gbps": num(p.get("gbps")), "error": text(p.get("error"))}
                  for p in pairs if type(p) is dict],
        "slow_node": None, "slow_link": None,
    }
    slow, link = res.get("slow_node"), res.get("slow_link")
    if type(slow) is dict:
        out["slow_node"] = {"node": node_ref(slow.get("node")), "host": text(slow.get("host"), 255),
                            "gbps": num(slow.get("gbps")), "others_gbps": num(slow.get("others_gbps")),
                            "direction": "receive" if slow.get("direction") == "receive" else "send",
                            "ratio": num(slow.get("ratio"))}
    if type(link) is dict:
        out["slow_link"] = {"src": node_ref(link.get("src")), "dst": node_ref(link.get("dst")),
                            "src_host": text(link.get("src_host"), 255),
                            "dst_host": text(link.get("dst_host"), 255),
                            "gbps": num(link.get("gbps")), "others_gbps": num(link.get("others_gbps"))}
    msg["result"] = out
    return msg


def check_autopsy(msg: dict[str, Any]) -> dict[str, Any]:
    """Node 0's launcher asks its aggregator for a hang report."""
    for key in ("silent_s", "threshold_s"):
        v = msg.get(key)
        if type(v) not in (int, float) or not 0 <= v <= MAX_VALUE:
            raise ProtocolError(f"autopsy: {key} must be a number of seconds")
        msg[key] = float(v)
    msg["threshold_source"] = str(msg.get("threshold_source") or "")[:200]
    return msg


def check_plain(msg: dict[str, Any]) -> dict[str, Any]:
    """Frames whose fields are read with defaults (``query``, ``snapshot``, ``welcome``...)."""
    return msg


# --- requests ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    kind: str
    #: checks ``req["args"]`` (a map) at the rank
    args: Callable[[dict[str, Any]], None]
    #: checks ``resp["data"]`` where it enters (the relay)
    data: Callable[[Any], None]
    doc: str


def _no_args(args: dict[str, Any]) -> None:
    return None


def _counts_data(data: Any) -> None:
    if type(data) is not dict or not all(type(data.get(k)) is int and data[k] >= 0
                                         for k in ("produced", "sent", "lost")):
        raise ProtocolError("resp counts: produced, sent and lost must be non-negative integers")


#: the most of one rank's stack dump that travels (a process with hundreds of threads is cut)
MAX_STACK_TEXT = 64 * 1024


#: the fields of a relay's ``stacks`` answer that are counters (non-negative integers or null)
_PROC_COUNTERS = ("pid", "main_cpu_ns", "proc_cpu_ns", "children_cpu_ns", "io_bytes", "at_ns")


def _stacks_data(data: Any) -> None:
    """A ``stacks`` answer: what the rank's own interpreter says about where it is (``source``
    sdk: every thread's stack as text, the collective in flight, its step), or what its node's
    relay read of its process from the kernel (``source`` relay: launcher/procstate.py)."""
    if type(data) is not dict:
        raise ProtocolError("resp stacks: data must be a map")
    src = data.get("source")
    if src == "relay":
        if type(data.get("gone")) is not bool:
            raise ProtocolError("resp stacks: gone must be a bool")
        for key in ("state", "wchan"):
            v = data.get(key)
            if v is not None and (not isinstance(v, str) or len(v) > 64):
                raise ProtocolError(f"resp stacks: {key} must be a short string or null")
        for key in _PROC_COUNTERS:
            v = data.get(key)
            if v is not None and (type(v) is not int or not 0 <= v <= MAX_VALUE):
                raise ProtocolError(f"resp stacks: {key} must be a non-negative integer or null")
        return
    if src != "sdk":
        raise ProtocolError("resp stacks: source must be sdk or relay")
    text = data.get("text")
    if text is not None and (not isinstance(text, str) or len(text) > MAX_STACK_TEXT):
        raise ProtocolError(f"resp stacks: text must be a string of at most {MAX_STACK_TEXT} characters")
    for key in ("step", "launched"):
        v = data.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_VALUE):
            raise ProtocolError(f"resp stacks: {key} must be a non-negative integer or null")
    if data.get("in_step") is not None and type(data["in_step"]) is not bool:
        raise ProtocolError("resp stacks: in_step must be a bool or null")
    c = data.get("in_flight")
    if c is not None:
        if type(c) is not dict or not isinstance(c.get("op"), str) or len(c["op"]) > 64 or not all(
                type(c.get(k)) is int and 0 <= c[k] <= MAX_VALUE
                for k in ("bytes", "seq", "started_ns", "group_size")):
            raise ProtocolError("resp stacks: in_flight must be {op, bytes, seq, started_ns, group_size}")


REQUESTS: dict[str, Request] = {
    "counts": Request("counts", _no_args, _counts_data,
                      "records the rank produced, handed to the network, and knows it lost"),
    "stacks": Request("stacks", _no_args, _stacks_data,
                      "the hang autopsy: where the rank is (every thread's stack, its collective in "
                      "flight, its step); its relay adds the kernel's view of the process"),
}


def check_req(msg: dict[str, Any]) -> dict[str, Any]:
    _int(msg, "id")
    req = REQUESTS.get(msg.get("kind"))  # type: ignore[arg-type]
    if req is None:
        raise ProtocolError(f"req: unknown kind {str(msg.get('kind'))[:20]!r}")
    ranks = msg.get("ranks")
    if ranks is not None and (type(ranks) is not list or len(ranks) > MAX_RANKS_IN_REQ
                              or not all(type(r) is int for r in ranks)):
        raise ProtocolError("req: ranks must be a list of ranks, or None")
    args = msg.get("args") or {}
    if type(args) is not dict:
        raise ProtocolError("req: args must be a map")
    req.args(args)
    msg["args"] = args
    return msg


def check_resp(msg: dict[str, Any]) -> dict[str, Any]:
    _int(msg, "id")
    _int(msg, "rank")
    req = REQUESTS.get(msg.get("kind"))  # type: ignore[arg-type]
    if req is None:
        raise ProtocolError(f"resp: unknown kind {str(msg.get('kind'))[:20]!r}")
    req.data(msg.get("data"))
    return msg


VALIDATORS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "steps": check_steps, "fold": check_fold, "tail": check_tail, "event": check_event, "bye": check_bye, "resp": check_resp,
    "join": check_join, "gone": check_loss, "dropped": check_loss, "system": check_system,
    "finish": check_finish, "query": check_plain, "snapshot": check_plain, "req": check_req,
    "probe": check_probe,
    "autopsy": check_autopsy,
    "node": check_node,
    "end": check_plain,
}

#: frame types each kind of connection may send (anything else is skipped and counted)
ACCEPTS: dict[str, frozenset[str]] = {
    "rank": frozenset(("steps", "event", "bye", "resp")),
    "node": frozenset(("fold", "tail", "event", "bye", "resp", "join", "gone", "dropped", "system")),
    #: a group relay (launcher/grouprelay.py): its nodes' frames, and which nodes it carries
    "group": frozenset(("fold", "tail", "event", "bye", "resp", "join", "gone", "dropped", "system",
                        "node")),
    "control": frozenset(("finish", "query", "snapshot", "system", "probe", "autopsy")),
    #: what a client accepts from its server after ``welcome``
    "down": frozenset(("req", "end")),
}


def validate(kind: str, msg: dict[str, Any]) -> Optional[dict[str, Any]]:
    """``msg`` checked for a connection of ``kind``; None for a type that kind does not send
    (skipped and counted by the caller). Raises :class:`ProtocolError` for a malformed frame."""
    t = msg.get("t")
    if t not in ACCEPTS[kind]:
        return None
    msg.pop(REFUSED, None)  # counted by the validator, never by the peer
    return VALIDATORS[t](msg)  # type: ignore[index]


def bind_rank(msg: dict[str, Any], rank: int) -> None:
    """A rank's frame must be about the rank whose authenticated connection carried it."""
    r = msg.get("rank", rank)
    if r != rank:
        raise ProtocolError(f"{msg.get('t')} for rank {r!r} on rank {rank}'s connection")
    msg["rank"] = rank
