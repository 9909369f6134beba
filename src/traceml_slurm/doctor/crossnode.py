"""Cross-node verdicts: pure functions from what the agents reported to per-node outcomes.

The coordinator (coordinator.py) runs the phases and collects the raw answers; everything that
judges them lives here, so it is unit-tested with plain dicts. Node 0 (the node whose resolved
node rank is 0) is the reference: a node that disagrees with it is the one that fails.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Optional

from .model import Outcome, failed, passed, skipped, warned
from .thresholds import (BENCH_THROTTLED, BENCH_THROTTLED_PEERS, CLOCK_SKEW_FAIL_S, CLOCK_SKEW_WARN_S,
                         CONNECT_TIMEOUT_S)

CROSS: tuple[tuple[str, str], ...] = (
    ("cross.answers", "Every node answered"),
    ("cross.node-ranks", "Node ranks unique"),
    ("cross.config-agrees", "Same launch config on every node"),
    ("cross.master-address", "Master address the same everywhere"),
    ("cross.ports-reachable", "Node 0's ports reachable"),
    ("cross.versions", "Same Python / torch / traceml"),
    ("cross.logs-shared", "Logs dir shared"),
    ("cross.clock-skew", "Clock skew between nodes"),
    ("cross.gloo-allreduce", "gloo all-reduce across nodes"),
    ("cross.aggregator", "Node 0's aggregator hears every node"),
    ("cross.nccl-bandwidth", "NCCL all-reduce bandwidth"),
    ("cross.link-bandwidth", "TCP bandwidth between the nodes (link probe)"),
    ("cross.compute-speed", "Compute speed against the other nodes (matmul, host-to-device copy)"),
)

Facts = Mapping[str, Mapping[str, Any]]


def node0_of(facts: Facts) -> Optional[str]:
    for node, f in facts.items():
        if f.get("node_rank") == 0:
            return node
    return None


def answers(expected: list[str], answered: Mapping[str, float], timeout: float,
            srun_note: Optional[str] = None) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for node in expected:
        if node in answered:
            out[node] = passed(f"answered after {answered[node]:.1f} s")
        else:
            why = f"; srun: {srun_note}" if srun_note else ""
            out[node] = failed(
                f"no answer within {timeout:.0f} s{why}",
                f"Check {node}: `srun -w {node} -N1 hostname` inside the job; a node that cannot start a step, or "
                f"whose Python/TraceML is missing, would hang or break the real run too. --timeout gives it longer.")
    for node, secs in answered.items():
        if node not in out:
            out[node] = passed(f"answered after {secs:.1f} s (not in the job's node list?)")
    return out


def node_ranks(facts: Facts, nnodes: int) -> dict[str, Outcome]:
    by_rank: dict[Any, list[str]] = defaultdict(list)
    for node, f in facts.items():
        by_rank[f.get("node_rank")].append(node)
    missing = [r for r in range(nnodes) if r not in by_rank]
    out = {}
    for node, f in facts.items():
        r = f.get("node_rank")
        if r is None:
            out[node] = failed("no node rank: the launch config does not resolve here (see slurm.launch-config)",
                               "Fix the launch config on this node first.")
        elif len(by_rank[r]) > 1:
            others = ", ".join(n for n in by_rank[r] if n != node)
            out[node] = failed(f"node rank {r}, also claimed by {others}" +
                               (f"; rank {', '.join(map(str, missing))} claimed by none" if missing else ""),
                               "Do not pass --node-rank / TRACEML_NODE_RANK (an $SLURM_NODEID expanded once in the "
                               "batch shell gives every node 0); TraceML reads SLURM_NODEID on each node.",
                               node_rank=r)
        else:
            out[node] = passed(f"node rank {r}", node_rank=r)
    return out


AGREE_KEYS = ("nnodes", "master_addr", "master_port", "aggregator_host", "aggregator_port", "run_name")


def config_agrees(facts: Facts) -> dict[str, Outcome]:
    ref_node = node0_of(facts)
    configs = {n: f.get("config") for n, f in facts.items() if f.get("config")}
    if not configs:
        return {n: skipped("the launch config resolves on no node") for n in facts}
    ref = configs.get(ref_node) if ref_node else next(iter(configs.values()))
    out = {}
    for node, f in facts.items():
        c = f.get("config")
        if not c:
            out[node] = skipped("the launch config does not resolve here")
            continue
        diff = [f"{k}={c.get(k)} (node 0: {ref.get(k)})" for k in AGREE_KEYS if c.get(k) != ref.get(k)]
        if diff:
            out[node] = failed("differs from node 0: " + ", ".join(diff),
                               "Every node must launch the same run: set these the same everywhere (export them in the "
                               "sbatch script, not per node), or let TraceML derive them from Slurm.")
        else:
            out[node] = passed(f"{c['nnodes']} nodes, master {c['master_addr']}:{c['master_port']}, "
                               f"aggregator {c['aggregator_host']}:{c['aggregator_port']}, run {c['run_name']}")
    return out


def master_address(facts: Facts) -> dict[str, Outcome]:
    ref_node = node0_of(facts)
    ref = facts[ref_node].get("master_addrs") if ref_node else None
    out = {}
    for node, f in facts.items():
        c = f.get("config")
        if not c:
            out[node] = skipped("the launch config does not resolve here")
            continue
        addrs = f.get("master_addrs") or []
        if f.get("master_error") or not addrs:
            out[node] = failed(f"{c['master_addr']} does not resolve: {f.get('master_error')}",
                               f"Make {c['master_addr']} resolvable on {node} (DNS or /etc/hosts), or pass node 0's IP "
                               f"with --master-addr.")
        elif ref and addrs[0] != ref[0]:
            out[node] = failed(f"{c['master_addr']} -> {addrs[0]}, but node 0 ({ref_node}) resolves it to {ref[0]}",
                               f"Fix name resolution on {node} (stale /etc/hosts?), or pass node 0's IP with --master-addr.",
                               addresses=addrs)
        else:
            out[node] = passed(f"{c['master_addr']} -> {addrs[0]}", addresses=addrs)
    return out


KIND_TEXT = {
    "refused": "refused (nothing listens there{hint})",
    "timeout": "timed out after {t:.0f} s (packets dropped: a firewall on node 0 or between the nodes?)",
    "no-route": "no route to host ({detail})",
    "unresolved": "does not resolve ({detail})",
    "foreign": "connected, but something else answered (another service on that port, or a NAT in between)",
    "error": "failed: {detail}",
}
KIND_FIX = {
    "refused": "Make the listener reachable: bind the aggregator to all interfaces (--aggregator-bind-host=0.0.0.0, "
               "the multi-node default) and point --aggregator-host / --master-addr at node 0.",
    "timeout": "Allow inbound TCP to node 0 on the rendezvous and aggregator ports (under Slurm derived from the job "
               "id, 61440-65535; see --print-config) from the other nodes, or pick ports the site allows with "
               "--master-port / --aggregator-port.",
    "no-route": "The nodes cannot route to node 0's address: use an address on the network the nodes share "
                "(--master-addr / --aggregator-host, or NCCL_SOCKET_IFNAME for the interface).",
    "unresolved": "Use a name every node resolves, or node 0's IP (--master-addr / --aggregator-host).",
    "foreign": "Another service answers on that port: choose other ports with --master-port / --aggregator-port.",
    "error": "See the error; check the network between the nodes.",
}


def ports_reachable(reach: Mapping[str, Mapping[str, Mapping[str, Any]]], listening: Mapping[str, str],
                    node0: str, bind_host: str) -> dict[str, Outcome]:
    """``reach[node][label] = probe result``; ``listening[label]`` is node 0's listen result."""
    out = {}
    for node, results in reach.items():
        parts, bad, fixes = [], [], []
        for label, r in sorted(results.items(), key=lambda kv: kv[0] != "rendezvous"):
            where = f"{label} {r.get('host')}:{r.get('port')}"
            if listening.get(label, "ok") != "ok":
                parts.append(f"{where} not tried ({listening[label]} on node 0, see net.ports-free)")
                continue
            st = r.get("status")
            if st == "ok":
                parts.append(f"{where} ok ({r.get('ms', 0):.0f} ms)")
                continue
            hint = f"; node 0 listens on {bind_host} only" if label == "aggregator" and bind_host not in ("0.0.0.0", "::") else ""
            text = KIND_TEXT.get(st, "failed: {detail}").format(t=CONNECT_TIMEOUT_S, detail=r.get("detail"), hint=hint)
            bad.append(f"{where} {text}")
            fixes.append(KIND_FIX.get(st, KIND_FIX["error"]))
        if bad:
            out[node] = failed("; ".join(bad + parts), fixes[0], results=dict(results))
        elif not parts:
            out[node] = skipped("nothing to probe")
        else:
            out[node] = passed("; ".join(parts), results=dict(results))
    if node0 not in out:
        out[node0] = skipped("node 0 did not probe")
    return out


def versions(facts: Facts) -> dict[str, Outcome]:
    ref_node = node0_of(facts) or next(iter(facts), None)
    ref = dict(facts[ref_node].get("versions") or {}) if ref_node else {}
    out = {}
    for node, f in facts.items():
        v = dict(f.get("versions") or {})
        line = ", ".join(f"{k} {v.get(k)}" for k in ("python", "torch", "traceml"))
        diff = [f"{k} {v.get(k)} (node 0: {ref.get(k)})" for k in ("python", "torch", "traceml")
                if v.get(k) != ref.get(k) and ref.get(k) is not None and v.get(k) is not None]
        if diff:
            out[node] = failed("differs from node 0: " + ", ".join(diff),
                               f"Use one environment on every node: install on shared storage and activate it in the "
                               f"sbatch script before srun; check PYTHONPATH and module loads on {node}.", **v)
        else:
            out[node] = passed(line, **v)
    return out


def logs_shared(writer: str, written: Mapping[str, Any], reads: Mapping[str, Mapping[str, Any]],
                summary_path: str) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    if not written.get("ok"):
        out[writer] = failed(f"node 0 cannot write {written.get('path')}: {written.get('error')}",
                             "Point --logs-dir at a writable directory on shared storage.")
        return out
    out[writer] = passed(f"wrote {written.get('path')}")
    unseen = [n for n, r in reads.items() if not r.get("match")]
    for node, r in reads.items():
        if r.get("match"):
            out[node] = passed(f"read node 0's file at {r.get('path')}")
        else:
            out[node] = warned(
                f"{r.get('path')}: {r.get('error')}: this logs dir is not the one node 0 writes to, so the summary "
                f"will be only on node 0 ({writer}:{summary_path})",
                f"Set --logs-dir (TRACEML_LOGS_DIR) to storage every node shares (e.g. the submit dir or $SCRATCH), "
                f"or copy {writer}:{summary_path} before the job ends (node-local disks may be wiped).")
    if unseen:
        out[writer] = passed(f"wrote {written.get('path')}; not seen on {', '.join(unseen)}")
    return out


def clock_skew(offsets: Mapping[str, tuple[float, float]], node0: Optional[str]) -> dict[str, Outcome]:
    """``offsets[node] = (clock offset vs the calling host, round trip)`` in seconds."""
    if not offsets:
        return {}
    ref = offsets[node0][0] if node0 in offsets else min(o for o, _ in offsets.values())
    out = {}
    for node, (off, rtt) in offsets.items():
        skew = off - ref
        line = f"{skew * 1000:+.0f} ms vs node 0 (measured to ±{rtt * 500:.0f} ms)"
        data = {"offset_s": round(off, 4), "skew_s": round(skew, 4), "rtt_s": round(rtt, 4)}
        if abs(skew) > CLOCK_SKEW_FAIL_S:
            out[node] = failed(f"{skew:+.1f} s vs node 0: the aggregator refuses hellos this far off",
                               "Sync the clocks (chrony/NTP on the nodes; ask the admins).", **data)
        elif abs(skew) > max(CLOCK_SKEW_WARN_S, rtt):
            out[node] = warned(f"{skew:+.2f} s vs node 0: cross-node timelines in the summary are off by this much",
                               "Sync the clocks (chrony/NTP on the nodes; ask the admins).", **data)
        else:
            out[node] = passed(line, **data)
    return out


def gloo_allreduce(results: Mapping[str, Mapping[str, Any]], world: int) -> dict[str, Outcome]:
    expected = world * (world + 1) / 2.0
    out = {}
    for node, r in results.items():
        if not r:
            out[node] = failed("no answer from the agent", "See cross.answers.")
            continue
        data = r.get("data") or {}
        if not r.get("ok") or "value" not in data:
            err = data.get("error") or r.get("error")
            hint = "timed out: " if r.get("timed_out") else ""
            out[node] = failed(f"{hint}{err}",
                               "torch.distributed cannot form a group across the nodes: check cross.ports-reachable, "
                               "GLOO_SOCKET_IFNAME, and that every node's hostname resolves to its network address.")
        elif abs(data["value"] - expected) > 1e-6:
            out[node] = failed(f"all-reduce returned {data['value']}, expected {expected}",
                               "A wrong sum means ranks collided: see cross.node-ranks.")
        else:
            out[node] = passed(f"sum {data['value']:.0f} = {expected:.0f} over {world} nodes "
                               f"(init {data.get('init_s', 0):.2f} s, all-reduce {data.get('allreduce_s', 0) * 1000:.1f} ms)",
                               **data)
    return out


def aggregator(started: Mapping[str, Any], sent: Mapping[str, Mapping[str, Any]],
               finished: Mapping[str, Any], ranks: Mapping[str, int], node0: str) -> dict[str, Outcome]:
    """``sent[node]`` is what each node's test rank reported; ``finished`` what node 0's aggregator
    summarised. A node passes when its records are in the summary."""
    if not started.get("ok"):
        err = started.get("error") or "no answer"
        return {n: failed(f"node 0 ({node0}) could not start the aggregator: {err}",
                          "See the message: usually the aggregator port is taken (--aggregator-port) or the bind "
                          "address is not node 0's (--aggregator-bind-host).") for n in ranks}
    in_summary = {r.get("rank"): r for r in finished.get("ranks") or []}
    out = {}
    for node, rank in ranks.items():
        r = sent.get(node) or {}
        if not r.get("ok"):
            stage, st = r.get("stage", "?"), r.get("status")
            if stage == "connect" and st in KIND_TEXT:
                text = KIND_TEXT[st].format(t=CONNECT_TIMEOUT_S, detail=r.get("detail"), hint="")
                fix = KIND_FIX[st]
            elif stage == "hello":
                text, fix = f"the aggregator refused the hello: {r.get('detail')}", (
                    "Same traceml on every node, the same --run-name, and synced clocks (see cross.versions, "
                    "cross.config-agrees, cross.clock-skew).")
            else:
                text, fix = f"{stage} failed: {r.get('detail') or r.get('error') or 'no answer from the agent'}", \
                    "See cross.ports-reachable."
            out[node] = failed(f"rank {rank} to {r.get('host', '?')}:{r.get('port', '?')}: {text}", fix)
        elif rank not in in_summary:
            out[node] = failed(f"rank {rank} sent {r.get('records')} records but node 0's summary has none from it"
                               + (f" ({finished.get('error')})" if finished.get("error") else ""),
                               "The aggregator lost them: run with -v and report it with the output.")
        else:
            got = in_summary[rank]
            out[node] = passed(f"{got.get('steps')} test step records of rank {rank} reached node 0's aggregator "
                               f"and its summary ({r.get('ms', 0):.0f} ms)")
    return out


def nccl_bandwidth(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Outcome]:
    out = {}
    for node, r in results.items():
        data = (r or {}).get("data") or {}
        if not r or not r.get("ok") or "sizes" not in data:
            out[node] = failed(f"NCCL all-reduce failed: {data.get('error') or (r or {}).get('error')}",
                               "Run with NCCL_DEBUG=INFO to see the transport; check NCCL_SOCKET_IFNAME and the "
                               "IB/RoCE setup.")
            continue
        rows = data["sizes"]
        line = ", ".join(f"{row['bytes'] >> 20} MiB: {row['busbw_gbs']:.1f} GB/s" for row in rows)
        out[node] = passed(f"bus bandwidth {line}", **data)
    return out


def link_bandwidth(probe: Mapping[str, Any], names: list[str]) -> dict[str, Outcome]:
    """The link probe between the agents (traceml_core.linkprobe), one outcome per node: its best
    send and receive rates and the transfers behind them (a node-pair table); the node the probe
    names as much slower than the others fails; with two nodes a slow direction warns on both
    ends (either could be at fault)."""
    if probe.get("error"):
        return {n: failed(f"the probe could not run: {probe['error']}",
                          "Check that the nodes reach each other over TCP (cross.ports-reachable) "
                          "and that no firewall drops connections between them.") for n in names}

    def name(i: Optional[int]) -> str:
        return names[i] if i is not None and 0 <= i < len(names) else f"node {i}"

    def rate(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.3g} GB/s"

    pairs = probe.get("pairs") or []
    slow, link = probe.get("slow_node"), probe.get("slow_link")
    out: dict[str, Outcome] = {}
    for nd in probe.get("nodes") or []:
        i = nd["node"]
        sends = ", ".join(f"to {name(p['dst'])} {rate(p['gbps'])}" + (f" ({p['error']})" if p.get("error") else "")
                          for p in pairs if p["src"] == i)
        gets = ", ".join(f"from {name(p['src'])} {rate(p['gbps'])}" for p in pairs if p["dst"] == i)
        line = f"sends {rate(nd['gbps'])} ({sends}); receives {rate(nd['recv_gbps'])} ({gets})"
        table = [p for p in pairs if i in (p["src"], p["dst"])]
        if slow and slow["node"] == i:
            verb = "sending" if slow["direction"] == "send" else "receiving"
            out[name(i)] = failed(
                f"slow link: {verb} at {rate(slow['gbps'])}, under half of the other nodes' "
                f"{rate(slow['others_gbps'])}; {line}",
                f"Check {name(i)}'s network: NIC speed and errors (ethtool, ip -s link), a rate "
                "limit or a 1 GbE fallback, and that traffic between the nodes takes the fast "
                "interface; every all-reduce of the job runs at this node's pace.",
                pairs=table, gbps=nd["gbps"], recv_gbps=nd["recv_gbps"])
        elif link and i in (link["src"], link["dst"]):
            out[name(i)] = warned(
                f"the link {name(link['src'])} -> {name(link['dst'])} runs at {rate(link['gbps'])}, "
                f"the other way at {rate(link['others_gbps'])}; {line}",
                "With two nodes either end could be at fault: check both nodes' NICs (ethtool, "
                "ip -s link) and the route between them.", pairs=table, gbps=nd["gbps"],
                recv_gbps=nd["recv_gbps"])
        elif nd["gbps"] is None and nd["recv_gbps"] is None:
            out[name(i)] = failed(f"no transfer to or from this node worked; {line}",
                                  f"Check that {name(i)} accepts TCP connections from the other nodes.",
                                  pairs=table)
        else:
            out[name(i)] = passed(line, pairs=table, gbps=nd["gbps"], recv_gbps=nd["recv_gbps"])
    for n in names:
        out.setdefault(n, skipped("not part of the probe (did not answer)"))
    return out


def skip_all(nodes: list[str], why: str) -> dict[str, Outcome]:
    return {n: skipped(why) for n in nodes} if nodes else {"job": skipped(why)}


#: the doctor's micro-benchmarks (torchprobe._bench) as node evidence: kind, unit, words. A node's
#: GPU figures are its slowest device's: a DDP step waits for the slowest GPU.
BENCH_KINDS: tuple[tuple[str, str, str], ...] = (
    ("bench_cpu", "GFLOP/s", "CPU matmul"),
    ("bench_gpu", "GFLOP/s", "GPU matmul"),
    ("h2d", "GB/s", "host-to-device copy"),
)


def bench_figures(bench: Optional[Mapping[str, Any]]) -> dict[str, Optional[float]]:
    """One node's benchmark figures by kind (None: not measured there)."""
    bench = bench or {}
    cpu = bench.get("cpu") or {}
    gpus = [g for g in bench.get("gpus") or [] if not g.get("error")]

    def slowest(key: str) -> Optional[float]:
        vals = [float(g[key]) for g in gpus if g.get(key) is not None]
        return min(vals) if vals else None

    return {"bench_cpu": float(cpu["gflops"]) if cpu.get("gflops") is not None else None,
            "bench_gpu": slowest("gflops"), "h2d": slowest("h2d_gbps")}


def cpu_quota_figures(bench: Optional[Mapping[str, Any]]) -> dict[str, Optional[float]]:
    """One node's CPU quota during its CPU matmul: ``cpu_quota`` (CPUs; None: no quota) and
    ``cpu_throttled`` (the share of the quota's periods that throttled the benchmark; None: not
    measured, no quota)."""
    cpu = (bench or {}).get("cpu") or {}
    return {"cpu_quota": cpu.get("quota_cpus"), "cpu_throttled": cpu.get("throttled")}


def bench_observations(figures: Mapping[str, Mapping[str, Optional[float]]],
                       quotas: Optional[Mapping[str, Mapping[str, Optional[float]]]] = None) -> list:
    """Each node's figures against the other nodes' of this job (core's rule for rates measured on
    each node, ``slower_than_peers``): ``figures[node][kind]``. The same function judges the
    doctor's check and the evidence the node store keeps (doctor/nodehealth.py).

    ``quotas[node]`` (:func:`cpu_quota_figures`): a node whose own cgroup's CPU quota throttled its
    CPU matmul in most periods, where the other nodes' did not, is worse than its peers whatever
    the ratio: the cause is measured (a limit only this node's job steps have), while the ratio
    depends on how loaded the peers' cores are (a fifth of a core is no slower than peers that
    share theirs with four other processes)."""
    from dataclasses import replace

    from traceml_core.selftest import BENCH_SLOW_FRACTION, median, slower_than_peers

    out = []
    for kind, unit, words in BENCH_KINDS:
        values = {n: f.get(kind) for n, f in figures.items()}
        if sum(v is not None for v in values.values()) >= 2:
            out += slower_than_peers(values, kind, unit, words, BENCH_SLOW_FRACTION)
    thr = {n: (q or {}).get("cpu_throttled") for n, q in (quotas or {}).items()}
    for i, o in enumerate(out):
        mine = thr.get(o.host)
        if o.kind != "bench_cpu" or mine is None or mine < BENCH_THROTTLED or not (o.value or 0) < (o.peers or 0):
            continue
        others = median([t or 0.0 for n, t in thr.items() if n != o.host and n in figures]) or 0.0
        if others >= BENCH_THROTTLED_PEERS:
            continue   # the same limit on every node: the job's, not this node's
        quota = (quotas or {}).get(o.host, {}).get("cpu_quota")
        limit = f" (a limit of {quota:.2g} CPUs)" if quota else ""
        out[i] = replace(o, bad=True, note=f"{o.note}; its cgroup's CPU quota{limit} throttled it in "
                                            f"{mine:.0%} of the periods")
    return out


def compute_speed(bench: Mapping[str, Optional[Mapping[str, Any]]]) -> dict[str, Outcome]:
    """``bench[node]``: what the node's torch child measured (torchprobe's ``bench``; None: it did
    not run). A node far slower than its peers warns: one run is a hint (the load of the moment
    may be the cause), the node store keeps it and ``traceml slurm nodes`` judges repetitions."""
    figures = {n: bench_figures(b) for n, b in bench.items()}
    quotas = {n: cpu_quota_figures(b) for n, b in bench.items()}
    obs: dict[str, list] = defaultdict(list)
    for o in bench_observations(figures, quotas):
        obs[o.host].append(o)
    out: dict[str, Outcome] = {}
    for node, b in bench.items():
        f = figures[node]
        data = {**f, **quotas[node], "threads": ((b or {}).get("cpu") or {}).get("threads"),
                "gpus": list((b or {}).get("gpus") or [])}
        if b is None or all(v is None for v in f.values()):
            why = ((b or {}).get("cpu") or {}).get("error") or "torch did not run the benchmarks here (see sw.torch)"
            out[node] = skipped(f"not measured: {why}", **data)
            continue
        mine = obs.get(node, [])
        parts = [o.note for o in mine] or [f"{words} {f[kind]:.3g} {unit}" for kind, unit, words in BENCH_KINDS
                                           if f.get(kind) is not None]
        threads = data["threads"]
        line = "; ".join(parts) + (f" (CPU: {threads} thread{'s' if threads != 1 else ''})" if threads else "")
        bad = [o for o in mine if o.bad]
        if bad:
            out[node] = warned(
                f"slower than the other nodes: {'; '.join(o.note for o in bad)}"
                + (f"; {'; '.join(o.note for o in mine if not o.bad)}" if len(bad) < len(mine) else ""),
                f"Every DDP step waits for the slowest node. Check {node} for a CPU limit (cgroup cpu.max), "
                "other processes on it, or GPU throttling (nvidia-smi -q -d PERFORMANCE); one slow run may be a "
                "moment's load: `traceml slurm nodes` keeps this across your jobs and says when to exclude it.",
                **data)
        elif not mine:
            out[node] = passed(f"{line}: nothing to compare with (no other node measured)", **data)
        else:
            out[node] = passed(line, **data)
    return out
