"""The human summary: plain text, about 25 lines, readable in an sbatch log (no colour codes).

A view of the typed summary document (:class:`~.document.Summary`): :func:`render` takes the
document or its JSON.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from ..codec import encode
from .document import Summary, Verdict, read
from .goodput.render import render_ledger
from .ranklist import rank_ranges
from .status import OK_ENDINGS

MAX_RANK_LINES = 16


def _f(v: Optional[float], unit: str = "", digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}{unit}"


def _bytes(v: Optional[float]) -> str:
    if v is None or v < 0:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{int(v)} B"


def _verdict_line(v: Verdict, lead: str) -> list[str]:
    return [f"{lead}{v.label} ({v.severity}): {v.why}", f"{' ' * len(lead)}next: {v.next_step}"]


def _mb(v: float) -> str:
    """Decimal units, like the GB/s of the bandwidths (nccl-tests' GB/s are 10^9 bytes/s)."""
    return f"{v / 1e6:.3g} MB" if v >= 1e5 else f"{v / 1e3:.3g} kB"


def _gbps(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3g} GB/s"


def _communication_lines(doc: Summary) -> list[str]:
    """Exposed wait, bytes and bandwidth (nccl-tests' algbw/busbw), and the link probe."""
    c = doc.communication
    if not c:
        return []
    out = []
    x = c.exposed_ms
    if not c.measured or x is None:
        if doc.topology.world_size > 1:
            out.append(f"Communication: not measured ({c.not_measured_why or '?'})")
    else:
        f, busy = c.exposed_fraction, c.busy_ms
        by, calls, bus, alg = c.bytes_per_step, c.calls_per_step, c.busbw_gbps, c.algbw_gbps
        line = (f"Communication: waits {_f(x.median, ' ms', 2)} per step (median rank; least "
                f"{_f(x.min, ' ms', 2)}, rank {x.min_rank}")
        if f:
            line += f"; {f.median:.0%} of the step"
        line += ")"
        if busy:
            line += f", in flight {_f(busy.median, ' ms', 2)}"
        out.append(line)
        if by and calls and bus:
            out.append(f"  {_mb(by.median)} per step in {calls.median:g} collectives; bus "
                       f"bandwidth {_gbps(bus.median)} (algorithm {_gbps(alg.median if alg else None)}"
                       f"; lowest: rank {bus.min_rank} {_gbps(bus.min)})")
    probe = c.probe
    if probe:
        out += _probe_lines(probe)
    return out


def _probe_lines(probe: dict[str, Any]) -> list[str]:
    if probe.get("error"):
        return [f"Link probe: the links between the nodes were not measured ({probe['error']})"]
    nodes = probe.get("nodes") or []
    parts = [f"{n['node']}={n.get('host') or '?'} {_gbps(n.get('gbps'))}" for n in nodes[:MAX_RANK_LINES]]
    line = (f"Link probe (best send rate per node; up to {probe.get('bytes_per_pair', 0) / 1e6:.3g} MB "
            f"per transfer, {probe.get('seconds', 0):.1f} s in all): " + ", ".join(parts))
    out = [line]
    slow, link = probe.get("slow_node"), probe.get("slow_link")
    if slow:
        verb = "sends" if slow.get("direction") == "send" else "receives"
        out.append(f"  SLOW LINK: node {slow['node']} ({slow.get('host') or '?'}) {verb} at "
                   f"{_gbps(slow['gbps'])}, the other nodes at {_gbps(slow['others_gbps'])}")
    elif link:
        out.append(f"  SLOW LINK: node {link['src']} ({link.get('src_host') or '?'}) -> node "
                   f"{link['dst']} ({link.get('dst_host') or '?'}) at {_gbps(link['gbps'])}, the "
                   f"other way {_gbps(link['others_gbps'])}")
    return out


def render(summary: Union[Summary, dict[str, Any]]) -> str:
    doc = summary if isinstance(summary, Summary) else read(summary)
    run, topo, tel = doc.run, doc.topology, doc.telemetry
    lines = []
    head = f"TraceML summary: run {run.name}"
    if run.job_id:
        head += f" (job {run.job_id})"
    head += f" - {run.status}"
    if run.exit_code is not None:
        head += f", exit {run.exit_code}"
    head += f", {run.duration_s:.1f} s"
    lines.append(head)
    if doc.provisional:
        lines.append("  (provisional: written on SIGTERM before the launcher reported the exit)")
    rb = doc.rebuilt
    if rb:
        if rb.get("final_checkpoint"):  # the run's end is in it: nothing is missing
            lines.append(f"  (rebuilt from the checkpoint taken at {rb.get('taken_at_iso')}, after the "
                         "run's end was recorded: exact)")
        else:
            lines.append(f"  (rebuilt from the checkpoint taken at {rb.get('taken_at_iso')}; data after "
                         "it is missing)")
    if run.reason:
        lines.append(f"  reason: {run.reason}")
    nodes = topo.nodes
    missing = [n for n in nodes if not n.joined]
    topo_line = (f"Topology: {topo.nnodes} node(s) x {topo.nproc_per_node} = "
                 f"{topo.world_size} ranks; " + ("all nodes joined" if not missing else
                 f"{len(missing)} node(s) never joined: " +
                 ", ".join(f"{n.node} ({n.hostname or '?'})" for n in missing[:MAX_RANK_LINES]) +
                 (f", ... (nodes {rank_ranges([n.node for n in missing], MAX_RANK_LINES)})"
                  if len(missing) > MAX_RANK_LINES else "")))
    late = [n for n in nodes if n.late]
    if late:
        topo_line += "; joined late: " + ", ".join(
            f"node {n.node} ({n.hostname or '?'}) after {n.join_delay_s or 0.0:.1f} s" for n in late[:8])
    lines.append(topo_line)
    if topo.nnodes > 1:
        parts = [f"{n.node}={n.hostname or '?'}[{rank_ranges(n.ranks)}]"
                 + (" LEFT EARLY" if n.left_early else "") + (" late" if n.late else "")
                 for n in nodes[:MAX_RANK_LINES]]
        lines.append("  nodes: " + " ".join(parts) + (" ..." if len(nodes) > MAX_RANK_LINES else ""))
    lines += doc.steps.explain
    lines.append("")
    lines += _verdict_line(doc.verdict, "Verdict: ")
    for v in doc.other_verdicts:
        lines += _verdict_line(v, "   also: ")
    if doc.hang is not None:
        from .hang import render as render_hang

        head, *rest = render_hang(encode(doc.hang))
        lines.append("")
        stall = doc.hang.report.stall_s
        lines.append((f"Hang report (the stall lasted {stall:.0f} s, then steps resumed): " if stall is not None
                      else "Hang report (steps then resumed): " if doc.hang.resumed else "Hang report: ")
                     + head.split(": ", 1)[1])
        lines += rest
    lines.append("")
    ac = doc.across_ranks
    if any(ac.get(name) for name in doc.phases):
        lines.append("Step phases (steady mean per rank, ms)  median   worst (rank)    skew")
    unmeasured = []
    for name in doc.phases:
        a = ac.get(name)
        if not a:
            if name != "step":
                unmeasured.append(name)
            continue
        label = {"outside": "between", "nophase": "no phase"}.get(name, name)
        lines.append(f"  {label:<10}                         {_f(a.median_ms, '', 2):>9} "
                     f"{_f(a.worst_ms, '', 2):>9} ({a.worst_rank:>4})  {_f(a.skew, 'x', 2):>6}")
    if unmeasured and ac.get("step"):
        why = {"input": "input (no DataLoader or wrap_dataloader seen; time between steps is 'between')",
               "h2d": "h2d (CUDA only)", "forward": "forward (no model passed to trace_step)"}
        lines.append("  not measured: " + ", ".join(why.get(n, n) for n in unmeasured))
    st = doc.step_time
    if st.median_ms is not None:
        lines.append(f"  median step {_f(st.median_ms, '', 2)} ms (p90 {_f(st.p90_ms, '', 2)}, p99 "
                     f"{_f(st.p99_ms, '', 2)}) over {st.steps:,} steps of all ranks")
    lines += _communication_lines(doc)
    mems = [(r.mem_peak.max_bytes, r) for r in doc.ranks if r.mem_peak]
    if mems:
        mx, r = max(mems, key=lambda x: x[0])
        tr = r.mem_peak.trend if r.mem_peak else None
        if tr and tr.growth_pct is not None:
            trend = f", trend {tr.growth_pct:+.1f}% over the run"
        elif r.mem_peak and r.mem_peak.trend_why:
            trend = f"; {r.mem_peak.trend_why}"
        else:
            trend = ""
        lines.append(f"Memory peak: {_bytes(mx)} (rank {r.rank}){trend}")
    sys_parts = []
    for n in doc.system.nodes[:MAX_RANK_LINES]:
        part = f"node {n.node}: cpu {_f(n.cpu_pct_mean, '%', 0)}"
        if n.gpus:
            utils = [g.util_pct_mean for g in n.gpus if g.util_pct_mean is not None]
            temps = [g.temp_c_max for g in n.gpus if g.temp_c_max is not None]
            part += f", {len(n.gpus)} GPU util {_f(sum(utils) / len(utils) if utils else None, '%', 0)}"
            if temps:
                part += f" (max {max(temps):.0f}C)"
        sys_parts.append(part)
    if sys_parts:
        lines.append("System: " + "; ".join(sys_parts))
    ledger = doc.goodput
    if ledger is not None and len(ledger.attempts) == 1:
        lines += render_ledger(ledger)
    endings = doc.rank_endings
    if doc.verdict.kind == "no_steps" and set(endings) == {"never_joined"}:
        # the workers ran and exited cleanly without calling traceml: not a network fault
        lines.append(f"Ranks: {endings['never_joined']} ran without connecting to TraceML")
    else:
        lines.append("Ranks: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in endings.items()))
    order = {"first": 0, "independent": 1, "consequence": 2}
    bad = sorted((r for r in doc.ranks if r.status not in OK_ENDINGS),
                 key=lambda r: (order.get((r.failure or {}).get("role"), 3), r.rank))
    for r in bad[:MAX_RANK_LINES]:
        err = f": {r.error.strip().splitlines()[-1][:100]}" if r.error else ""
        if not err and r.exit and r.exit.signal:
            err = f": {r.exit.signal}" + (" (OOM kill)" if (r.failure or {}).get("oom_killed") else "")
        role = (r.failure or {}).get("role")
        tag = {"first": " FIRST FAILURE", "consequence": " (consequence)", "independent": ""}.get(role, "")
        lines.append(f"  rank {r.rank} (node {r.node}, {r.host or '?'}) "
                     f"{r.status.replace('_', ' ')}{tag}{err}")
    if len(bad) > MAX_RANK_LINES:
        lines.append(f"  ... and {len(bad) - MAX_RANK_LINES} more (see final_summary.json)")
    upto = " up to the checkpoint" if rb and not rb.get("final_checkpoint") else ""
    loss = (f"Telemetry: {tel.records_received:,} step records received of "
            f"{tel.records_expected:,} produced{upto}; ")
    if tel.records_lost:
        lossy = sorted(doc.ranks, key=lambda r: -(r.telemetry.lost or 0))
        worst = ", ".join(f"rank {r.rank}: {r.telemetry.lost}" for r in lossy[:3] if r.telemetry.lost)
        loss += f"{tel.records_lost:,} lost ({worst})"
    elif tel.complete:
        loss += "none lost"
    else:
        loss += "none known lost"
    unsure = tel.ranks_without_goodbye
    if unsure:
        bound = tel.records_unsent_max
        open_ranks = sorted((r for r in doc.ranks if r.status != "never_joined"
                             and r.telemetry.unsent_max != 0),
                            key=lambda r: -(r.telemetry.unsent_max or 1 << 62))
        each = ", ".join(f"rank {r.rank}: " + ("?" if r.telemetry.unsent_max is None
                                               else f"<= {r.telemetry.unsent_max:,}")
                         for r in open_ranks[:3])
        loss += (f"; incomplete: {unsure} rank(s) ended without a goodbye, so records they held "
                 "unsent cannot be counted: "
                 + ("no bound" if bound is None else f"at most about {bound:,} more") + f" ({each})")
    silent = endings.get("never_joined", 0)
    if silent:
        loss += f"; {silent} rank(s) never connected"
    lines.append(loss)
    bad_wire = {k: v for k, v in tel.wire.items() if v and k not in ("connections", "replaced")}
    if bad_wire:
        lines.append("  wire: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in bad_wire.items()))
    for note in doc.notes:
        lines.append(f"Note: {note}")
    lines += next_job_lines(doc)
    files = doc.files
    if files.get("json"):
        lines.append(f"Files: {files['json']}" + (f" (report: {files['html']})" if files.get("html") else ""))
    if ledger is not None and len(ledger.attempts) > 1:  # a run over several attempts: its ledger first
        lines = render_ledger(ledger) + [""] + lines
    return "\n".join(lines) + "\n"


def next_job_lines(doc: Summary) -> list[str]:
    """``Next job script:`` and each line to paste, with its reason as a shell comment."""
    nj = doc.next_job
    if nj is None:
        return []
    out = [f"Note: {n}" for n in nj.notes]
    if nj.lines:
        out.append("Next job script (paste into your sbatch script):")
        out += [f"  {line}" + (f"    # {why}" if why else "") for line, why in zip(nj.lines, nj.why)]
    return out
