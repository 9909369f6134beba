"""CLI latency: wall time of ``traceml --help`` and ``traceml run --print-config``, and what they import.

Each command runs ``--reps`` times as a fresh process (what a user waits for); the median and the
best are printed, next to a bare ``python -c pass`` for the interpreter's own start-up. The
print-config path is timed outside a job and inside a Slurm step (the environment of a real step,
from tests/fixtures/slurm_env), where the Slurm plugin parses the job's variables. Then
``python -X importtime`` lists the slowest imports of each path and checks that torch is not
among them.

Targets: ``--help`` under 150 ms (issue 8), ``run --print-config`` under 150 ms (issue 26; it was
300 ms), no torch import. Besides the wall time, the CPU time (user + sys) of each process is
printed: on a shared, loaded machine it moves much less than the wall time.

``--against DIR`` runs every command a second time with DIR/src first on the path (another
checkout, for example ``git archive main | tar -x -C DIR``), each repetition of the two side by
side, and prints the ratio: the before/after figures of a change in one run.

    python benchmarks/cli_latency.py [--reps 10] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_FIXTURE = REPO / "tests" / "fixtures" / "slurm_env" / "22.05" / "gpn_step_node0.json"
TARGETS = {"help": 0.150, "print-config": 0.150, "print-config, 3 flags": 0.150,
           "print-config (Slurm step)": 0.150}


def _env(slurm: bool, repo: Path = REPO) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TRACEML_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python caches compiled modules
    env["PYTHONPATH"] = str(repo / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if slurm:
        data = json.loads(SLURM_FIXTURE.read_text())
        env.update({k: v for k, v in data.items() if k.startswith("SLURM") and isinstance(v, str)})
    return env


def commands() -> dict[str, tuple[list[str], bool]]:
    cli = [sys.executable, "-m", "traceml_core.cli"]
    return {
        "python -c pass": ([sys.executable, "-c", "pass"], False),
        "help": (cli + ["--help"], False),
        "print-config": (cli + ["run", "--print-config", "train.py"], False),
        "print-config, 3 flags": (cli + ["run", "--print-config", "--nproc-per-node=4", "--run-name=x",
                                         "--mode=cli", "train.py"], False),
        "print-config (Slurm step)": (cli + ["run", "--print-config", "train.py"], True),
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + sys) of one run of ``cmd``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def slowest_imports(cmd: list[str], env: dict[str, str], top: int = 5) -> tuple[list[tuple[int, str]], bool]:
    """(cumulative µs, module) of the slowest top-level imports, and whether torch was imported."""
    proc = subprocess.run([cmd[0], "-X", "importtime"] + cmd[1:], env=env, capture_output=True, text=True)
    rows = []
    torch = False
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:"):].split("|")
        try:
            cumulative = int(parts[1])
        except ValueError:
            continue
        name = parts[2][1:].rstrip()  # one space after the bar, then two per nesting level
        if name.strip().split(".")[0] == "torch":
            torch = True
        if not name.startswith(" "):  # top level: imported by the program itself
            rows.append((cumulative, name))
    rows.sort(reverse=True)
    return rows[:top], torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--against", type=Path, help="another checkout to time side by side (before/after)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    trees = {"": REPO} if args.against is None else {"": REPO, "against": args.against.resolve()}
    for repo in trees.values():  # compiled once, as on a user's machine
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "src")], env=_env(False),
                       stdout=subprocess.DEVNULL, check=False)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.reps} runs each"
          + (f"; against {args.against}" if args.against else ""))
    print(f"{'command':<36} {'median ms':>9} {'best ms':>8} {'cpu ms':>7} {'target':>6}  met  torch  "
          "slowest imports (cumulative ms)")
    results = {}
    for name, (cmd, slurm) in commands().items():
        envs = {tag: _env(slurm, repo) for tag, repo in trees.items()}
        runs: dict[str, list[tuple[float, float]]] = {tag: [] for tag in trees}
        for _ in range(args.reps):  # the trees side by side, repetition by repetition
            for tag in trees:
                runs[tag].append(timed(cmd, envs[tag]))
        medians = {}
        for tag in trees:
            walls, cpus = [w for w, _ in runs[tag]], [c for _, c in runs[tag]]
            med, best, cpu = statistics.median(walls), min(walls), statistics.median(cpus)
            medians[tag] = (med, cpu)
            target = TARGETS.get(name)
            top, torch = slowest_imports(cmd, envs[tag]) if name in TARGETS else ([], False)
            met = "-" if target is None else ("yes" if med < target and not torch else "NO")
            imports = ", ".join(f"{m.strip()} {us / 1e3:.0f}" for us, m in top[:4])
            label = name + (f" [{tag}]" if tag else "")
            print(f"{label:<36} {1e3 * med:>9.0f} {1e3 * best:>8.0f} {1e3 * cpu:>7.0f} "
                  f"{(f'{1e3 * target:.0f}' if target else '-'):>6}  {met:>3}  {'YES' if torch else 'no':>5}  "
                  f"{imports}")
            results[label] = {"median_s": med, "best_s": best, "cpu_median_s": cpu, "target_s": target,
                              "torch_imported": torch, "slowest_imports": [(m.strip(), us) for us, m in top]}
        if "against" in medians:
            (w, c), (wa, ca) = medians[""], medians["against"]
            print(f"{'  ratio this / against':<36} {w / wa:>9.2f} {'':>8} {c / ca:>7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
