"""``traceml compare A B``: did B get faster or slower than A, by how much, and how sure are we?

A and B are run directories (``<logs-dir>/<run-name>``) or ``final_summary.json`` files. For the
whole step and for each phase the median per-step time of B is set against A's, with a 95 %
interval from the runs' own per-step distributions (the ``compare`` section of the summary: one
histogram per phase over every step of every rank), widened by the spread of the run's series
over time (``compare.step_series`` for the step, ``timeline`` for the phases; see
:mod:`.uncertainty`).

One rule decides every row, the step's and each phase's (:func:`decide`): the interval holds
zero -> ``within_noise``; it does not, but the change is under the floor -> ``negligible`` (real,
too small to matter); else ``faster`` / ``slower``. The floor is one number in milliseconds for
all rows: ``thresholds.COMPARE_MIN_CHANGE_PCT`` of A's median step (raised to a run's own drift
between its halves), at least ``COMPARE_MIN_CHANGE_MS``: a phase change smaller than that cannot
move the step beyond noise, however large it is relative to the phase. Step times are all it
needs, so CPU-only runs get a verdict like GPU runs.

Verdict (the step's row): ``faster``, ``slower``, ``negligible``, ``within_noise``, or
``not_comparable`` with the reasons (different world size, different script, GPUs on one side
only, the step not measured, too few steps). Differences in topology and configuration are listed
either way, and what the runs ran on beside them (the summary's ``context``: CPU wait per step,
load from other processes, hosts, threads, torch, GPUs): when the training thread's wait for a
core, beyond what its work accounts for, makes at least half the step's change, in its
direction, the verdict says the change is explained by that, not by the code
(:func:`explained_by_context`). Exit status: 0, or 1 with ``--fail-on-regression PCT`` when B is significantly slower
by at least PCT percent, or 2 for unusable input (the message names the path).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..statistics.sketch import ENCODING, bucket_value
from ..errors import TraceMLError
from .document import Summary, Timeline, read
from .goodput.compare import compare_ledgers, render_compare
from .summary_file import read_summary
from .thresholds import (COMPARE_LEVEL, COMPARE_MIN_CHANGE_MS, COMPARE_MIN_CHANGE_PCT,
                         COMPARE_MIN_STEPS)
from .uncertainty import (block_relative_halfwidth, difference_interval, drift, ratio_interval, widen_ratio,
                          quantile_bootstrap)

SUMMARY_NAME = "final_summary.json"
#: summary schema versions this module reads
READS_SCHEMA = (1,)
COMPARE_SCHEMA = 1
NS_PER_MS = 1e6


class CompareError(TraceMLError):
    """Unusable input (missing file, not a summary, unknown schema, bad threshold)."""

    exit_code = 2


# --- loading ------------------------------------------------------------------------------------
@dataclass
class Run:
    label: str  # "A" or "B"
    path: Path  # the summary file
    #: the summary's JSON (the comparison page embeds it as it is)
    summary: dict[str, Any]
    #: the same, typed: what the comparison reads
    doc: Summary = field(init=False)

    def __post_init__(self) -> None:
        self.doc = read(self.summary)

    @property
    def name(self) -> str:
        return str(self.doc.run.name or self.path.parent.name)


def load_run(arg: str, label: str) -> Run:
    """Read a run directory or summary file; :class:`CompareError` (one paragraph) when unusable."""
    p = Path(arg)
    if p.is_dir():
        f = p / SUMMARY_NAME
        if not f.is_file():
            hint = (f" It holds the aggregator's checkpoint, so `traceml summarize {p}` can "
                    "rebuild the summary first." if (p / "aggregate.state").is_file() else
                    " Pass the run directory <logs-dir>/<run-name> of a finished `traceml run`, or "
                    "the summary file itself.")
            raise CompareError(f"Run {label} ({arg}): the directory has no {SUMMARY_NAME}.{hint}")
        p = f
    elif not p.exists():
        raise CompareError(f"Run {label} ({arg}): no such file or directory. Pass a run directory "
                           f"(<logs-dir>/<run-name>) or its {SUMMARY_NAME}.")
    doc = read_summary(p, f"Run {label} ({p})", CompareError)
    v = doc.get("schema_version")
    if v not in READS_SCHEMA:
        raise CompareError(f"Run {label} ({p}): summary schema_version {v!r} is not one this "
                           f"traceml reads ({', '.join(map(str, READS_SCHEMA))}); it was written "
                           "by another traceml version. Compare with the traceml that wrote it, "
                           "or rebuild it with `traceml summarize RUN_DIR`.")
    comp = doc.get("compare")
    ok = (isinstance(comp, dict) and isinstance(comp.get("sketches"), dict)
          and isinstance(comp.get("step_series"), dict) and isinstance(doc.get("topology"), dict))
    if ok:
        try:
            for sk in comp["sketches"].values():
                int(sk["lo"]), int(sk["zero"]), [int(c) for c in sk["counts"]]
        except (TypeError, ValueError, KeyError):
            ok = False
    if not ok:
        raise CompareError(f"Run {label} ({p}): the summary lacks the per-step distributions "
                           "`compare` needs (its compare/topology sections are missing or "
                           "malformed). Rebuild it with `traceml summarize RUN_DIR`.")
    return Run(label, p, doc)


# --- statistics ---------------------------------------------------------------------------------
def histogram(sketch: Optional[dict[str, Any]]) -> tuple[list[float], list[int]]:
    """(values in ms ascending, counts) of a serialised merged sketch (zeros first)."""
    if not sketch:
        return [], []
    values: list[float] = []
    counts: list[int] = []
    if int(sketch.get("zero", 0)) > 0:
        values.append(0.0)
        counts.append(int(sketch["zero"]))
    lo = int(sketch["lo"])
    for i, c in enumerate(sketch["counts"]):
        if c:
            values.append(bucket_value(lo + i) / NS_PER_MS)
            counts.append(int(c))
    return values, counts


def _quantile(values: list[float], counts: list[int], q: float) -> Optional[float]:
    n = sum(counts)
    if n <= 0:
        return None
    k = int(q * (n - 1))
    cum = 0
    for v, c in zip(values, counts):
        cum += c
        if cum > k:
            return v
    return values[-1]


def _blocks(doc: Summary, phase: str = "step") -> list[float]:
    """Bucket means of a phase over the run, without the buckets that hold warm-up steps: the
    step from ``compare.step_series`` (all ranks), another phase from ``timeline`` (the mean over
    the ranks it lists); ``[]`` when the summary has no such series."""
    if phase == "step":
        series = doc.compare.step_series
        means = list(series.mean_ms)
        width = max(1, int(series.steps_per_bucket or 1))
    else:
        tl = doc.timeline or Timeline()
        cols = [r.phases_ms[phase] for r in tl.ranks if r.phases_ms.get(phase)]
        means = []
        for vals in zip(*cols):
            got = [v for v in vals if v is not None]
            means.append(sum(got) / len(got) if got else None)
        width = max(1, int(tl.steps_per_bucket or 1))
    skip = -(-int(doc.warmup_steps or 0) // width)
    return [m for m in means[skip:] if m is not None]


@dataclass
class PhaseChange:
    phase: str
    statistic: str  # "median" or "p90"
    a_ms: Optional[float]
    b_ms: Optional[float]
    steps_a: int
    steps_b: int
    diff_ms: Optional[float] = None
    change_pct: Optional[float] = None
    interval_ms: Optional[tuple[float, float]] = None
    interval_pct: Optional[tuple[float, float]] = None
    #: the size a change needs to count, in % of A's median step and in ms
    floor_pct: Optional[float] = None
    floor_ms: Optional[float] = None
    #: faster | slower | negligible | within_noise | not_measured | only_in_a | only_in_b
    verdict: str = "within_noise"


def compare_phase(phase: str, a: Run, b: Run, *, q: float = 0.5, floor_pct: float,
                  floor_ms: Optional[float] = None,
                  block_hw: tuple[Optional[float], Optional[float]] = (None, None)) -> PhaseChange:
    """One row: B's ``q``-quantile of ``phase`` against A's, its interval and verdict.

    THE rule, the same for the step and every phase (see :func:`decide`): the change is
    *significant* when its 95 % interval excludes zero, and *large enough* when it is at least
    ``floor_ms`` (``floor_pct`` of A's median step; of this row's A value when not given, which
    is the same for the step's own row); the interval is the wider of the per-step
    bootstrap and the block bootstrap over the run's series (``block_hw``, relative half-widths
    of A and B, when the summaries hold a series of this phase)."""
    va, ca = histogram(a.doc.compare.sketches.get(phase))
    vb, cb = histogram(b.doc.compare.sketches.get(phase))
    stat = "median" if q == 0.5 else f"p{round(q * 100)}"
    pc = PhaseChange(phase, stat, _quantile(va, ca, q), _quantile(vb, cb, q), sum(ca), sum(cb))
    if pc.a_ms is None or pc.b_ms is None:
        pc.verdict = ("not_measured" if pc.a_ms is None and pc.b_ms is None
                      else "only_in_a" if pc.b_ms is None else "only_in_b")
        return pc
    if floor_ms is None:
        floor_ms = max(COMPARE_MIN_CHANGE_MS, floor_pct / 100.0 * pc.a_ms)
    d = pc.b_ms - pc.a_ms
    dist_a, dist_b = quantile_bootstrap(va, ca, q), quantile_bootstrap(vb, cb, q)
    ha, hb = block_hw
    ratio = ratio_interval(dist_a, dist_b, COMPARE_LEVEL) if pc.a_ms > 0 else None
    if ratio is not None:
        # on the ratio B/A (a time cannot fall below zero, so the interval never reaches -100 %),
        # widened by the series' spread over time where that is wider; in ms of A's median
        r = pc.b_ms / pc.a_ms
        rlo, rhi = ratio
        if ha is not None and hb is not None:
            rlo, rhi = widen_ratio(rlo, rhi, r, (ha, hb))
        lo, hi = (rlo - 1.0) * pc.a_ms, (rhi - 1.0) * pc.a_ms
    else:
        lo, hi = difference_interval(dist_a, dist_b, COMPARE_LEVEL)
        if ha is not None and hb is not None:  # the series' spread, when wider, decides
            half = math.hypot(ha * pc.a_ms, hb * pc.b_ms)
            lo, hi = min(lo, d - half), max(hi, d + half)
    pc.diff_ms = round(d, 4)
    pc.interval_ms = (round(lo, 4), round(hi, 4))
    pc.floor_pct = round(floor_pct, 2)
    pc.floor_ms = round(floor_ms, 4)
    if pc.a_ms > 0:
        pc.change_pct = round(100.0 * d / pc.a_ms, 2)
        pc.interval_pct = (round(100.0 * lo / pc.a_ms, 2), round(100.0 * hi / pc.a_ms, 2))
    pc.verdict = decide(d, lo, hi, floor_ms)
    return pc


def decide(diff_ms: float, lo_ms: float, hi_ms: float, floor_ms: float) -> str:
    """``within_noise`` (the interval holds zero), ``negligible`` (it does not, but the change
    is under the floor: real and too small to move the step beyond noise), else ``faster`` /
    ``slower``."""
    if lo_ms <= 0.0 <= hi_ms:
        return "within_noise"
    if abs(diff_ms) < floor_ms:
        return "negligible"
    return "slower" if diff_ms > 0 else "faster"


@dataclass
class Difference:
    what: str
    a: Any
    b: Any
    #: "not_comparable" (the verdict cannot stand), "may_explain" (could cause a change), "info"
    effect: str = "info"


#: a context difference explains a step change when it accounts for at least this share of it
EXPLAINS_SHARE = 0.5
#: other processes' load that differs by at least this many points of the node's cores is named
OTHER_LOAD_POINTS = 10.0


@dataclass
class ContextRow:
    """One line of what the runs ran on (``context``, report/runcontext.py), A beside B."""

    what: str
    a: Any
    b: Any
    #: "explains" (it accounts for the step's change), "may_explain" (it differs and could cause
    #: a change), "same", or "not_measured"
    effect: str = "same"


def _ms_or_none(v: Optional[float]) -> str:
    return "not measured" if v is None else f"{v:.3f} ms"


def node_wait_change(ca: Any, cb: Any) -> Optional[float]:
    """How much longer (ms per step) B's training thread waited for a core than its work accounts
    for at A's share of waiting: ``wb - rb * fa / (1 - fa)``, ``fa = wa / (wa + ra)``. On a node
    busy all along, a step that does half the work also waits half as long (the same share), so
    the wait's own difference would credit the node for a code change; this is the whole wait
    difference when the work is the same, and nothing when only the work changed. None: not
    measured."""
    vals = (ca.cpu_wait_ms, cb.cpu_wait_ms, ca.cpu_run_ms, cb.cpu_run_ms)
    if any(v is None for v in vals):
        return None
    wa, wb, ra, rb = (float(v) for v in vals)
    if wa + ra <= 0:
        return None
    fa = min(0.99, wa / (wa + ra))
    return wb - rb * fa / (1.0 - fa)


def context_rows(a: Run, b: Run, floor_ms: float) -> list[ContextRow]:
    """What the two runs ran on, side by side; a row differs when it could move the step."""
    ca, cb = a.doc.context, b.doc.context
    if ca is None or cb is None:
        return []
    rows: list[ContextRow] = []
    wa, wb = ca.cpu_wait_ms, cb.cpu_wait_ms
    by_node = node_wait_change(ca, cb)
    rows.append(ContextRow("CPU wait per step (training thread runnable, no core free)", _ms_or_none(wa),
                           _ms_or_none(wb), "not_measured" if by_node is None
                           else "may_explain" if abs(by_node) >= floor_ms else "same"))
    oa, ob = ca.other_load_pct, cb.other_load_pct
    ra, rb = ca.cpu_run_ms, cb.cpu_run_ms
    rows.append(ContextRow("CPU time per step (training thread on a core: the work)", _ms_or_none(ra),
                           _ms_or_none(rb), "not_measured" if ra is None or rb is None else "same"))
    rows.append(ContextRow("load from other processes (% of the node's cores, busiest node)",
                           "not measured" if oa is None else f"{oa:.0f}%", "not measured" if ob is None else f"{ob:.0f}%",
                           "not_measured" if oa is None or ob is None
                           else "may_explain" if abs(ob - oa) >= OTHER_LOAD_POINTS else "same"))
    for what, va, vb in (("hosts", ", ".join(ca.hosts), ", ".join(cb.hosts)),
                         ("torch threads per rank", ca.threads, cb.threads),
                         ("OMP_NUM_THREADS", ", ".join(ca.omp), ", ".join(cb.omp)),
                         ("torch version", ", ".join(ca.torch), ", ".join(cb.torch)),
                         ("GPUs", ca.gpus, cb.gpus)):
        unknown = va in (None, "") or vb in (None, "")
        rows.append(ContextRow(what, va if va not in (None, "") else "not measured",
                               vb if vb not in (None, "") else "not measured",
                               "not_measured" if unknown else "same" if va == vb else "may_explain"))
    return rows


def explained_by_context(step: Optional[PhaseChange], a: Run, b: Run,
                         rows: list[ContextRow]) -> Optional[str]:
    """When the step's change comes from what the runs ran on rather than the code: the waiting
    for a core that the work does not account for (:func:`node_wait_change`) makes at least half
    the step's change, in its direction. Marks the CPU wait row ``explains``."""
    ca, cb = a.doc.context, b.doc.context
    if step is None or step.verdict not in ("faster", "slower", "negligible") or step.diff_ms is None \
            or ca is None or cb is None:
        return None
    by_node = node_wait_change(ca, cb)
    if by_node is None:
        return None
    wa, wb, ra, rb = ca.cpu_wait_ms, cb.cpu_wait_ms, ca.cpu_run_ms, cb.cpu_run_ms
    d = step.diff_ms
    if d == 0 or by_node * d <= 0 or abs(by_node) < EXPLAINS_SHARE * abs(d):
        return None
    for r in rows:
        if r.what.startswith("CPU wait"):
            r.effect = "explains"
    busy = "A" if by_node < 0 else "B"
    return (f"explained by what the runs ran on, not by the code: the training thread waited for a "
            f"core {wa:.3f} ms per step in A and {wb:.3f} ms in B, on {ra:.3f} and {rb:.3f} ms of "
            f"work; the waiting that the work does not account for is {by_node:+.3f} ms of the "
            f"{d:+.3f} ms change: other processes kept {busy}'s node busy. Compare runs on equally "
            "quiet nodes (or the same node) before crediting the code")


@dataclass
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    verdict: dict[str, Any]
    phases: list[PhaseChange]
    extra: list[PhaseChange]
    differences: list[Difference]
    notes: list[str] = field(default_factory=list)
    gate: Optional[dict[str, Any]] = None
    #: the two runs' goodput ledgers side by side (report/goodput/compare.py); None: one has none
    goodput: Optional[dict[str, Any]] = None
    #: what the runs ran on, side by side (empty: a summary without its context section)
    context: list[ContextRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"compare_schema": COMPARE_SCHEMA, "a": self.a, "b": self.b, "verdict": self.verdict,
                "phases": [asdict(p) for p in self.phases], "extra": [asdict(p) for p in self.extra],
                "differences": [asdict(d) for d in self.differences], "notes": self.notes,
                "gate": self.gate, "rule": RULE, "goodput": self.goodput,
                "context": [asdict(r) for r in self.context]}


def _gpu_count(s: Summary) -> int:
    return sum(len(n.gpus) for n in s.system.nodes)


def _hosts(s: Summary) -> list[Optional[str]]:
    return [n.hostname for n in s.topology.nodes]


def differences(a: Run, b: Run) -> list[Difference]:
    sa, sb = a.doc, b.doc
    ta, tb = sa.topology, sb.topology
    ra, rb = sa.run, sb.run
    out: list[Difference] = []
    for key in ("world_size", "nnodes", "nproc_per_node"):
        if getattr(ta, key) != getattr(tb, key):
            out.append(Difference(key.replace("_", " "), getattr(ta, key), getattr(tb, key), "not_comparable"))
    sc_a, sc_b = ra.script, rb.script
    if sc_a and sc_b and sc_a != sc_b:
        same_file = os.path.basename(sc_a) == os.path.basename(sc_b)
        out.append(Difference("script", sc_a, sc_b, "may_explain" if same_file else "not_comparable"))
    args_a, args_b = ra.script_args, rb.script_args
    if args_a is not None and args_b is not None and list(args_a) != list(args_b):
        out.append(Difference("script arguments", " ".join(args_a), " ".join(args_b), "may_explain"))
    ga, gb = _gpu_count(sa), _gpu_count(sb)
    if ga != gb:
        out.append(Difference("GPUs sampled", ga, gb, "not_comparable" if 0 in (ga, gb) else "may_explain"))
    if _hosts(sa) != _hosts(sb):
        out.append(Difference("hosts", ", ".join(map(str, _hosts(sa))), ", ".join(map(str, _hosts(sb))),
                              "may_explain"))
    if ra.mode != rb.mode:
        out.append(Difference("mode", ra.mode, rb.mode))
    if ra.status != rb.status:
        out.append(Difference("run status", ra.status, rb.status))
    return out


def _side(run: Run) -> dict[str, Any]:
    s = run.doc
    return {"path": str(run.path), "name": run.name, "status": s.run.status,
            "started_at": s.run.started_at, "world_size": s.topology.world_size,
            "script": s.run.script, "steps": s.telemetry.records_received,
            "duration_s": s.run.duration_s,
            "provisional": s.provisional, "rebuilt": bool(s.rebuilt)}


def compare(a: Run, b: Run) -> Comparison:
    sa, sb = a.doc, b.doc
    diffs = differences(a, b)
    reasons = [f"different {d.what} ({d.a} vs {d.b})" for d in diffs if d.effect == "not_comparable"]
    notes: list[str] = []
    for run in (a, b):
        s = run.doc
        enc = {sk.get("encoding", ENCODING) for sk in s.compare.sketches.values()}
        if enc - {ENCODING}:
            reasons.append(f"{run.label}'s histograms use another encoding ({', '.join(sorted(enc))})")
        n = histogram(s.compare.sketches.get("step"))[1]
        if sum(n) == 0:
            reasons.append(f"{run.label} has no measured steps")
        elif sum(n) < COMPARE_MIN_STEPS:
            reasons.append(f"{run.label} has only {sum(n)} step records (at least "
                           f"{COMPARE_MIN_STEPS} are needed)")
        if s.provisional:
            notes.append(f"{run.label}'s summary is provisional (written at SIGTERM before the end).")
        if s.rebuilt and not s.rebuilt.get("final_checkpoint"):
            notes.append(f"{run.label}'s summary was rebuilt from a checkpoint; later steps are missing.")
        st = s.run.status
        if st not in (None, "completed"):
            notes.append(f"{run.label} ended {st}: it is compared over the steps it made.")
        lost = s.telemetry.records_lost
        if lost:
            notes.append(f"{run.label} lost {lost} step records of telemetry.")

    blocks_a, blocks_b = _blocks(sa), _blocks(sb)
    drifts = [d for d in (drift(blocks_a), drift(blocks_b)) if d is not None]
    floor = max([COMPARE_MIN_CHANGE_PCT] + [100.0 * d for d in drifts])
    if floor > COMPARE_MIN_CHANGE_PCT:
        notes.append(f"A run's speed drifted by {floor:.1f}% between its own halves; smaller changes "
                     "are treated as negligible.")
    names = [p for p in sa.phases if p in sa.compare.sketches]
    names += [p for p in sb.compare.sketches if p not in names]
    step_a = _quantile(*histogram(sa.compare.sketches.get("step")), 0.5)
    # one floor for every row: a change under floor% of the step cannot move the step beyond noise
    floor_ms = max(COMPARE_MIN_CHANGE_MS, floor / 100.0 * (step_a or 0.0))

    def hw(phase: str) -> tuple[Optional[float], Optional[float]]:
        return (block_relative_halfwidth(_blocks(sa, phase)), block_relative_halfwidth(_blocks(sb, phase)))

    phases = [compare_phase(p, a, b, floor_pct=floor, floor_ms=floor_ms, block_hw=hw(p)) for p in names]
    extra = [compare_phase("step", a, b, q=0.9, floor_pct=floor, floor_ms=floor_ms, block_hw=hw("step"))]
    for pc in phases:
        if pc.verdict in ("only_in_a", "only_in_b"):
            diffs.append(Difference(f"phase {pc.phase} measured", pc.a_ms is not None,
                                    pc.b_ms is not None, "may_explain"))

    step = next((p for p in phases if p.phase == "step"), None)
    if step is None or step.a_ms is None or step.b_ms is None:
        reasons.append("the step time is not measured in both runs")
    verdict = _verdict(step, phases, reasons)
    # what the runs ran on differs when it could move the step by the base floor (a run's own
    # drift, which raises the verdict's floor, comes from the very contention these rows name)
    ctx = context_rows(a, b, max(COMPARE_MIN_CHANGE_MS, COMPARE_MIN_CHANGE_PCT / 100.0 * (step_a or 0.0)))
    explained = None if reasons else explained_by_context(step, a, b, ctx)
    verdict["explained_by_context"] = explained
    if explained:
        verdict["why"] += "; " + explained
    elif verdict["kind"] in ("faster", "slower") and step is not None and step.diff_ms:
        # the node's waiting counts only in the step's direction (B waiting more cannot make it faster)
        by_node = node_wait_change(sa.context, sb.context) if sa.context and sb.context else None
        against = by_node is not None and by_node * step.diff_ms <= 0
        others = [r.what for r in ctx if r.effect == "may_explain" and not (against and r.what.startswith("CPU wait"))]
        if others:
            verdict["why"] += (f"; the runs also differ in what they ran on ({', '.join(others)}), which "
                               "may explain the change rather than the code")
    return Comparison(_side(a), _side(b), verdict, phases, extra, diffs, notes,
                      goodput=compare_ledgers(sa.goodput, sb.goodput), context=ctx)


def _verdict(step: Optional[PhaseChange], phases: list[PhaseChange], reasons: list[str]) -> dict[str, Any]:
    base: dict[str, Any] = {"kind": "not_comparable", "why": "", "change_pct": None,
                            "interval_pct": None, "a_ms": None, "b_ms": None, "reasons": reasons}
    if step is not None:
        base.update(change_pct=step.change_pct, interval_pct=step.interval_pct,
                    a_ms=step.a_ms, b_ms=step.b_ms)
    if reasons:
        base["why"] = "; ".join(reasons)
        return base
    assert step is not None
    lo, hi = step.interval_pct or (None, None)
    head = (f"median step {step.a_ms:.3f} ms -> {step.b_ms:.3f} ms ({_pct(step.change_pct)}, "
            f"{int(COMPARE_LEVEL * 100)}% interval {_pct(lo)} .. {_pct(hi)})")
    base["kind"] = step.verdict
    if step.verdict in ("faster", "slower"):
        movers = sorted((p for p in phases if p.phase != "step" and p.verdict == step.verdict),
                        key=lambda p: -abs(p.diff_ms or 0.0))
        if movers:
            head += "; " + ", ".join(f"{p.phase} {p.diff_ms:+.3f} ms" for p in movers[:3])
    elif step.verdict == "negligible":
        head += (f"; a real change, under the {step.floor_pct:.1f}% of the step "
                 f"({step.floor_ms:.3f} ms) that counts")
    else:
        head += "; the interval holds zero"
    base["why"] = head
    return base


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.1f}%"


# --- output -------------------------------------------------------------------------------------
_LABEL = {"faster": "faster", "slower": "SLOWER", "within_noise": "within noise", "negligible": "negligible",
          "not_measured": "not measured", "only_in_a": "only in A", "only_in_b": "only in B"}


#: the one rule behind every row's verdict, printed under the table
RULE = ("Rule, the same for the step and each phase: 95% interval from the exact bootstrap of each "
        "run's per-step histogram (all ranks), widened by the spread of the run's series over "
        "time; interval holds zero = within noise; else a change under the floor (% of A's median "
        "step) = negligible; else faster / SLOWER.")


def render(c: Comparison) -> str:
    v = c.verdict
    lines = [f"TraceML compare: A = {c.a['name']}, B = {c.b['name']}",
             _side_line("A", c.a), _side_line("B", c.b),
             "",
             f"Verdict: {v['kind'].upper().replace('_', ' ')}: {v['why']}", ""]
    lines.append(f"{'per step (ms)':<18}{'A':>10}{'B':>10}{'change':>10}   {'95% interval':<19} verdict")
    for p in c.phases + c.extra:
        name = p.phase if p.statistic == "median" else f"{p.phase} {p.statistic}"
        iv = (f"[{_pct(p.interval_pct[0])}, {_pct(p.interval_pct[1])}]" if p.interval_pct
              else "-")
        lines.append(f"  {name:<16}{_ms(p.a_ms):>10}{_ms(p.b_ms):>10}{_pct(p.change_pct):>10}   "
                     f"{iv:<19} {_LABEL.get(p.verdict, p.verdict)}")
    if c.differences:
        lines += ["", "Differences (A | B):"]
        for d in c.differences:
            tag = {"not_comparable": "  <- not comparable", "may_explain": "  <- may explain a change"}.get(d.effect, "")
            lines.append(f"  {d.what}: {d.a} | {d.b}{tag}")
    else:
        lines += ["", "Differences: none in topology, script, GPUs or hosts."]
    if c.context:
        lines += ["", "Ran on (A | B):"]
        for r in c.context:
            tag = {"explains": "  <- explains the change", "may_explain": "  <- may explain a change"}.get(r.effect, "")
            lines.append(f"  {r.what}: {r.a} | {r.b}{tag}")
    lines += [""] + render_compare(c.goodput)
    for n in c.notes:
        lines.append(f"Note: {n}")
    if c.gate is not None:
        g = c.gate
        lines.append("")
        lines.append(f"Regression gate ({g['threshold_pct']:g}%): " + ("FAIL: " if g["failed"] else "pass: ")
                     + g["why"])
    lines.append("")
    lines.append(RULE)
    return "\n".join(lines) + "\n"


def _side_line(label: str, side: dict[str, Any]) -> str:
    return (f"  {label}: {side['path']} ({side['world_size']} ranks, {side['steps']} step records, "
            f"{side['status']}, {side['duration_s']} s)")


def _ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def gate(c: Comparison, threshold_pct: float) -> dict[str, Any]:
    v = c.verdict
    ch = v.get("change_pct")
    failed = v["kind"] == "slower" and ch is not None and ch >= threshold_pct
    if failed:
        why = f"B is slower by {_pct(ch)} (significant), at least {threshold_pct:g}%"
    elif v["kind"] == "slower":
        why = f"B is slower by {_pct(ch)}, under the {threshold_pct:g}% threshold"
    elif v["kind"] == "not_comparable":
        why = "the runs are not comparable, so there is no regression to judge (see above)"
    else:
        why = f"no significant slowdown ({v['kind'].replace('_', ' ')})"
    return {"threshold_pct": threshold_pct, "failed": failed, "why": why}


def compare_cli(a: str, b: str, as_json: bool = False, fail_on_regression: Optional[float] = None,
                html: Optional[str] = None) -> int:
    if fail_on_regression is not None and not (math.isfinite(fail_on_regression) and fail_on_regression >= 0):
        raise CompareError(f"--fail-on-regression {fail_on_regression!r} is not a usable threshold: "
                           "give the slowdown in percent that should fail, a number >= 0 (for "
                           "example --fail-on-regression 5).")
    ra, rb = load_run(a, "A"), load_run(b, "B")
    c = compare(ra, rb)
    if fail_on_regression is not None:
        c.gate = gate(c, fail_on_regression)
    if as_json:
        sys.stdout.write(json.dumps(c.to_json(), indent=1) + "\n")
    else:
        sys.stdout.write(render(c))
    if html:
        from ..rundir import atomic_write
        from .render_html import render_compare_html

        try:
            atomic_write(Path(html), render_compare_html(c.to_json(), ra.summary, rb.summary).encode())
        except OSError as exc:
            raise CompareError(f"--html {html}: cannot write the page ({exc.strerror or exc}); "
                               "give a path in a writable directory.") from None
        sys.stderr.write(f"traceml: comparison page written to {html}\n")
    sys.stdout.flush()
    return 1 if c.gate is not None and c.gate["failed"] else 0
