"""Seconds from a hang's start to its report in the job's log, and the controls that must never
get one (issue 32).

Every case is a real `traceml run` of gloo DDP ranks (tests/faults/faulty_train.py) with default
settings (no --hang-report-after), a fault injected at step 40 of rank 1. The start of a hang is the
ranks' own truth: the time the faulty rank wrote just before its fault, or the time this script
stopped a rank or cut a link. The report's time is when its first line appeared in the launcher's
log. Printed: one row per case with the seconds, the rule that fired (state or the time backstop),
the ranks named, and the median and maximum against the targets (median <= 30 s, none over 60 s),
then the controls (each must end without a hang report).

Cases on one node (2 ranks):
  mismatch      rank 1 enters an all_reduce rank 0 never enters
  blocked       rank 1 blocks in its own code (a deadlock)
  stopped       rank 1 is SIGSTOPped
Cases on 2 nodes of the dev cluster (1 rank each; run inside it: scripts/dev-cluster exec):
  all-stuck     the ranks' own traffic between the nodes is dropped (the relays still reach
                node 0): both ranks wait in the gradient all-reduce, neither progresses
  link-cut      node 2's network link goes down: nothing is heard from its rank
Controls (--control-s seconds each, 300 by default):
  save          rank 0 saves for the whole time (serialising and writing) while rank 1 waits
  evaluation    every rank evaluates (real compute) for the whole time
  first-step    the first step comes after that long (compilation, data set-up)

    PYTHONPATH=src python benchmarks/hang_latency.py --only mismatch,blocked,stopped --control-s 60
    scripts/dev-cluster exec .venv/bin/python benchmarks/hang_latency.py       # everything
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "faults"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "slurm"))
sys.path.insert(0, str(REPO / "src"))

from harness import SCRIPT, Launch, Progress  # noqa: E402

NEEDLE = "hang report:"
STEADY = ["--steps", "100000", "--step-ms", "10", "--fault-rank", "1", "--fault-step", "40", "--settle", "0"]
TARGET_MEDIAN_S, TARGET_MAX_S = 30.0, 60.0


def _wait_for(read, needle: str, bound_s: float, alive=lambda: True) -> Optional[float]:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if needle in read():
            return time.time()
        if not alive():
            return None
        time.sleep(0.05)
    return None


def _summary_hang(run_dir: Path) -> Optional[dict]:
    p = run_dir / "final_summary.json"
    return json.loads(p.read_text()).get("hang") if p.is_file() else None


def single_node(tmp: Path, case: str) -> dict:
    args = STEADY + (["--fault", "hang-in-collective"] if case == "mismatch" else
                     ["--fault", "hang"] if case == "blocked" else [])
    launch = Launch(tmp / case, args, run_name=case)
    try:
        start: Optional[float] = None
        if case == "stopped":
            deadline = time.monotonic() + 180
            while Progress.read(launch.progress_dir).done(1) < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
            pid = Progress.read(launch.progress_dir).pids[1]
            start = time.time()
            os.kill(pid, signal.SIGSTOP)
        logged = _wait_for(launch.stderr_now, NEEDLE, 180, lambda: launch.proc.poll() is None)
        if case == "stopped":
            os.kill(pid, signal.SIGCONT)
        launch.proc.send_signal(signal.SIGTERM)
        r = launch.wait(120)
    except BaseException:
        launch.proc.kill()
        raise
    start = start if start is not None else r.progress.fault_at.get(1)
    h = _summary_hang(r.run_dir) or {}
    return {"case": case, "seconds": None if logged is None or start is None else logged - start,
            "rule": (h.get("rule") or {}).get("kind", "-") + "/" + str((h.get("rule") or {}).get("name", "-")),
            "named": h.get("culprits"), "finding": h.get("finding", "")}


def control(tmp: Path, case: str, seconds: float) -> dict:
    args = {"save": ["--steps", "80", "--step-ms", "10", "--fault", "long-save", "--fault-rank", "0",
                     "--fault-step", "40", "--settle", "0", "--fault-s", str(seconds)],
            "evaluation": ["--steps", "80", "--step-ms", "10", "--pause-at", "40", "--pause-s", str(seconds),
                           "--pause-work"],
            "first-step": ["--steps", "40", "--step-ms", "10", "--first-step-s", str(seconds)]}[case]
    r = Launch(tmp / case, args, run_name=case).wait(seconds + 300)
    h = _summary_hang(r.run_dir)
    working = sum(1 for ln in r.err.splitlines() if "(working:" in ln)
    return {"case": case, "code": r.code, "hang": h is not None or NEEDLE in r.err, "working_lines": working}


def on_cluster(tmp: Path, case: str) -> dict:
    from cluster import Cluster
    from e2e import job_env

    cluster, why = Cluster.detect()
    if cluster is None:
        return {"case": case, "seconds": None, "rule": "-", "named": None, "finding": f"skipped: {why}"}
    progress = tmp / case / "progress"
    progress.mkdir(parents=True)
    agg_port = 29931
    body = ("export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')\n"
            f"srun traceml run --run-name={case} --aggregator-port={agg_port} {SCRIPT} "
            "--steps 100000 --step-ms 10\n")
    job = cluster.submit(body, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--cpus-per-task=1",
                         env=job_env(tmp / case, FAULT_PROGRESS_DIR=str(progress)))
    node1, node2 = cluster.nodes[0], cluster.nodes[1]
    undo = []
    try:
        deadline = time.monotonic() + 240
        while Progress.read(progress).done(1) < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        if case == "all-stuck":   # the ranks' traffic dropped, the relay's link to node 0 kept
            ip1 = cluster.node_ip(node1)
            nft = ["nft", "-f", "-"]
            rules = (f"table inet tmlhang {{\n chain o {{ type filter hook output priority 0; "
                     f"ip daddr {ip1} tcp dport != {agg_port} drop; }}\n chain i {{ type filter hook input "
                     f"priority 0; ip saddr {ip1} tcp sport != {agg_port} drop; }}\n}}\n")
            subprocess.run(["ip", "netns", "exec", cluster.node_netns(node2), *nft], input=rules, text=True,
                           check=True)
            undo.append(["nft", "delete", "table", "inet", "tmlhang"])
        else:
            cluster.on_node(node2, "ip", "link", "set", "eth0", "down")
            undo.append(["ip", "link", "set", "eth0", "up"])
        start = time.time()
        logged = _wait_for(lambda: cluster.output(job), NEEDLE, 180)
    finally:
        for cmd in undo:
            cluster.on_node(node2, *cmd, check=False)
        cluster.run("scancel", job, check=False)
    cluster.wait(job, timeout=180)
    h = _summary_hang(tmp / case / "logs" / case) or {}
    return {"case": case, "seconds": None if logged is None else logged - start,
            "rule": (h.get("rule") or {}).get("kind", "-") + "/" + str((h.get("rule") or {}).get("name", "-")),
            "named": h.get("culprits"), "finding": h.get("finding", "")}


class _kept:
    def __init__(self, path: str) -> None:
        self.path = path
        Path(path).mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated cases and controls")
    ap.add_argument("--control-s", type=float, default=300.0)
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="keep the runs' directories here")
    args = ap.parse_args()
    hangs = ["mismatch", "blocked", "stopped", "all-stuck", "link-cut"]
    controls = ["save", "evaluation", "first-step"]
    want = set(args.only.split(",")) if args.only else set(hangs + controls)
    print(f"hang latency, default settings (load average {os.getloadavg()[0]:.1f})")
    rows, ctl = [], []
    with (tempfile.TemporaryDirectory(prefix="hang-latency-") if not args.keep
          else _kept(args.keep)) as tmp:
        for case in [c for c in hangs if c in want]:
            row = (single_node if case in ("mismatch", "blocked", "stopped") else on_cluster)(Path(tmp), case)
            rows.append(row)
            secs = "no report" if row["seconds"] is None else f"{row['seconds']:.1f} s"
            print(f"  {case:<10} {secs:>10}  rule {row['rule']:<18} named {row['named']}  {row['finding'][:90]}",
                  flush=True)
        for case in [c for c in controls if c in want]:
            c = control(Path(tmp), case, args.control_s)
            ctl.append(c)
            print(f"  control {case:<10} {args.control_s:.0f} s: exit {c['code']}, "
                  f"{'HANG REPORTED' if c['hang'] else 'no hang'}, {c['working_lines']} 'working' line(s)",
                  flush=True)
    got = [r["seconds"] for r in rows if r["seconds"] is not None]
    if got:
        med, mx = statistics.median(got), max(got)
        print(f"\n{len(got)} of {len(rows)} hangs reported: median {med:.1f} s (target <= {TARGET_MEDIAN_S:g}: "
              f"{'met' if med <= TARGET_MEDIAN_S else 'NOT MET'}), max {mx:.1f} s (target <= {TARGET_MAX_S:g}: "
              f"{'met' if mx <= TARGET_MAX_S and len(got) == len(rows) else 'NOT MET'})")
    if ctl:
        false = sum(1 for c in ctl if c["hang"])
        print(f"controls: {false} false hang(s) in {len(ctl)} (target 0: {'met' if not false else 'NOT MET'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"hangs": rows, "controls": ctl}, indent=1))


if __name__ == "__main__":
    main()
