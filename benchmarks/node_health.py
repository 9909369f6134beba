"""The node health rule's false-exclude and miss rates, from real 3-node jobs on the local Slurm cluster.

Run inside the dev cluster's login namespace (it needs the cluster's three nodes and root for ``tc``):

    scripts/dev-cluster exec .venv/bin/python benchmarks/node_health.py [--clean 10] [--slow 3] [--doctor] [--cgroup]

One user's store, one job after the other (each a short DDP run of tests/unit/scripts/comm_train.py
under ``traceml run``, the link probe before it; with ``--doctor`` each a ``traceml slurm doctor``
over the three nodes instead: its link probe and its micro-benchmarks), in this order:

1. ``--clean`` clean jobs: no node is slow, the machine's own load is the only disturbance;
2. one job with node3's egress at 100 Mbit/s (``tc tbf``; with ``--cgroup`` instead node3's slurmd,
   and so its job steps, under a CPU quota of a tenth of a core: tests/slurm/cluster.py's
   ``cpu_limited``, and a training step that is mostly the ranks' own compute), then two clean
   jobs: a node slow in one job only;
3. ``--slow`` jobs with node3 slow in every one.

After each job the script reads ``traceml slurm nodes --json`` (what the next summary would say)
and prints, per job, which hosts one run found worse than their peers and which the rule excludes.
Then the figures:

* **one-run false alarms**: observations that found a healthy host (node1, node2 in every job,
  node3 in the clean jobs) worse than its peers, per host and job: what excluding on one run
  would have cost;
* **false-exclude rate**: of the rule's judgements of a host that was not slow in its last two
  jobs (after each job, every host), the share that excluded it;
* **miss rate**: of the judgements of node3 when it was slow in its last two jobs or more (what
  the rule is there to catch), the share that did not exclude it; plus the jobs it took.

``--rank-following N``: N jobs in which no node is slow but rank 1 is, because of what it does
(benchmarks/rank_following_train.py: its batches 1.6x the others', or an evaluation only it runs
between steps, alternately), and the placements change from job to job (2- and 3-node jobs on
different nodes, so rank 1 lands on node2, node3 ...). Every exclude is a false one. Printed per
job: where rank 1 ran, what the run's verdict was, which hosts one run found worse, and what the
rule excludes, beside what it would exclude if it ignored where the ranks ran (the rule before
issue 31: a slow rank's compute held against its host whatever rank it was).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))

from cluster import Cluster  # noqa: E402

SCRIPT = REPO / "tests" / "unit" / "scripts" / "comm_train.py"
BIN = str(Path(sys.executable).parent)
SLOW_NODE = "node3"
RATE = "100mbit"
JOB = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {SCRIPT}
"""
DOCTOR_JOB = """#!/bin/bash
traceml slurm doctor --json{} > doctor.json 2> doctor.err || true
"""
#: --cgroup --doctor: torch imports at a tenth of a core take longer than the default 15 s; the gloo
#: all-reduce (one more import of torch) is not what is measured
DOCTOR_CPU_ARGS = " --timeout 60 --ignore cross.gloo-allreduce"
TRAIN = {"COMM_MODE": "ddp", "COMM_LAYERS": "1", "COMM_WIDTH": "1024", "COMM_BATCH": "8", "COMM_STEPS": "26"}
#: --cgroup: node3's CPU quota (a tenth of a core: a fifth is no slower than a peer's share of this
#: machine's two loaded cores), and a step of mostly the ranks' own compute
#: (tests/slurm/test_node_cpu_limit_slurm.py)
CPU_QUOTA_US = 10_000
TRAIN_CPU = {"COMM_MODE": "ddp", "COMM_LAYERS": "1", "COMM_WIDTH": "512", "COMM_BATCH": "1024", "COMM_STEPS": "45"}


def run_job(cluster: Cluster, work: Path, store: Path, n: int, slow: bool, doctor: bool = False,
            cgroup: bool = False) -> dict:
    logs = work / f"job{n:02d}"
    logs.mkdir()
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1",
               TRACEML_LOGS_DIR=str(logs), TRACEML_NODE_STORE=str(store), **(TRAIN_CPU if cgroup else TRAIN))
    env.pop("TRACEML_RUN_INFO", None)
    with ExitStack() as stack:
        if slow and cgroup:
            stack.enter_context(cluster.cpu_limited(SLOW_NODE, CPU_QUOTA_US))
        elif slow:
            cluster.on_node(SLOW_NODE, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", RATE,
                            "burst", "32kbit", "latency", "400ms")
            stack.callback(cluster.on_node, SLOW_NODE, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        if doctor:
            job, state, out = cluster.run_job(DOCTOR_JOB.format(DOCTOR_CPU_ARGS if cgroup else ""), "--nodes=3",
                                              "--ntasks-per-node=1", "--time=30", timeout=300, env=env, cwd=logs)
        else:
            job, state, out = cluster.run_job(JOB, "--nodes=3", "--ntasks-per-node=1", "--gres=gpu:1",
                                              "--cpus-per-task=1", timeout=300, env=env)
    if state != "COMPLETED":
        raise SystemExit(f"job {job} ended {state}:\n{out[-3000:]}")
    got = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    nodes = json.loads(got.stdout)
    summary = json.loads((logs / "doctor.json").read_text() if doctor
                         else next(logs.glob("*/final_summary.json")).read_text())
    return {"job": job, "slow": slow, "nodes": nodes, "lines": (summary.get("next_job") or {}).get("lines", [])}


RF_SCRIPT = REPO / "benchmarks" / "rank_following_train.py"
RF_JOB = f"""#!/bin/bash
export TRACEML_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
srun --kill-on-bad-exit=1 traceml run {RF_SCRIPT}
"""
#: the allocations of --rank-following, in turn: rank 1 is on the second node of each
PLACEMENTS = ("node1,node2", "node1,node3", "node2,node3", "node1,node2,node3", "node1,node3", "node2,node3")


def run_rank_following(cluster: Cluster, work: Path, store: Path, n: int, nodes: str, cause: str) -> dict:
    logs = work / f"job{n:02d}"
    logs.mkdir()
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1",
               TRACEML_LOGS_DIR=str(logs), TRACEML_NODE_STORE=str(store), RF_CAUSE=cause)
    env.pop("TRACEML_RUN_INFO", None)
    k = nodes.count(",") + 1
    job, state, out = cluster.run_job(RF_JOB, f"--nodes={k}", "-w", nodes, "--ntasks-per-node=1", "--gres=gpu:1",
                                      "--cpus-per-task=1", timeout=300, env=env)
    if state != "COMPLETED":
        raise SystemExit(f"job {job} ended {state}:\n{out[-3000:]}")
    summary = json.loads(next(logs.glob("*/final_summary.json")).read_text())
    verdicts = [summary["verdict"]] + summary.get("other_verdicts", [])
    slow = next((v for v in verdicts if (v.get("culprit") or {}).get("rank") == 1), None)
    got = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "nodes", "--json"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return {"job": job, "nodes": nodes, "rank1": nodes.split(",")[1], "cause": cause,
            "verdict": f"{slow['kind']} ({slow['severity']})" if slow else "-",
            "excluded": set(json.loads(got.stdout)["exclude"]), "ignoring": excluded_ignoring_placement(store)}


def excluded_ignoring_placement(store: Path) -> set[str]:
    """What the rule excludes when a slow rank's evidence is held against its host whatever rank
    it was (its ranks dropped: every observation counts)."""
    from dataclasses import replace

    from traceml_slurm.nodes.health import judge
    from traceml_slurm.nodes.store import NodeStore

    records, _ = NodeStore(store).records(None)
    records = [replace(r, observations=tuple(replace(o, ranks=()) for o in r.observations)) for r in records]
    return {h.host for h in judge(records) if h.exclude}


def rank_following(cluster: Cluster, jobs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="traceml-rankfollow-", dir="/tmp"))
    store = work / "nodes.sqlite"
    print(f"node_health --rank-following: {jobs} jobs, no node slow, rank 1 slow by its own work (batches 1.6x, "
          f"or an evaluation only it runs), placements changing; store {store}; load {os.getloadavg()[0]:.1f}",
          flush=True)
    t0 = time.monotonic()
    false_new = false_old = checks = 0
    for n in range(1, jobs + 1):
        nodes = PLACEMENTS[(n - 1) % len(PLACEMENTS)]
        cause = "batch" if n % 2 else "eval"
        res = run_rank_following(cluster, work, store, n, nodes, cause)
        res["bad"] = bad_in(store, res["job"])
        hosts = {"node1", "node2", "node3"}
        checks += len(hosts)
        false_new += len(res["excluded"])
        false_old += len(res["ignoring"])
        print(f"  job {n:2d} ({res['job']}) on {nodes:17s} rank 1 on {res['rank1']} ({cause:5s}): verdict "
              f"{res['verdict']:22s} one run found worse: {_bad_text(res['bad']) or '-':16s} excluded: "
              f"{','.join(sorted(res['excluded'])) or '-':6s} (ignoring placement: "
              f"{','.join(sorted(res['ignoring'])) or '-'})  load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"false excludes (no host is slow): {false_new} of {checks} judgements with the placement rule; "
          f"{false_old} of {checks} if a slow rank's evidence were held against its host whatever rank it was")
    print(f"{jobs} jobs in {time.monotonic() - t0:.0f} s; load {os.getloadavg()[0]:.1f} at the end; work {work}")


def bad_in(store: Path, job: str) -> dict[str, set[str]]:
    """Hosts that this one job found worse than their peers, with the kinds (straight from the store)."""
    import sqlite3

    with sqlite3.connect(str(store)) as conn:
        rows = conn.execute("SELECT DISTINCT o.host, o.kind FROM observations o JOIN records r ON r.id = o.record "
                            "WHERE r.job_id = ? AND o.bad = 1", (job,)).fetchall()
    out: dict[str, set[str]] = {}
    for host, kind in rows:
        out.setdefault(host, set()).add(kind)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clean", type=int, default=10, help="clean jobs first (default 10)")
    ap.add_argument("--slow", type=int, default=3, help="jobs with node3 slow in every one, last (default 3)")
    ap.add_argument("--doctor", action="store_true", help="each job a `traceml slurm doctor` (link probe and "
                    "micro-benchmarks), not a training run")
    ap.add_argument("--cgroup", action="store_true", help="node3 slow by a CPU quota of a tenth of a core on its "
                    "slurmd's cgroup (v1 cpu), not by its link")
    ap.add_argument("--rank-following", type=int, default=0, metavar="N",
                    help="instead: N jobs with no node slow, rank 1 slow by its own work, placements changing")
    args = ap.parse_args()
    cluster, why = Cluster.detect()
    if cluster is None:
        raise SystemExit(f"node_health.py: {why}")
    if args.rank_following:
        rank_following(cluster, args.rank_following)
        return
    work = Path(tempfile.mkdtemp(prefix="traceml-nodehealth-", dir="/tmp"))
    store = work / "nodes.sqlite"
    plan = [False] * args.clean + [True, False, False] + [True] * args.slow
    print(f"node_health: {len(plan)} {'doctor ' if args.doctor else ''}jobs ({args.clean} clean; node3 slow "
          f"({'CPU quota' if args.cgroup else 'link'}) in one, then 2 clean; "
          f"node3 slow in {args.slow}), store {store}; load {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    history: list[dict] = []
    for n, slow in enumerate(plan, 1):
        res = run_job(cluster, work, store, n, slow, args.doctor, args.cgroup)
        res["bad"] = bad_in(store, res["job"])
        res["excluded"] = set(res["nodes"]["exclude"])
        history.append(res)
        print(f"  job {n:2d} ({res['job']}): node3 {'SLOW ' if slow else 'clean'}  one run found worse: "
              f"{_bad_text(res['bad']) or '-':14s} excluded: {','.join(sorted(res['excluded'])) or '-':8s} "
              f"next_job: {res['lines'] or '-'}  load {os.getloadavg()[0]:.1f}", flush=True)
    hosts = sorted({h["host"] for res in history for h in res["nodes"]["nodes"]})
    alarms = checks = 0
    by_kind: dict[str, int] = {}
    false_ex = false_n = miss = miss_n = 0
    first_excluded = None
    for i, res in enumerate(history):
        for host in hosts:
            slow_now = host == SLOW_NODE and res["slow"]
            if not slow_now:
                checks += 1
                alarms += host in res["bad"]
                for kind in res["bad"].get(host, ()):
                    by_kind[kind] = by_kind.get(kind, 0) + 1
            last2 = host == SLOW_NODE and i >= 1 and history[i]["slow"] and history[i - 1]["slow"]
            slow_recent = host == SLOW_NODE and (res["slow"] or (i >= 1 and history[i - 1]["slow"]))
            if last2:
                miss_n += 1
                miss += host not in res["excluded"]
            elif not slow_recent:
                false_n += 1
                false_ex += host in res["excluded"]
        if first_excluded is None and i >= len(plan) - args.slow and SLOW_NODE in res["excluded"]:
            first_excluded = i - (len(plan) - args.slow) + 1

    def rate(k: int, n: int) -> str:
        return f"{k}/{n} = {k / n:.0%}" if n else "not measured (no such judgement)"

    print(f"one-run false alarms (a healthy host found worse than its peers in one job): {rate(alarms, checks)}"
          + (f" (by kind: {', '.join(f'{k} {v}' for k, v in sorted(by_kind.items()))})" if by_kind else ""))
    print(f"false-exclude rate (host not slow in its last 2 jobs, excluded): {rate(false_ex, false_n)}")
    print(f"miss rate (node3 slow in its last 2 jobs or more, not excluded): {rate(miss, miss_n)}")
    print(f"node3 excluded after {first_excluded} of the last {args.slow} slow job(s)" if first_excluded
          else f"node3 not excluded within the last {args.slow} slow job(s)")
    print(f"{len(plan)} jobs in {time.monotonic() - t0:.0f} s; load {os.getloadavg()[0]:.1f} at the end; work {work}")


def _bad_text(bad: dict[str, set[str]]) -> str:
    return ",".join(f"{h}({'+'.join(sorted(k))})" for h, k in sorted(bad.items()))


if __name__ == "__main__":
    main()
