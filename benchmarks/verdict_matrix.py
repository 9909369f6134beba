"""The verdict engine as a measured classifier: real runs with known causes, every verdict scored.

Each scenario of ``benchmarks/scenarios/catalog.py`` (a cause injected into one parameterised DDP
training script: real work where it matters; or none; or a failure, a hang) runs ``--runs`` times
in each of ``--modes`` under a real ``traceml run`` (torchrun, gloo ranks on CPU; the 2-node
scenarios as batch jobs of the dev Slurm cluster), and **every verdict** of its
``final_summary.json`` is scored against the scenario's truth (``catalog.score``): the cause found
on the right rank and phase with figures that agree, every consequence listed, no false warning
or critical secondary, no information sentence that contradicts the truth, controls with no
warning or critical at all.

Printed, for each half (``tune``: rules may be changed for what these show; ``held`` and
``held2``: never, see catalog.py) and for all: the confusion matrix (scenario x class of the primary verdict), precision and recall
per class with their counts (verdicts: a false secondary counts against its class's precision,
a cause not found against its recall), the share of verdicts right and of runs right, the
thresholds' error rate on the *near* scenarios (a cause 1.5-2.5x its threshold) apart, false
warnings on controls, every wrong run with why, and the machine's load average beside the
figures.

    scripts/dev-cluster exec .venv/bin/python benchmarks/verdict_matrix.py --outcomes m.jsonl   # all
    ... benchmarks/verdict_matrix.py --half tune --runs 1 --modes summary
    ... benchmarks/verdict_matrix.py --ci --runs 1 --modes summary                    # the CI subset
    ... benchmarks/verdict_matrix.py --busy 2 --outcomes loaded.jsonl                 # beside a CI-like load
    ... benchmarks/verdict_matrix.py --only control,batch-above --runs 2 --json out.json
    .venv/bin/python benchmarks/verdict_matrix.py --report m.jsonl                    # figures again

(``scripts/dev-cluster exec`` with your TRACEML_CLUSTER_PREFIX/NET runs it in the dev cluster's
login namespace: its loopback ports never meet another job's, and the 2-node scenarios can run;
outside it they are skipped.) CUDA-only scenarios are skipped without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scenarios.catalog import CLASSES, SCENARIOS, Outcome, Scenario, score  # noqa: E402
from scenarios import runner  # noqa: E402
from scenarios.runner import MODES, run_scenario  # noqa: E402

TARGET_RIGHT = 0.95
TARGET_RECALL = 0.90


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _in_cluster() -> bool:
    return "SLURM_CONF" in os.environ and "TRACEML_CLUSTER_DIR" in os.environ


def select(args: argparse.Namespace) -> list[Scenario]:
    chosen = [s for s in SCENARIOS if (not args.ci or s.ci) and (args.half == "all" or s.half == args.half)]
    if args.only:
        names = args.only.split(",")
        unknown = set(names) - {s.name for s in SCENARIOS}
        if unknown:
            sys.exit(f"verdict_matrix: unknown scenario(s) {sorted(unknown)}; known: "
                     + ", ".join(s.name for s in SCENARIOS))
        chosen = [s for s in chosen if s.name in names]
    if args.skip:
        chosen = [s for s in chosen if s.name not in args.skip.split(",")]
    cuda, cluster = _cuda(), _in_cluster()
    skipped = [s.name for s in chosen if s.needs == "cuda" and not cuda]
    if skipped:
        print(f"skipped (need CUDA): {', '.join(skipped)}")
    off = [s.name for s in chosen if s.nodes > 1 and not cluster]
    if off:
        print(f"skipped (need the dev Slurm cluster: run under scripts/dev-cluster exec): {', '.join(off)}")
    return [s for s in chosen if (s.needs != "cuda" or cuda) and (s.nodes == 1 or cluster)]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i in (0, 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} = {a / b:.1%}" if b else "-"


def figures(scenarios: list[Scenario], outcomes: list[Outcome], title: str, quiet: bool = False) -> dict[str, Any]:
    """The figures of one set of runs (a half, or all), printed under ``title``."""
    by = {s.name: s for s in scenarios}
    outcomes = [o for o in outcomes if o.scenario in by]
    if not outcomes:
        return {}
    per: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        per[o.scenario].append(o)
    scores = {id(o): score(by[o.scenario], o) for o in outcomes}
    seen = {o.cls for o in outcomes}
    cols = [c for c in CLASSES if c in seen or c in {by[o.scenario].expect for o in outcomes}]
    cols += sorted(seen - set(cols))
    say = (lambda *a: None) if quiet else print
    say(f"\n=== {title} ===")

    rows = [["scenario", "expected"] + cols + ["right"]]
    for s in scenarios:
        if s.name not in per:
            continue
        got = Counter(o.cls for o in per[s.name])
        n_right = sum(1 for o in per[s.name] if scores[id(o)].right)
        rows.append([s.name, s.expect] + [str(got.get(c, 0) or ".") for c in cols]
                    + [f"{n_right}/{len(per[s.name])}"])
    say("Confusion matrix (rows: injected cause; columns: class of the primary verdict; counts over runs x modes)")
    say(table(rows))

    # precision / recall per class over every verdict scored
    tp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    for o in outcomes:
        sc = scores[id(o)]
        tp.update(sc.tp)
        fn.update(sc.fn)
        fp.update(sc.fp)
    pr = {}
    lines = [["class", "", "precision", "recall", "found", "missed", "false"]]
    for c in sorted(set(tp) | set(fn) | set(fp), key=lambda c: CLASSES.index(c) if c in CLASSES else 99):
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else None
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else None
        pr[c] = {"precision": p, "recall": r, "tp": tp[c], "fn": fn[c], "fp": fp[c]}
        lines.append([c, "", "-" if p is None else f"{p:.0%}", "-" if r is None else f"{r:.0%}",
                      str(tp[c]), str(fn[c]), str(fp[c])])
    say("\nPer class, every verdict scored (found: the cause or consequence found right; missed: expected, "
        "not found or found wrong; false: loud and not true)")
    say(table(lines))

    v_right = sum(scores[id(o)].verdicts_right for o in outcomes)
    v_all = sum(scores[id(o)].verdicts_scored for o in outcomes)
    r_right = sum(1 for o in outcomes if scores[id(o)].right)
    near = [o for o in outcomes if by[o.scenario].magnitude == "near"]
    near_wrong = sum(1 for o in near if not scores[id(o)].right)
    rest = [o for o in outcomes if by[o.scenario].magnitude != "near"]
    rest_right = sum(1 for o in rest if scores[id(o)].right)
    controls = [o for o in outcomes if by[o.scenario].expect == "none"]
    false_loud = [o for o in controls if not scores[id(o)].right]
    loads = [x for o in outcomes for x in o.load]
    say(f"\nVerdicts right: {_pct(v_right, v_all)} (every verdict of every run; causes, consequences, "
        "secondaries)")
    say(f"Runs right: {_pct(r_right, len(outcomes))}; without the near-threshold runs {_pct(rest_right, len(rest))}")
    if near:
        say(f"Near-threshold runs (cause 1.5-2.5x its threshold) wrong: {_pct(near_wrong, len(near))}: "
            "the thresholds' error rate at their edge")
    say(f"Controls with a warning or critical: {len(false_loud)} of {len(controls)} control runs")
    for o in outcomes:
        sc = scores[id(o)]
        if not sc.right:
            say(f"  wrong: {o.scenario} [{o.mode} #{o.run}]: {'; '.join(sc.errors)}")
    if loads:
        say(f"Machine load (1-min load average at each run's start and end): mean {sum(loads) / len(loads):.1f}, "
            f"min {min(loads):.1f}, max {max(loads):.1f}; {os.cpu_count()} CPUs")
    low_recall = [c for c, v in pr.items() if v["recall"] is not None and v["recall"] < TARGET_RECALL]
    targets = [
        ("verdicts right", f"{v_right / v_all:.1%}" if v_all else "-", ">= 95%", bool(v_all) and v_right / v_all >= TARGET_RIGHT),
        ("warnings/criticals on controls", str(len(false_loud)), "0", not false_loud),
        ("recall per class", ", ".join(low_recall) or "all >= 90%", ">= 90% each", not low_recall),
    ]
    say(table([["target", "measured", "wanted", "met"]] + [[a, b, c, "yes" if d else "NO"] for a, b, c, d in targets]))
    return {"matrix": rows, "classes": pr, "verdicts_right": v_right, "verdicts_scored": v_all,
            "runs_right": r_right, "runs": len(outcomes), "near_wrong": near_wrong, "near": len(near),
            "false_loud_on_controls": len(false_loud), "controls": len(controls),
            "targets": [{"target": a, "measured": b, "wanted": c, "met": d} for a, b, c, d in targets],
            "load": {"mean": sum(loads) / len(loads) if loads else None, "min": min(loads, default=None),
                     "max": max(loads, default=None), "cpus": os.cpu_count()}}


def report(scenarios: list[Scenario], outcomes: list[Outcome]) -> dict[str, Any]:
    out: dict[str, Any] = {"outcomes": [o.to_json() for o in outcomes]}
    ran = {o.scenario for o in outcomes}
    titles = {"tune": "tune half (rules may be changed for what these show)",
              "held": "held-out half (written before the rules changed, never tuned on)",
              "held2": "second held-out set (written before the second round of rule changes)"}
    halves = [h for h in titles if any(s.half == h and s.name in ran for s in scenarios)]
    for half in halves:
        out[half] = figures([s for s in scenarios if s.half == half], outcomes, titles[half])
    if len(halves) > 1:
        out["all"] = figures(scenarios, outcomes, "both halves")
    return out


def rejudge(dirs: list[Path]) -> list[Outcome]:
    """The runs kept in ``dirs`` (``<scenario>-<mode>-<run>`` directories), each summary rebuilt
    from its checkpoint with this checkout's rules and scored."""
    from scenarios.catalog import BY_NAME, outcome_from_summary
    from traceml_core.report.summarize import SummarizeError, summarize

    out = []
    for d in dirs:
        for run_dir in sorted(p for p in d.iterdir() if p.is_dir()):
            name, _, rest = run_dir.name.rpartition("-")
            scenario, _, mode = name.rpartition("-")
            if scenario not in BY_NAME or not rest.isdigit():
                continue
            try:
                summary = summarize(run_dir)["summary"]
            except (SummarizeError, OSError, ValueError) as exc:
                out.append(Outcome(scenario, mode, int(rest), [], "no summary", 0.0, (0.0, 0.0),
                                   error=f"cannot rebuild: {exc}"))
                continue
            out.append(outcome_from_summary(summary, scenario, mode, int(rest), 0.0, (0.0, 0.0)))
    return out


def _load(path: str) -> list[Outcome]:
    return [Outcome.from_json(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of each scenario in each mode")
    ap.add_argument("--modes", default="summary", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--skip", default="", help="comma-separated scenario names to leave out")
    ap.add_argument("--half", choices=("tune", "held", "held2", "all"), default="all")
    ap.add_argument("--ci", action="store_true", help="the CI subset only")
    ap.add_argument("--logs", default="", help="keep the runs' directories here (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside every run (a CPU load like CI's: 2), "
                    "on top of a scenario's own")
    ap.add_argument("--json", default="", help="write outcomes and figures here")
    ap.add_argument("--outcomes", default="", help="append each run's outcome to this JSON-lines file "
                    "as it comes (a long matrix cut short keeps what it measured)")
    ap.add_argument("--report", default="", help="print the figures of the outcomes in this JSON-lines "
                    "file (from --outcomes; several: comma-separated) instead of running anything")
    ap.add_argument("--rejudge", default="", help="judge again, with this checkout's rules, the runs kept in "
                    "this directory (from --logs; several: comma-separated): each run's summary is rebuilt (rewritten) from "
                    "its checkpoint (traceml summarize) and scored; nothing runs")
    ap.add_argument("--src", default="", help="TraceML source directory the runs use (default: this "
                    "checkout's src; e.g. an older commit's, exported with git archive, for a baseline)")
    args = ap.parse_args(argv)
    if args.src:
        runner.SRC[0] = Path(args.src).resolve()
    modes = [m for m in args.modes.split(",") if m]
    if args.report:
        outcomes = [o for p in args.report.split(",") for o in _load(p)]
        names = {o.scenario for o in outcomes}
        scenarios = [s for s in SCENARIOS if s.name in names]
        data = report(scenarios, outcomes)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        return 0
    if args.rejudge:
        outcomes = rejudge([Path(p) for p in args.rejudge.split(",")])
        if args.outcomes:
            with open(args.outcomes, "a") as f:
                f.writelines(json.dumps(o.to_json()) + "\n" for o in outcomes)
        names = {o.scenario for o in outcomes}
        data = report([s for s in SCENARIOS if s.name in names], outcomes)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        return 0
    scenarios = select(args)
    if args.busy:
        from dataclasses import replace as _replace

        scenarios = [_replace(s, busy=s.busy + args.busy) for s in scenarios]
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
                        f.write(json.dumps(o.to_json()) + "\n")
                sc = score(s, o)
                where = f" rank {o.culprit}" if o.culprit is not None else ""
                where += f" in {o.phase}" if o.phase else ""
                others = ", ".join(f"{v.kind}:{v.severity[0]}" for v in o.verdicts[1:])
                print(f"  {s.name:<22} {s.half:<5} {mode:<7} #{run}  {o.kind} ({o.severity}){where}"
                      f"{' + ' + others if others else ''}  [{o.wall_s:.0f} s, load {o.load[0]:.1f}]"
                      + (f"  WRONG: {'; '.join(sc.errors)}" if sc.errors else ""), flush=True)
    print(f"{len(outcomes)} runs in {time.monotonic() - t0:.0f} s")
    data = report(scenarios, outcomes)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
