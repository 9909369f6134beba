"""The verdict engine as a measured classifier: real runs with known causes, injected cause x
primary verdict.

Each scenario of ``benchmarks/scenarios/catalog.py`` (a cause injected into one parameterised
DDP training script, or none) runs ``--runs`` times in each of ``--modes`` under a real
``traceml run`` (torchrun, 2 gloo ranks on CPU); every run's primary verdict is read from its
``final_summary.json``. Printed: the confusion matrix (scenario x class of the primary verdict),
precision and recall per verdict class, the share of primaries right (kind, culprit rank, phase,
and the ``also`` verdicts of compound causes), false warnings/criticals on controls, stability
(the same primary in every run and mode), the machine's load average beside the figures, and the
targets of issue 22 with met / not met.

    scripts/dev-cluster exec .venv/bin/python benchmarks/verdict_matrix.py            # all, 3 runs x 2 modes
    ... benchmarks/verdict_matrix.py --ci --runs 1 --modes summary                    # the CI subset
    ... benchmarks/verdict_matrix.py --only control,slow-nophase --runs 2 --json out.json

(``scripts/dev-cluster exec`` with your TRACEML_CLUSTER_PREFIX/NET runs it in a network namespace
of its own: its loopback ports never meet another job's.) CUDA-only scenarios are skipped
without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scenarios.catalog import CLASSES, SCENARIOS, Outcome, Scenario, problems  # noqa: E402
from scenarios import runner  # noqa: E402
from scenarios.runner import MODES, run_scenario  # noqa: E402

TARGET_RIGHT = 0.95


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def select(args: argparse.Namespace) -> list[Scenario]:
    chosen = [s for s in SCENARIOS if not args.ci or s.ci]
    if args.only:
        names = args.only.split(",")
        unknown = set(names) - {s.name for s in SCENARIOS}
        if unknown:
            sys.exit(f"verdict_matrix: unknown scenario(s) {sorted(unknown)}; known: "
                     + ", ".join(s.name for s in SCENARIOS))
        chosen = [s for s in chosen if s.name in names]
    cuda = _cuda()
    skipped = [s.name for s in chosen if s.needs == "cuda" and not cuda]
    if skipped:
        print(f"skipped (need CUDA): {', '.join(skipped)}")
    return [s for s in chosen if s.needs != "cuda" or cuda]


def table(rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i in (0, 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def report(scenarios: list[Scenario], outcomes: list[Outcome]) -> dict:
    by = {s.name: s for s in scenarios}
    per: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        per[o.scenario].append(o)
    seen = {o.cls for o in outcomes}
    cols = [c for c in CLASSES if c in seen or c in {s.expect for s in scenarios}]
    cols += sorted(seen - set(cols))

    # the confusion matrix: scenario (its expected class) x class of the primary verdict
    rows = [["scenario", "expected"] + cols + ["right"]]
    for s in scenarios:
        got = Counter(o.cls for o in per[s.name])
        n_right = sum(1 for o in per[s.name] if not problems(s, o))
        rows.append([s.name, s.expect] + [str(got.get(c, 0) or ".") for c in cols]
                    + [f"{n_right}/{len(per[s.name])}"])
    print("\nConfusion matrix (rows: injected cause; columns: class of the primary verdict; counts over runs x modes)")
    print(table(rows))

    # precision / recall per class (class level: the primary's class against the expected one)
    pr = {}
    lines = [["class", "", "precision", "recall", "predicted", "true"]]
    for c in cols:
        tp = sum(1 for o in outcomes if o.cls == c and by[o.scenario].expect == c)
        pred = sum(1 for o in outcomes if o.cls == c)
        true = sum(1 for o in outcomes if by[o.scenario].expect == c)
        if not pred and not true:
            continue
        p = tp / pred if pred else None
        r = tp / true if true else None
        pr[c] = {"precision": p, "recall": r, "predicted": pred, "true": true}
        lines.append([c, "", "-" if p is None else f"{p:.0%}", "-" if r is None else f"{r:.0%}",
                      str(pred), str(true)])
    print("\nPer verdict class")
    print(table(lines))

    right = [o for o in outcomes if not problems(by[o.scenario], o)]
    share = len(right) / len(outcomes) if outcomes else 0.0
    controls = [o for o in outcomes if by[o.scenario].expect == "none"]
    false_loud = [(o, p) for o in controls for p in problems(by[o.scenario], o) if p.startswith("warning/critical")]
    stability = {}
    for s in scenarios:
        keys = {(o.cls, o.culprit if s.culprit is not None else None,
                 o.phase if s.phase is not None else None) for o in per[s.name]}
        modes = {o.mode for o in per[s.name]}
        stability[s.name] = {"stable": len(keys) == 1, "primaries": sorted(map(str, keys)),
                             "runs": len(per[s.name]), "modes": sorted(modes), "clear_cut": s.clear_cut}
    clear = [s for s in scenarios if s.clear_cut]
    unstable = [s.name for s in clear if not stability[s.name]["stable"]]
    compound = [s for s in scenarios if s.also]
    compound_ok = [s.name for s in compound if all(not problems(s, o) for o in per[s.name])]
    loads = [x for o in outcomes for x in o.load]

    print(f"\nPrimaries right: {len(right)}/{len(outcomes)} = {share:.1%} (kind, culprit rank, phase, `also`)")
    wrong = [(o, problems(by[o.scenario], o)) for o in outcomes if problems(by[o.scenario], o)]
    for o, why in wrong:
        print(f"  wrong: {o.scenario} [{o.mode} #{o.run}]: {'; '.join(why)}")
    print(f"False warnings/criticals on controls: {len(false_loud)} of {len(controls)} control runs")
    print(f"Stable (same primary in every run and mode): {len(clear) - len(unstable)}/{len(clear)} clear-cut scenarios"
          + (f"; unstable: {', '.join(unstable)}" if unstable else ""))
    if compound:
        print(f"Compound causes, cause first and effect as `also` in every run: {len(compound_ok)}/{len(compound)}")
    if loads:
        print(f"Machine load (1-min load average at each run's start and end): mean {sum(loads) / len(loads):.1f}, "
              f"min {min(loads):.1f}, max {max(loads):.1f}; {os.cpu_count()} CPUs")
    modes = sorted({o.mode for o in outcomes})
    runs = max((len([o for o in per[s.name] if o.mode == modes[0]]) for s in scenarios), default=0) if modes else 0
    targets = [
        ("primaries right", f"{share:.1%}", ">= 95%", share >= TARGET_RIGHT),
        ("false warnings/criticals on controls", str(len(false_loud)), "0", not false_loud),
        ("clear-cut scenarios stable in every run and mode", f"{len(clear) - len(unstable)}/{len(clear)}",
         f"all, over {runs} runs x {len(modes)} mode(s)", not unstable and runs >= 3 and len(modes) >= 2),
        ("compound: cause first, effect as also", f"{len(compound_ok)}/{len(compound)}", "all",
         len(compound_ok) == len(compound)),
    ]
    print("\nTargets (issue 22)")
    print(table([["target", "measured", "wanted", "met"]] + [[a, b, c, "yes" if d else "NO"] for a, b, c, d in targets]))
    return {"outcomes": [asdict(o) for o in outcomes], "matrix": rows, "classes": pr,
            "right": share, "false_loud_on_controls": len(false_loud), "stability": stability,
            "targets": [{"target": a, "measured": b, "wanted": c, "met": d} for a, b, c, d in targets],
            "load": {"mean": sum(loads) / len(loads) if loads else None,
                     "min": min(loads, default=None), "max": max(loads, default=None),
                     "cpus": os.cpu_count()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each scenario in each mode")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--ci", action="store_true", help="the CI subset only")
    ap.add_argument("--logs", default="", help="keep the runs' directories here (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", default="", help="write outcomes and figures here")
    ap.add_argument("--outcomes", default="", help="append each run's outcome to this JSON-lines file "
                    "as it comes (a long matrix cut short keeps what it measured)")
    ap.add_argument("--report", default="", help="print the figures of the outcomes in this JSON-lines "
                    "file (from --outcomes) instead of running anything")
    ap.add_argument("--src", default="", help="TraceML source directory the runs use (default: this "
                    "checkout's src; e.g. an older commit's, exported with git archive, for a baseline)")
    args = ap.parse_args(argv)
    if args.src:
        runner.SRC[0] = Path(args.src).resolve()
    modes = [m for m in args.modes.split(",") if m]
    scenarios = select(args)
    if args.report:
        outcomes = [Outcome(**{**d, "load": tuple(d["load"]), "others": [tuple(x) for x in d["others"]]})
                    for d in map(json.loads, Path(args.report).read_text().splitlines()) if d]
        names = {o.scenario for o in outcomes}
        data = report([s for s in scenarios if s.name in names], outcomes)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        return 0
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="verdict-matrix-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"verdict matrix: {len(scenarios)} scenarios x {args.runs} runs x modes {', '.join(modes)}; "
          f"runs in {logs}; TraceML from {runner.SRC[0]}")
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    for run in range(args.runs):  # run by run, so a slow spell of the machine hits every scenario
        for s in scenarios:
            for mode in modes:
                o = run_scenario(s, mode, logs, run, timeout=args.timeout)
                outcomes.append(o)
                if args.outcomes:
                    with open(args.outcomes, "a") as f:
                        f.write(json.dumps(asdict(o)) + "\n")
                bad = problems(s, o)
                where = f" rank {o.culprit}" if o.culprit is not None else ""
                where += f" in {o.phase}" if o.phase else ""
                print(f"  {s.name:<18} {mode:<8} #{run}  {o.kind} ({o.severity}){where}"
                      f"  [{o.wall_s:.0f} s, load {o.load[0]:.1f}]" + (f"  WRONG: {'; '.join(bad)}" if bad else ""),
                      flush=True)
    print(f"{len(outcomes)} runs in {time.monotonic() - t0:.0f} s")
    data = report(scenarios, outcomes)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
