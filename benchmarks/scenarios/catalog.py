"""The scenarios of the verdict matrix: each a cause injected into ``train.py``, with the verdict
a correct classifier must give it (its ground truth).

A verdict kind belongs to one *class* of the matrix: the cause it names, or ``none`` for the
verdicts that describe a healthy run (``compute_bound``, ``no_clear_bottleneck``, and
``cpu_contention``, other processes holding the node's cores: information about the machine, not
a cause in the job). A scenario is judged right when the primary verdict's class is its ``expect``, the
primary names the ``culprit`` rank and (for a straggler) puts the excess in ``phase`` where the
scenario says so, and every kind in ``also`` follows among the other verdicts. Controls (``expect``
``none``) must have no ``warning`` or ``critical`` verdict at all, primary or not.

Magnitudes are relative to each rank's own compute (``train.py``: "twice as slow", "a batch costs
twice the compute to load"), so a cause is the same share of a step on an idle machine and on one
shared with ten other jobs, and each is far from every threshold, never tuned to one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

#: verdict kind -> class of the matrix (its column)
CLASS_OF = {
    "compute_bound": "none", "no_clear_bottleneck": "none", "cpu_contention": "none",
    "straggler": "straggler", "input_bound": "input_bound", "memory_creep": "memory_creep",
    "communication_bound": "communication_bound", "periodic_work": "periodic_work",
    "cpu_oversubscribed": "cpu_oversubscribed", "host_sync": "host_sync",
    "low_gpu_util": "low_gpu_util", "hang": "hang", "run_failed": "run_failed",
    "no_steps": "no_steps", "did_not_start": "did_not_start",
}
#: the columns of the matrix, in print order (a kind not listed gets a column of its own)
CLASSES = ("none", "input_bound", "straggler", "memory_creep", "periodic_work",
           "cpu_oversubscribed", "communication_bound", "host_sync", "low_gpu_util", "no_steps",
           "run_failed", "hang", "did_not_start")


def class_of(kind: str) -> str:
    return CLASS_OF.get(kind, kind)


@dataclass(frozen=True)
class Scenario:
    name: str
    #: the injected cause, in words (the row of the matrix)
    cause: str
    args: tuple[str, ...]
    #: the class the primary verdict must have
    expect: str
    culprit: Optional[int] = None
    phase: Optional[str] = None
    also: tuple[str, ...] = ()
    #: clear-cut: one cause, well above every threshold; must be stable across runs and modes
    clear_cut: bool = True
    #: the cheapest scenario of its cause: in the CI subset (get_batch input is there already, in
    #: tests/launcher/test_input_headline.py)
    ci: bool = False
    #: what the machine needs: "cpu" (any), "cuda"
    needs: str = "cpu"
    nproc: int = 2
    #: environment for the workers (beyond OMP_NUM_THREADS=1, which torchrun sets anyway)
    env: tuple[tuple[str, str], ...] = field(default=())

    def label(self) -> str:
        return self.name


def _s(name: str, cause: str, expect: str, *args: str, **kw: Any) -> Scenario:
    return Scenario(name=name, cause=cause, args=tuple(args), expect=expect, **kw)


STEPS = "100"
MiB_KIB = "2048"
#: "twice as slow": the slow rank's extra work per step equals its own compute
TWICE = "1.0"

SCENARIOS: tuple[Scenario, ...] = (
    # --- controls: nothing wrong (batches made up front, compute far above the all-reduce) ------
    _s("control", "nothing (batches made up front)", "none", "--steps", STEPS, ci=True),
    _s("control-long", "nothing, 600 steps", "none", "--steps", "600"),
    # --- input --------------------------------------------------------------------------------
    _s("loader", "DataLoader: a batch costs 2x the compute to load, 1 worker", "input_bound",
       "--steps", STEPS, "--input", "loader", "--item-factor", "2", "--workers", "1", ci=True),
    _s("loader-0w", "DataLoader: a batch costs 1x the compute to load, no workers", "input_bound",
       "--steps", STEPS, "--input", "loader", "--item-factor", "1", "--workers", "0"),
    _s("get-batch", "get_batch() costing 1x the compute before each step, no DataLoader", "input_bound",
       "--steps", STEPS, "--input", "get_batch", "--fetch-factor", "1"),
    # --- one slow rank, the extra work in each phase -------------------------------------------
    _s("slow-forward", "rank 1 twice as slow, the extra in forward", "straggler",
       "--steps", STEPS, "--slow-rank", "1", "--slow-phase", "forward", "--slow-factor", TWICE,
       culprit=1, phase="forward"),
    _s("slow-backward", "rank 1 twice as slow, the extra in backward", "straggler",
       "--steps", STEPS, "--slow-rank", "1", "--slow-phase", "backward", "--slow-factor", TWICE,
       culprit=1, phase="backward"),
    _s("slow-optimizer", "rank 0 twice as slow, the extra in the optimizer", "straggler",
       "--steps", STEPS, "--slow-rank", "0", "--slow-phase", "optimizer", "--slow-factor", TWICE,
       culprit=0, phase="optimizer"),
    _s("slow-nophase", "rank 1 twice as slow, the extra in no phase (inside the step)", "straggler",
       "--steps", STEPS, "--slow-rank", "1", "--slow-phase", "nophase", "--slow-factor", TWICE,
       culprit=1, phase="nophase", ci=True),
    _s("slow-input", "rank 1's batches cost 1x its compute to fetch (its data shard is slow)", "straggler",
       "--steps", STEPS, "--slow-rank", "1", "--slow-phase", "input", "--slow-factor", TWICE,
       culprit=1, phase="outside"),
    # --- memory ---------------------------------------------------------------------------------
    _s("creep-100-large", "rank 1 keeps 2 MiB per step, 100 steps", "memory_creep",
       "--steps", "100", "--leak-rank", "1", "--leak-kib", MiB_KIB, culprit=1, ci=True),
    _s("creep-250-large", "rank 1 keeps 2 MiB per step, 250 steps", "memory_creep",
       "--steps", "250", "--leak-rank", "1", "--leak-kib", MiB_KIB, culprit=1),
    _s("creep-250-small", "rank 0 keeps 512 KiB per step, 250 steps", "memory_creep",
       "--steps", "250", "--leak-rank", "0", "--leak-kib", "512", culprit=0),
    _s("creep-2000-small", "rank 1 keeps 128 KiB per step, 2,000 steps", "memory_creep",
       "--steps", "2000", "--batch", "2048", "--leak-rank", "1", "--leak-kib", "128", culprit=1),
    _s("creep-2000-large", "rank 1 keeps 512 KiB per step, 2,000 steps", "memory_creep",
       "--steps", "2000", "--batch", "2048", "--leak-rank", "1", "--leak-kib", "512", culprit=1),
    _s("plateau", "rank 1 keeps 2 MiB per step for 60 steps, then stops (250 steps)", "none",
       "--steps", "250", "--leak-rank", "1", "--leak-kib", MiB_KIB, "--leak-until", "60", ci=True),
    # --- between steps ------------------------------------------------------------------------
    _s("periodic", "every 10 steps the compute of 10 steps between steps (evaluation)", "periodic_work",
       "--steps", STEPS, "--every", "10", "--every-factor", "1", ci=True),
    # --- CPU ------------------------------------------------------------------------------------
    _s("oversubscribed", "4 torch threads per rank, 2 ranks, 2 cores", "cpu_oversubscribed",
       "--steps", STEPS, "--threads", "4", ci=True),
    # --- compound: the cause first, its effect as `also` ---------------------------------------
    _s("creep-slows", "rank 1 keeps 2 MiB per step and scans it (slows its rank)", "memory_creep",
       "--steps", "100", "--leak-rank", "1", "--leak-kib", MiB_KIB, "--leak-touch",
       culprit=1, also=("straggler",), clear_cut=False, ci=True),
    _s("input-straggler", "synchronous loading costing 1.5x the compute on all ranks, and rank 1 "
       "0.5x slower in forward", "input_bound", "--steps", STEPS, "--input", "loader",
       "--item-factor", "1.5", "--workers", "0", "--slow-rank", "1", "--slow-phase", "forward",
       "--slow-factor", "0.5", also=("straggler",), clear_cut=False),
    # --- CUDA only ------------------------------------------------------------------------------
    _s("host-sync", "loss.item() every step (CUDA)", "host_sync", "--steps", STEPS, "--sync",
       needs="cuda"),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def ci_subset() -> list[Scenario]:
    return [s for s in SCENARIOS if s.ci]


def shortened(sc: Scenario, steps: int) -> Scenario:
    """The scenario with at most ``steps`` steps (the CI subset's budget), its other
    step counts (a plateau's end) scaled with it."""
    args = list(sc.args)
    if "--steps" not in args:
        return sc
    i = args.index("--steps")
    old = int(args[i + 1])
    if old <= steps:
        return sc
    args[i + 1] = str(steps)
    if "--leak-until" in args:
        j = args.index("--leak-until")
        args[j + 1] = str(max(1, int(args[j + 1]) * steps // old))
    return replace(sc, args=tuple(args))


@dataclass
class Outcome:
    """What one run of a scenario got (from its ``final_summary.json``)."""

    scenario: str
    mode: str
    run: int
    kind: str
    severity: str
    culprit: Optional[int]
    phase: Optional[str]
    others: list[tuple[str, str]]
    why: str
    status: str
    wall_s: float
    load: tuple[float, float]
    error: str = ""

    @property
    def cls(self) -> str:
        return class_of(self.kind)


def outcome_from_summary(summary: dict[str, Any], scenario: str, mode: str, run: int, wall_s: float,
                         load: tuple[float, float]) -> Outcome:
    v = summary["verdict"]
    culprit = (v.get("culprit") or {}).get("rank")
    return Outcome(scenario=scenario, mode=mode, run=run, kind=v["kind"], severity=v["severity"],
                   culprit=culprit, phase=(v.get("evidence") or {}).get("phase"),
                   others=[(o["kind"], o["severity"]) for o in summary.get("other_verdicts", [])],
                   why=v.get("why", ""), status=summary["run"]["status"], wall_s=wall_s, load=load)


def problems(sc: Scenario, o: Outcome) -> list[str]:
    """Why an outcome is wrong for its scenario (empty: right)."""
    out = []
    if o.error:
        return [o.error]
    if o.cls != sc.expect:
        out.append(f"primary {o.kind} ({o.severity}), expected {sc.expect}")
    if sc.culprit is not None and o.cls == sc.expect and o.culprit != sc.culprit:
        out.append(f"culprit rank {o.culprit}, expected {sc.culprit}")
    if sc.phase is not None and o.cls == sc.expect and o.phase != sc.phase:
        out.append(f"phase {o.phase}, expected {sc.phase}")
    kinds = [k for k, _ in o.others]
    for k in sc.also:
        if k not in kinds:
            out.append(f"no {k} among the other verdicts ({', '.join(kinds) or 'none'})")
    if sc.expect == "none":
        loud = [f"{k} ({s})" for k, s in [(o.kind, o.severity)] + o.others if s in ("warning", "critical")]
        if loud:
            out.append("warning/critical on a control: " + ", ".join(loud))
    return out
