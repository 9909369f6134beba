"""CLI latency: wall time of ``traceml --help`` and ``traceml run --print-config``, and what they import.

Each command runs ``--reps`` times as a fresh process (what a user waits for); the median and the
best are printed, next to a bare ``python -c pass`` for the interpreter's own start-up. The
print-config path is timed outside a job and inside a Slurm step (the environment of a real step,
from tests/fixtures/slurm_env), where the Slurm plugin parses the job's variables. Then
``python -X importtime`` lists the slowest imports of each path and checks that torch is not
among them.

Targets (issue 8): ``--help`` under 150 ms, ``run --print-config`` under 300 ms, no torch import.

    python benchmarks/cli_latency.py [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_FIXTURE = REPO / "tests" / "fixtures" / "slurm_env" / "22.05" / "gpn_step_node0.json"
TARGETS = {"help": 0.150, "print-config": 0.300, "print-config (Slurm step)": 0.300}


def _env(slurm: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TRACEML_"))}
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
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
        "print-config (Slurm step)": (cli + ["run", "--print-config", "train.py"], True),
    }


def wall(cmd: list[str], env: dict[str, str], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return out


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
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    results = {}
    print(f"{'command':<28} {'median ms':>9} {'best ms':>8} {'target ms':>9}  met  torch  slowest imports (cumulative ms)")
    for name, (cmd, slurm) in commands().items():
        env = _env(slurm)
        times = wall(cmd, env, args.reps)
        med, best = statistics.median(times), min(times)
        target = TARGETS.get(name)
        top, torch = slowest_imports(cmd, env) if name in TARGETS else ([], False)
        met = "-" if target is None else ("yes" if med < target and not torch else "NO")
        imports = ", ".join(f"{m.strip()} {us / 1e3:.0f}" for us, m in top[:4])
        print(f"{name:<28} {1e3 * med:>9.0f} {1e3 * best:>8.0f} "
              f"{(f'{1e3 * target:.0f}' if target else '-'):>9}  {met:>3}  {'YES' if torch else 'no':>5}  {imports}")
        results[name] = {"median_s": med, "best_s": best, "target_s": target, "torch_imported": torch,
                         "slowest_imports": [(m.strip(), us) for us, m in top]}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
