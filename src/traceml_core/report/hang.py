"""The hang autopsy: where is each rank stuck, and which one never arrived?

A pure function of what node 0 collected when no rank had completed a step for the threshold:
per rank what its interpreter said (every thread's Python stack, read on its client thread while
the main thread waits in C with the GIL released, as collectives, loaders and sleeps do; and the
collective it launched and that has not completed, from the SDK's communication timing), what
its node's relay read of its process from the kernel (stopped, gone, its CPU time and I/O), and
its step count. No I/O; the launcher prints :func:`render` at once and the summary keeps the
report (``hang``) and its verdict.

How a rank's state is read from its **main thread** (the one whose oldest frame is the script's
``<module>``), innermost frame first, skipping TraceML's own wrappers:

* a frame in ``torch/distributed/distributed_c10d.py`` names the collective (``all_reduce``,
  ``barrier``, ``broadcast``, ...); ``Work.wait`` counts too;
* ``torch.autograd`` ``backward`` in a distributed run: the gradient all-reduce of DDP (its hooks
  run in C++, so the wait itself has no Python frame); the SDK's in-flight record (``ddp_bucket``)
  confirms it when the rank could answer;
* ``torch/nn/parallel/distributed.py`` ``forward``: DDP's forward-time collectives (buffer
  broadcast, unused-parameter bookkeeping);
* a DataLoader ``_next_data``/``_get_data``: waiting for a batch (a deadlocked or dead loader);
* otherwise the rank is *not in a collective*, and where it is is its innermost frame in user code.

Then: when some ranks wait in a collective and others are not in any, the others are the ones that
**never arrived** (the usual hang: one rank stuck in its own code, every other one waiting for it
in the next collective). When ranks wait in *different* collectives, the report says they are
mismatched, and names the smaller group. Ranks are grouped by (state, place), so a 512-rank report
stays a few lines.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..codec import encode
from ..rundata import HangReport
from .ranklist import ranks_phrase

_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
_LIB = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
_TRACEML = "/traceml_core/"
#: lines of the main thread's stack kept per rank in the summary (innermost first)
STACK_LINES = 24


@dataclass
class Frame:
    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.func}"

    @property
    def traceml(self) -> bool:
        return _TRACEML in self.file or self.file.startswith("<traceml")

    @property
    def user(self) -> bool:
        return not any(p in self.file for p in _LIB) and not self.traceml


@dataclass
class Thread:
    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first
    name: Optional[str] = None

    @property
    def is_main(self) -> bool:
        if self.name is not None:
            return self.name == "MainThread"
        return bool(self.frames) and (self.frames[-1].func == "<module>"
                                      or self.frames[-1].func == "_run_module_as_main")

    @property
    def is_traceml(self) -> bool:
        return ((self.name or "").startswith("traceml-") or any(f.traceml for f in self.frames)) \
            and not self.is_main


def parse(text: str) -> list[Thread]:
    """A stack text in faulthandler's layout (sdk/stackdump.py writes it) -> threads (innermost
    frame first)."""
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _THREAD_RE.match(line)
        if m:
            threads.append(Thread(m.group(2), m.group(1).startswith("Current"), name=m.group("name")))
            continue
        f = _FRAME_RE.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f.group("file"), int(f.group("line")), f.group("func")))
    return threads


def main_thread(threads: Sequence[Thread]) -> Optional[Thread]:
    for t in threads:
        if t.is_main:
            return t
    others = [t for t in threads if not t.is_traceml]
    return others[0] if others else (threads[0] if threads else None)


def _own(frames: Sequence[Frame]) -> list[Frame]:
    """The frames up to the user's script: what runs it (runpy, a launcher's bootstrap module)
    is cut, as are TraceML's own wrapper frames."""
    out: list[Frame] = []
    for f in frames:
        if f.traceml:
            continue
        out.append(f)
        if f.func == "<module>" and f.user:
            break
    return out or list(frames)


def _collective(frames: Sequence[Frame], world: int) -> Optional[str]:
    """The collective the main thread waits in, from its frames (innermost first)."""
    for f in frames:
        path = f.file.replace("\\", "/")
        if path.endswith("torch/distributed/distributed_c10d.py") and not f.func.startswith("_"):
            return f.func
        if path.endswith("torch/distributed/distributed_c10d.py") and f.func in ("_wait", "wait"):
            return "a collective's wait()"
        if "torch/utils/data/dataloader.py" in path and f.func in ("_next_data", "_get_data", "_try_get_data"):
            return "dataloader"
        if path.endswith("torch/nn/parallel/distributed.py") and f.func in ("forward", "_pre_forward",
                                                                            "_sync_buffers", "_sync_params"):
            return "ddp_forward"
        if path.endswith("torch/autograd/graph.py") and f.func == "_engine_run_backward" and world > 1:
            return "ddp_backward"
        if path.endswith("torch/autograd/__init__.py") and f.func == "backward" and world > 1:
            return "ddp_backward"
    return None


_WORDS = {
    "ddp_backward": "the gradient all-reduce (DDP backward)",
    "ddp_bucket": "the gradient all-reduce (DDP backward)",
    "ddp_forward": "DDP's forward-time collectives (buffer broadcast)",
    "dataloader": "waiting for a DataLoader batch",
}


def words(collective: Optional[str]) -> str:
    if collective is None:
        return "not in a collective"
    return _WORDS.get(collective, collective)


@dataclass
class RankAutopsy:
    rank: int
    node: Optional[int]
    host: str
    #: "collective", "dataloader", "running", "stopped", "gone", "no_dump" (its relay answered,
    #: its interpreter did not), "unreachable" (neither answered)
    state: str
    collective: Optional[str]  # op name, "ddp_backward", ... (None when not in one)
    where: Optional[str]       # innermost user frame of the main thread
    stack: list[str]           # the main thread's frames, innermost first (short form)
    threads: int               # threads in the dump (TraceML's own not counted)
    in_flight: Optional[dict[str, Any]]
    step: Optional[int]
    error: Optional[str]
    #: the progress counters of this reading (cumulative; report/hangstate.py compares two):
    #: collectives the SDK saw launched, and what the relay read of the process
    launched: Optional[int] = None
    main_cpu_ns: Optional[int] = None
    children_cpu_ns: Optional[int] = None
    proc_cpu_ns: Optional[int] = None
    io_bytes: Optional[int] = None
    #: when the relay read the process (its node's monotonic clock, ns)
    at_ns: Optional[int] = None


def _counters(a: RankAutopsy, proc: Optional[dict[str, Any]], snapshot: Optional[dict[str, Any]]) -> RankAutopsy:
    if snapshot:
        a.launched = snapshot.get("launched")
    if proc:
        a.main_cpu_ns, a.children_cpu_ns = proc.get("main_cpu_ns"), proc.get("children_cpu_ns")
        a.proc_cpu_ns, a.io_bytes, a.at_ns = proc.get("proc_cpu_ns"), proc.get("io_bytes"), proc.get("at_ns")
    return a


#: why a stopped rank has no stack
STOPPED = ("its process is stopped (state T: SIGSTOP, Ctrl-Z, or a debugger holds it), so it runs "
           "nothing, not even the answer")


def no_answer(proc: Optional[dict[str, Any]], waited_s: float) -> str:
    """Why a rank's interpreter told nothing, from what its relay read of the process."""
    if proc is None:
        return f"neither the rank nor its node's relay answered within {waited_s:.0f} s"
    if proc.get("gone"):
        return "its process is gone"
    if proc.get("state") in ("T", "t"):
        return STOPPED
    kernel = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O (D)"}.get(
        str(proc.get("state")), f"state {proc.get('state')}")
    if proc.get("wchan"):
        kernel += f" in {proc['wchan']}"
    return (f"its interpreter did not answer within {waited_s:.0f} s (C code holding the GIL, or "
            f"the process is overloaded); the kernel says its main thread is {kernel}")


def analyse_rank(rank: int, node: Optional[int], host: str, proc: Optional[dict[str, Any]],
                 snapshot: Optional[dict[str, Any]], world: int, step: Optional[int],
                 waited_s: float = 6.0) -> RankAutopsy:
    text = (snapshot or {}).get("text") or ""
    threads = parse(text)
    main = main_thread(threads)
    inflight = (snapshot or {}).get("in_flight")
    if snapshot and snapshot.get("step") is not None:
        step = snapshot["step"]
    if proc is not None and proc.get("state") in ("T", "t"):
        main = None    # an answer from before it stopped does not say where it is now
    if main is None:
        coll = inflight.get("op") if isinstance(inflight, dict) and snapshot else None
        halted = proc is not None and proc.get("state") in ("T", "t")
        state = "stopped" if halted else "gone" if proc is not None and proc.get("gone") else \
            "collective" if coll else "unreachable" if proc is None and not snapshot else "no_dump"
        return _counters(RankAutopsy(rank, node, host, state, None if halted else coll, None, [],
                                     0, inflight, step, no_answer(proc, waited_s)), proc, snapshot)
    coll = _collective(main.frames, world)
    if isinstance(inflight, dict) and inflight.get("op"):
        # the SDK saw this collective launched and not completed: it names it exactly
        if coll in (None, "ddp_backward", "ddp_forward", "a collective's wait()"):
            coll = str(inflight["op"])
    frames = _own(main.frames)
    user = [f for f in frames if f.user]
    where = (user[0] if user else frames[0]).short if frames else None
    state = "dataloader" if coll == "dataloader" else ("collective" if coll else "running")
    return _counters(RankAutopsy(rank, node, host, state, None if coll == "dataloader" else coll, where,
                                 [f.short for f in frames[:STACK_LINES]],
                                 sum(1 for t in threads if not t.is_traceml), inflight, step, None),
                     proc, snapshot)


def _nodes(items: Sequence[Any], inline: bool = False) -> str:
    """``node 1, node2`` (one node) or ``node 0 (gpu1), node 1 (gpu2)``; ``N nodes`` past three."""
    hosts = sorted({(a.node, a.host) for a in items}, key=lambda x: (x[0] is None, x[0]))
    if len(hosts) > 3:
        return f"{len(hosts)} nodes"
    if len(hosts) == 1:
        n, h = hosts[0]
        return f"node {n}" + (f", {h}" if h else "")
    return ", ".join(f"node {n}" + (f" ({h})" if h else "") for n, h in hosts)


def diagnose(ranks: Sequence[RankAutopsy]) -> dict[str, Any]:
    """Groups, the culprits (the ranks that never arrived), and the one-line finding."""
    groups: dict[tuple, list[RankAutopsy]] = {}
    for a in ranks:
        key = (a.state, a.collective, a.where if a.state != "collective" else None)
        groups.setdefault(key, []).append(a)
    waiting = [a for a in ranks if a.state == "collective"]
    elsewhere = [a for a in ranks if a.state in ("running", "dataloader")]
    halted = [a for a in ranks if a.state == "stopped"]
    colls = sorted({words(a.collective) for a in waiting})
    culprits: list[RankAutopsy] = []
    if halted:
        # a stopped process runs nothing: every collective waits for it, whatever else is seen
        culprits = halted
        finding = (f"{ranks_phrase([a.rank for a in halted])} ({_nodes(halted, inline=True)}) "
                   + ("never arrived at the collective the others wait in (" + ", ".join(colls) + "): "
                      if waiting else "stopped: ")
                   + ("its process is stopped (SIGSTOP, Ctrl-Z, or a debugger holds it), so it runs nothing"
                      if len(halted) == 1 else "their processes are stopped (SIGSTOP, Ctrl-Z, or a debugger "
                      "holds them), so they run nothing"))
        if elsewhere:
            finding += "; " + "; ".join(f"{ranks_phrase([a.rank for a in v])} at {v[0].where}"
                                        for v in _by_where(elsewhere))
    elif waiting and elsewhere:
        culprits = elsewhere
        c0 = elsewhere[0]
        place = "waiting for a DataLoader batch" if c0.state == "dataloader" else f"at {c0.where}"
        finding = (f"{ranks_phrase([a.rank for a in elsewhere])} ({_nodes(elsewhere, inline=True)}) never arrived at "
                   f"the collective the others wait in ({', '.join(colls)}): "
                   f"{'it is' if len(elsewhere) == 1 else 'they are'} {place}")
    elif len(colls) > 1:
        by: dict[str, list[RankAutopsy]] = {}
        for a in waiting:
            by.setdefault(words(a.collective), []).append(a)
        sizes = sorted(len(v) for v in by.values())
        if sizes[0] < sizes[1]:  # one group is the odd one out; with a tie nobody is named
            culprits = min(by.values(), key=len)
        finding = ("ranks wait in different collectives (mismatched): " + "; ".join(
            f"{ranks_phrase([a.rank for a in v])} in {k}" + (f" at {v[0].where}" if v[0].where else "")
            for k, v in sorted(by.items(), key=lambda kv: len(kv[1]))))
    elif waiting and len(waiting) == len(ranks):
        finding = (f"every rank waits in {colls[0]}: none is missing from it, so the collective "
                   "itself is stuck (a network or NCCL problem, or a peer process outside this "
                   "job's ranks)")
    elif elsewhere and not waiting:
        finding = ("no rank is in a collective: " + "; ".join(
            f"{ranks_phrase([a.rank for a in v])} at {v[0].where}" for v in _by_where(elsewhere)))
    elif waiting:
        # every stack read waits in one collective; the ranks without one are not in it, or
        # could not be reached at all (their node or its link is down)
        absent = [a for a in ranks if a.state in ("no_dump", "gone", "unreachable")]
        culprits = absent
        verb = "waits" if len(waiting) == 1 else "wait"
        if all(a.state == "unreachable" for a in absent):
            finding = (f"{ranks_phrase([a.rank for a in waiting])} {verb} in {colls[0]}; nothing was heard "
                       f"from {ranks_phrase([a.rank for a in absent])} ({_nodes(absent, inline=True)}): "
                       "neither the rank nor its node's relay answered, so its node or its network link "
                       "may be down")
        else:
            finding = (f"{ranks_phrase([a.rank for a in waiting])} {verb} in {colls[0]}; "
                       f"{ranks_phrase([a.rank for a in absent])} ({_nodes(absent, inline=True)}) "
                       "never arrived at it, and no stack could be read from "
                       + ("it" if len(absent) == 1 else "them"))
    else:
        finding = "no rank's stack could be read"
    missing = [a for a in ranks if a.state in ("no_dump", "gone", "unreachable")]
    if missing and culprits != missing:
        finding += f"; no stack from {ranks_phrase([a.rank for a in missing])}" + (
            f" ({missing[0].error})" if missing[0].error and len({a.error for a in missing}) == 1 else "")
    return {"finding": finding, "culprits": [a.rank for a in culprits],
            "groups": [{"ranks": sorted(a.rank for a in v), "state": k[0], "collective": k[1],
                        "where": v[0].where} for k, v in sorted(groups.items(), key=lambda kv: min(a.rank for a in kv[1]))]}


def _by_where(items: Sequence[RankAutopsy]) -> list[list[RankAutopsy]]:
    out: dict[Optional[str], list[RankAutopsy]] = {}
    for a in items:
        out.setdefault(a.where, []).append(a)
    return list(out.values())


def render(report: dict[str, Any], *, max_groups: int = 8, stack_lines: int = 8) -> list[str]:
    """The report as log lines (also the summary text's hang section)."""
    lines = [f"hang report: {because(report)}; " + report["finding"]]
    by_rank = {a["rank"]: a for a in report["ranks"]}
    for g in report["groups"][:max_groups]:
        a = by_rank[g["ranks"][0]]
        what = words(g["collective"]) if g["state"] == "collective" else (
            "waiting for a DataLoader batch" if g["state"] == "dataloader" else
            "no stack (" + (a.get("error") or "?") + ")" if g["state"] in ("no_dump", "gone", "unreachable") else
            "stopped: it runs nothing (SIGSTOP, Ctrl-Z, or a debugger)" if g["state"] == "stopped"
            else "not in a collective")
        at = f" at {a['where']}" if a.get("where") else ""
        step = f", step {a['step']}" if a.get("step") is not None and g["state"] != "unreachable" else ""
        mark = ""
        if a["rank"] in report["culprits"]:
            mark = "  <- never arrived" if g["state"] != "collective" else "  <- differs from the others"
        lines.append(f"  {ranks_phrase(g['ranks'])} ({_nodes([_Obj(by_rank[r]) for r in g['ranks']])}): "
                     f"{what}{at}{step}{mark}")
    if len(report["groups"]) > max_groups:
        lines.append(f"  ... {len(report['groups']) - max_groups} more groups (final_summary.json: hang)")
    for r in report["culprits"][:2]:
        a = by_rank[r]
        if a.get("stack"):
            lines.append(f"  rank {r}'s main thread (innermost first):")
            lines += [f"    {s}" for s in a["stack"][:stack_lines]]
    return lines


def because(report: dict[str, Any]) -> str:
    """Why the report was made: the rule that fired (aggregator/hangwatch.py), or the threshold
    of an older report or of a report asked for (``--hang-timeout``)."""
    rule = report.get("rule") or {}
    silent = f"no rank completed a step for {report['silent_s']:.0f} s"
    if rule.get("kind") == "state":
        return f"{silent}, and {rule.get('because')} (decided by the ranks' state)"
    if rule.get("kind") == "time":
        return (f"{silent} (the backstop: {report['threshold_source']}; no rank was seen working, "
                "but the ranks' state could not decide)")
    return f"{silent} (threshold {report['threshold_s']:.0f} s: {report['threshold_source']})"


class _Obj:
    def __init__(self, d: dict[str, Any]) -> None:
        self.node, self.host = d.get("node"), d.get("host") or ""


def build(ranks_in: Sequence[dict[str, Any]], *, world: int, silent_s: float, threshold_s: float,
          threshold_source: str, at: float) -> dict[str, Any]:
    """The report from what was collected: ``ranks_in`` rows ``{rank, node, host, proc, snapshot,
    step, waited_s}`` (``proc``: the relay's reading of the process; ``snapshot``: the rank's own
    answer, with its stacks as ``text``)."""
    autopsies = [analyse_rank(int(r["rank"]), r.get("node"), r.get("host") or "", r.get("proc"),
                              r.get("snapshot"), world, r.get("step"), float(r.get("waited_s") or 6.0))
                 for r in ranks_in]
    d = diagnose(autopsies)
    # each rank's full main-thread stack for the ranks that tell the story (the culprits and the
    # first rank of each group); the others repeat them, and a 4,096-rank report must stay small
    keep = set(d["culprits"]) | {g["ranks"][0] for g in d["groups"]}
    for a in autopsies:
        if a.rank not in keep:
            a.stack = []
    return {"at": at, "silent_s": round(silent_s, 1), "threshold_s": round(threshold_s, 1),
            "threshold_source": threshold_source, "finding": d["finding"], "culprits": d["culprits"],
            "groups": d["groups"], "ranks": [encode(a) for a in autopsies]}


def verdict(report: HangReport, *, ended_hung: bool) -> dict[str, Any]:
    """The summary's verdict for a hang: critical when the run ended while hung."""
    culprit = None
    a = report.culprit_row()
    if a is not None:
        culprit = {"rank": a["rank"], "node": a["node"], "host": a["host"] or None}
    if ended_hung:
        how = ""
        if report.rule and report.detect_s is not None:
            how = (f" (named {report.detect_s:.0f} s after the last step, by "
                   + ("the ranks' state" if report.rule.get("kind") == "state" else "the time backstop") + ")")
        why = (f"training hung: no rank completed a step for {report.silent_s:.0f} s or more{how}; "
               + report.finding)
        nxt = ("look at the stacks in final_summary.json (hang.ranks[].stack): the rank that never "
               "arrived is stuck in its own code (a deadlock, an uneven loop, a rank-dependent "
               "branch around a collective); if every rank waits in the same collective, check the "
               "network and NCCL (NCCL_DEBUG=INFO)")
        sev = "critical"
    elif report.stall_s is not None:
        began = report.resolved_at - report.stall_s if report.resolved_at is not None else None
        span = (f" from {_clock(began)} to {_clock(report.resolved_at)}" if began is not None else "")
        why = (f"training stalled for {report.stall_s:.0f} s (no step reached node 0{span}), then "
               f"went on; while stalled: {report.finding}")
        nxt = "if the stall was not an evaluation or checkpoint, the stacks show where every rank waited"
        sev = "warning"
    else:
        why = (f"training stalled for {report.silent_s:.0f} s or more (no rank completed a step), "
               f"then went on; while stalled: {report.finding}")
        nxt = "if the stall was not an evaluation or checkpoint, the stacks show where every rank waited"
        sev = "warning"
    return {"kind": "hang", "severity": sev, "why": why, "next_step": nxt, "culprit": culprit,
            "evidence": {"silent_s": report.silent_s, "threshold_s": report.threshold_s,
                         "rule": report.rule, "detect_s": report.detect_s,
                         "stall_s": report.stall_s, "culprits": report.culprits, "groups": report.groups}}


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))
