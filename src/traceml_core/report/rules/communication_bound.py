"""COMMUNICATION-BOUND: every rank waits for communication after its own compute, even the last
to arrive.

How it decides. Every rank waits at the gradient all-reduce for the last one to arrive; only the
last one's wait is the communication itself. So it is judged on each rank's 10th percentile of
its per-step wait, the least over ranks: on a slow link every step waits for the bytes to move,
so even that is long; ranks that take turns at arriving last (jitter on a busy CPU, no slow link)
each wait little in a good share of steps, however long their mean wait. A warning from 15 % of
the step and 1 ms, critical from 35 % and 5 ms. The bandwidth achieved, the message sizes (small
ones are latency-bound: fewer calls, not a faster link) and, where the link probe named one, the
slow node or direction come with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .. import thresholds as T
from ..stats import median
from .base import Evidence, Finding, Run, mean_ms, rounded, severity

KIND = "communication_bound"
THRESHOLDS = ("COMM_FRACTION_WARN", "COMM_FRACTION_CRIT", "COMM_FLOOR_MS", "COMM_CRIT_FLOOR_MS",
              "COMM_WAIT_QUANTILE", "COMM_LOW_OVERLAP", "COMM_SMALL_BYTES", "COMM_CPU_BUSY_PCT")


@dataclass
class CommEvidence(Evidence):
    comm_fraction: float
    comm_ms: float
    comm_quantile: float
    comm_median_ms: float
    step_ms: float
    least_waiting_rank: int
    busbw_gbps: Optional[float] = None
    algbw_gbps: Optional[float] = None
    bytes_per_step: Optional[float] = None
    calls_per_step: Optional[float] = None
    bytes_per_call: Optional[float] = None
    overlap_fraction: Optional[float] = None
    small_messages: bool = False
    slow_node: Optional[int] = None
    probe_slow: Optional[dict[str, Any]] = None
    probe_link: Optional[dict[str, Any]] = None
    nnodes: int = 1
    cpu_busy_pct: Optional[float] = None
    device: str = "unknown"
    explained_by: Optional[str] = None


def detect(run: Run) -> Optional[Finding]:
    rows = []
    for r in run.live:
        ph, step = r.phases.get("comm"), mean_ms(r, "step")
        if ph is None or not step:
            continue
        low = ph.p10_ms if ph.p10_ms is not None else ph.steady_mean_ms
        if low is not None:
            rows.append((low / step, low, step, r))
    if len(rows) < 2:
        return None
    frac, wait, step, least = min(rows, key=lambda x: x[0])
    sev = severity(frac, wait, T.COMM_FRACTION_WARN, T.COMM_FRACTION_CRIT, T.COMM_FLOOR_MS,
                   T.COMM_CRIT_FLOOR_MS)
    if sev is None:
        return None
    ctx = run.ctx
    comm = ctx.communication
    mean_wait = median([mean_ms(r, "comm") or 0.0 for _, _, _, r in rows]) or 0.0

    def med(key: str) -> Optional[float]:
        return comm.median(key) if comm else None

    nbytes, calls = med("bytes_per_step"), med("calls_per_step")
    per_call = nbytes / calls if nbytes is not None and calls else None
    probe = (comm.probe if comm else None) or {}
    slow = probe.get("slow_node")
    return Finding(
        KIND, sev, ({"rank": None, "node": slow["node"], "host": slow.get("host")} if slow else None),
        CommEvidence(
            comm_fraction=round(frac, 4), comm_ms=round(wait, 4), comm_quantile=T.COMM_WAIT_QUANTILE,
            comm_median_ms=round(mean_wait, 4), step_ms=round(step, 4), least_waiting_rank=least.rank,
            busbw_gbps=med("busbw_gbps"), algbw_gbps=med("algbw_gbps"), bytes_per_step=nbytes,
            calls_per_step=calls, bytes_per_call=per_call, overlap_fraction=med("overlap_fraction"),
            small_messages=per_call is not None and per_call < T.COMM_SMALL_BYTES,
            slow_node=slow["node"] if slow else None, probe_slow=slow or None,
            probe_link=probe.get("slow_link") or None, nnodes=ctx.nnodes or 1,
            cpu_busy_pct=rounded(ctx.cpu_busy_pct, 1), device=ctx.device))


def _mb(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes / 1e6:.3g} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.3g} kB"


def say(ev: CommEvidence) -> tuple[str, str]:
    gpu, cpu = ev.device == "cuda", ev.device == "cpu"
    busbw, algbw, small = ev.busbw_gbps, ev.algbw_gbps, ev.small_messages
    why = (f"every rank waits for communication after its own compute, even the last to arrive: at "
           f"least {ev.comm_ms:.1f} ms of its {ev.step_ms:.1f} ms step in 9 of 10 steps "
           f"({ev.comm_fraction:.0%}; mean wait of the median rank {ev.comm_median_ms:.1f} ms)")
    if busbw is not None and algbw is not None:
        why += (f"; {_mb(ev.bytes_per_step)} per step in {ev.calls_per_step:g} collective(s) at "
                f"{busbw:.3g} GB/s bus bandwidth ({algbw:.3g} GB/s algorithm)")
        if small:
            why += " - small messages, so latency rather than bandwidth sets their time"
    slow, link = ev.probe_slow, ev.probe_link
    advice = []
    if ev.explained_by == "cpu_oversubscribed":
        why += "; the ranks ask for more threads than their node has cores (see the CPU verdict), so gloo's threads wait for a core too"
        advice.append("first give the ranks no more threads than cores (see the CPU verdict)")
    if slow:
        verb = "sending" if slow.get("direction") == "send" else "receiving"
        why += (f"; the link probe measured node {slow['node']} ({slow.get('host') or '?'}) {verb} at "
                f"{slow['gbps']:.3g} GB/s against {slow['others_gbps']:.3g} GB/s for the other nodes")
        advice.append(f"fix node {slow['node']} ({slow.get('host') or '?'})'s link first: check its NIC "
                      "speed and errors (ethtool, ip -s link) and that its traffic takes the fast "
                      "interface")
    elif link:
        why += (f"; the link probe measured node {link['src']} ({link.get('src_host') or '?'}) -> node "
                f"{link['dst']} ({link.get('dst_host') or '?'}) at {link['gbps']:.3g} GB/s, "
                f"{link['others_gbps']:.3g} GB/s the other way")
        advice.append(f"check the link between node {link['src']} and node {link['dst']} first (either "
                      "end: NIC speed and errors with ethtool / ip -s link, the interface its traffic "
                      "takes)")
    compress = "bf16_compress_hook" if gpu else "fp16_compress_hook"
    multi = ev.nnodes > 1
    if small:
        advice.append(f"the collectives are small ({_mb(ev.bytes_per_call)} each): call them less "
                      "often - accumulate gradients over k micro-batches under DDP's no_sync() (one "
                      "all-reduce per k)")
        busy = ev.cpu_busy_pct
        if cpu and busy is not None and busy >= T.COMM_CPU_BUSY_PCT:
            advice.append(f"the CPUs were {busy:.0f}% busy, so gloo's threads also wait for a "
                          "core: fewer ranks or threads per node (OMP_NUM_THREADS) leave them one")
    else:
        if multi and gpu:
            advice.append("check that NCCL uses InfiniBand/RoCE rather than TCP sockets "
                          "(NCCL_DEBUG=INFO logs NET/IB, not NET/Socket) and the fast interface "
                          "(NCCL_SOCKET_IFNAME, NCCL_IB_HCA)")
        elif multi and cpu:
            advice.append("gloo sends over TCP: point GLOO_SOCKET_IFNAME at the fastest interface "
                          "between the nodes")
        elif multi:
            advice.append("make sure the collectives use the fastest interface between the nodes "
                          "(NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; InfiniBand for NCCL)")
        elif gpu:
            advice.append("on one node NCCL should use NVLink/PCIe peer-to-peer: check that "
                          "NCCL_P2P_DISABLE and NCCL_SHM_DISABLE are unset (NCCL_DEBUG=INFO names "
                          "the transport)")
        overlap = ev.overlap_fraction
        if overlap is not None and overlap < T.COMM_LOW_OVERLAP:
            advice.append(f"only {overlap:.0%} of the communication overlaps with compute: a smaller "
                          "DDP bucket_cap_mb starts the all-reduce earlier in backward")
        advice.append("send less, less often: accumulate gradients over k micro-batches under "
                      f"DDP's no_sync() (one all-reduce per k), or compress them ({compress} as a "
                      "DDP comm hook)")
    return why, "; ".join(advice)


EVIDENCE = CommEvidence
