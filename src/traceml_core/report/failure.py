"""Failures first: when a run fails, the headline is the failure, not a performance verdict.

A pure function of the summary's rank list and the worker reports (no I/O). For every rank that
did not end cleanly it works out the **cause** and whether it is only a **consequence** of
another rank's failure, then names the first rank to fail: its node and host, the step, and the
exception (type, message, where it was raised) or the signal, with an OOM kill named as such.

How each rank's failure is read (strongest evidence first):

* an uncaught exception (the rank's ``bye`` says ``error`` and its traceback arrived as an event):
  type, message, the innermost frame outside Python's and torch's own files, and the step
  (``fail_step``/``fail_in_step`` in the bye: inside that step's ``trace_step`` block, or
  between steps);
  ``sys.exit(n)`` is read as an exit status, not an exception;
* torchrun's record of the worker (the launcher's torchrun process sends it; see
  launcher/agent.py): its exit code or signal. SIGKILL while the node's memory cgroup counted an
  OOM kill is an **OOM kill**; where the cgroup was not readable the summary says the OOM killer
  could not be checked;
* otherwise the rank only disappeared (no goodbye): crashed, cause unknown.

A collective library's own message on the rank's stderr (``ranks[].exit.stderr``, kept by the
torchrun process: launcher/stderrtee.py; read by report/stderr.py) is quoted: gloo's, NCCL's or
MPI's sentence is often all there is of a rank that native code aborted. A **collective
mismatch** (the ranks called different collectives, or the same one with different sizes) is a
cause of its own (``collective_mismatch``), named with the library's words, never "a segfault";
a lost connection or a timeout in it is a consequence. A script that exits (``sys.exit(2)`` from
``argparse``) is named with its own last words from the same stderr.

A rank that **finished cleanly while the others still trained** (it ran out of data first, or
left its loop early) is named first when the failures after it are only what its leaving causes
(lost peers, signals, exits; not an exception of a rank's own): its goodbye came before the
first failure, at a step the failed ranks went on from.

A failure is a **consequence** when it is what a rank sees after a peer died: a collective
backend reporting a lost connection, a reset, a broken pipe or a timeout (gloo, NCCL, the TCP
store), DDP or the process group aborting, SIGTERM/SIGINT (torchrun stops the other workers once
one failed), or no evidence at all on a rank that ended after the first real failure. The first
rank to fail is the earliest of the failures that are *not* consequences (by the time each was
seen); when every failure looks like a consequence (a network fault, a killed node) it is the
earliest of all of them, and the verdict says so.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..codec import encode
from ..rundata import OomReport
from .model import RankSummary
from .ranklist import ranks_phrase
from .status import FAILED_ENDINGS, INTERRUPT_SIGNALS, NodeFailure
from .stderr import KIND_WORDS, LibraryMessage, clean, library_message, script_message
from .tracebacks import (consequence_of, exit_call, last_line, peer_loss, raised_an_exception, raised_where,
                         recorded_error, split_exception, traceback_of)

__all__ = ["classify", "describe", "diagnose", "did_not_start", "consequence_of", "raised_where",
           "split_exception", "left_early", "failure_began"]

#: what the user does about a collective mismatch
MISMATCH_ADVICE = ("make every rank call the same collectives in the same order and with the same sizes: "
                   "look for a collective only some ranks reach (under `if rank == 0:`, in a branch on the "
                   "data, after a loop whose length differs per rank); TORCH_DISTRIBUTED_DEBUG=DETAIL makes "
                   "torch check every collective and name the first one that differs")
#: what the user does when a rank ran out of data (or left its loop) before the others
LEFT_EARLY_ADVICE = ("give every rank the same number of steps: with a DistributedSampler every rank gets "
                     "the same number of batches (drop_last=True, one dataset length for all ranks); where "
                     "the inputs really differ per rank, train inside DDP's `with model.join():`, or stop "
                     "all ranks together (all_reduce a 'done' flag each step)")


def _library(rank: RankSummary) -> Optional[LibraryMessage]:
    """The collective library's message in the rank's stderr (report/stderr.py), if any."""
    return library_message(rank.exit.stderr if rank.exit else None)


def _quote(lib: LibraryMessage) -> str:
    return f'{lib.library} reported {KIND_WORDS[lib.kind]}: "{lib.text}"'


def _step_words(rank: RankSummary) -> tuple[Optional[int], str]:
    """(step index, words) for where in training the rank failed."""
    fs = rank.fail_step
    if type(fs) is int:
        if rank.fail_in_step:
            return fs, f"in step {fs}"
        return fs, f"before step {fs} (after {fs} completed steps)"
    steps = rank.steps or 0
    if steps:
        return steps, f"after {steps} steps"
    return None, "before its first traced step"


def classify(rank: RankSummary, oom: Optional[OomReport]) -> dict[str, Any]:
    """The cause of one failed rank: ``{"cause", "type", "message", "where", "signal",
    "oom_killed", "consequence", "step", "step_words", "at", "library", "said"}`` (``library``: the
    collective library's message on its stderr; ``said``: the script's last words there, for a
    rank that exited)."""
    status = rank.status
    signal = rank.exit.signal if rank.exit else None
    exitcode = rank.exit.exitcode if rank.exit else None
    step, words = _step_words(rank)
    short = words.split(" (", 1)[0]
    out: dict[str, Any] = {"cause": "unknown", "type": None, "message": None, "where": None,
                           "signal": signal, "exitcode": exitcode, "oom_killed": None,
                           "consequence": None, "step": step, "step_words": words, "step_short": short,
                           "at": rank.failed_at, "library": None, "said": None}
    lib = _library(rank)
    if lib is not None:
        out["library"] = encode(lib)
    record = recorded_error(rank)
    if status != "error" and record is not None:
        # the worker never told TraceML (it failed before init(), or its connection was gone),
        # but torchrun's record of it carries Python's own error (the worker bootstrap writes
        # it: traceml_core/bootstrap.py), with the traceback. It raised, whatever ended the process
        # after that (torchrun's SIGTERM can overtake a worker that is already exiting)
        text, tb = record
        etype, msg = split_exception(text.splitlines()[-1])
        out.update(cause="exception", type=etype, message=msg, where=raised_where(tb),
                   consequence=consequence_of(text + "\n" + tb))
    elif raised_an_exception(rank):
        etype, msg = split_exception(last_line(rank))
        out.update(cause="exception", type=etype, message=msg, where=raised_where(traceback_of(rank)),
                   consequence=peer_loss(rank))
    elif status == "error" and exit_call(last_line(rank)):
        out.update(cause="exit", message=exit_call(last_line(rank)),
                   said=script_message(rank.exit.stderr if rank.exit else None))
    elif status == "interrupted":
        # its own goodbye (steps_produced) says KeyboardInterrupt; without one, the run was
        # interrupted and its launcher stopped it (srun, scancel, the time limit, Ctrl-C)
        out.update(cause="interrupted", consequence=(
            "it was interrupted (KeyboardInterrupt)" if rank.steps_produced is not None
            else "it was stopped when the run was interrupted"))
    elif signal and lib is not None and signal not in INTERRUPT_SIGNALS and lib.kind == "mismatch":
        # the library aborted the process on finding the ranks' collectives differ
        out["cause"] = "collective_mismatch"
    elif signal:
        out["cause"] = "signal"
        if lib is not None and lib.is_consequence and signal not in INTERRUPT_SIGNALS:
            # the library aborted it after losing a peer (gloo's uncaught "Connection closed")
            out["consequence"] = consequence_of(lib.text) or f"{lib.library} reported {KIND_WORDS[lib.kind]}"
        elif signal in INTERRUPT_SIGNALS:
            out["consequence"] = f"it was stopped with {signal}"
        elif signal == "SIGKILL" and oom is not None:
            out["oom_killed"] = oom.kills > 0
            if out["oom_killed"]:
                out["cause"] = "oom"
    elif out["exitcode"] not in (None, 0):
        out["cause"] = "exit"
        out["message"] = f"exit code {out['exitcode']}"
        out["said"] = script_message(rank.exit.stderr if rank.exit else None)
    elif status == "never_joined":
        out["cause"] = "never_joined"
    return out


def _align_silent_steps(ranks: Sequence[RankSummary], causes: dict[int, dict[str, Any]]) -> None:
    """A rank killed without a goodbye loses the steps it had not sent yet (up to a fraction of a
    second), so its own count understates where it died. Ranks that step together (DDP) were at
    the same step: the furthest any other rank got is the better estimate."""
    def reached(r: RankSummary) -> int:
        c = causes.get(r.rank)
        if c is not None and c["step"] is not None and type(r.fail_step) is int:
            return c["step"]
        return int(r.steps_produced or r.steps or 0)

    # the two furthest ranks, once (linear in ranks): the furthest *other* rank of any rank is
    # the first of them unless it is that rank itself
    top = sorted(((reached(o), i) for i, o in enumerate(ranks) if o.status != "never_joined"),
                 reverse=True)[:2]
    for i, r in enumerate(ranks):
        c = causes.get(r.rank)
        if c is None or type(r.fail_step) is int or r.steps_produced is not None:
            continue
        peak = next((v for v, j in top if j != i), 0)
        own = int(r.steps or 0)
        if peak > own:
            c["step"] = peak
            c["step_words"] = (f"around step {peak} (where the other ranks stopped; the steps it had "
                               f"not sent yet died with it, its telemetry reached {own})")
            c["step_short"] = f"around step {peak}"
        elif own:
            # every rank's tail may have died with it (a loaded machine, ranks stopped together):
            # what reached node 0 is a lower bound, and the words say so
            c["step_words"] = (f"after at least {own} steps (its telemetry reached {own}; the steps it "
                               "had not sent yet died with it)")
            c["step_short"] = f"after at least {own} steps"
            c["step_at_least"] = True


def _sp(words: str) -> str:
    """`` words`` (a leading space), or nothing when there are none (a run that did not start)."""
    return f" {words}" if words else ""


def _mib(n: Optional[int]) -> str:
    if not n:
        return "?"
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def describe(rank: RankSummary, c: dict[str, Any], oom: Optional[OomReport]) -> tuple[str, str]:
    """(what happened, one-line reason) for the first failure."""
    text, reason = _describe(rank, c, oom)
    lib = LibraryMessage(**c["library"]) if c.get("library") else None
    if lib is not None and c["cause"] != "collective_mismatch" and lib.text not in (c.get("message") or ""):
        # the library's own words where the rest does not already hold them
        text += f"; {_quote(lib)}"
    return text, reason


def _describe(rank: RankSummary, c: dict[str, Any], oom: Optional[OomReport]) -> tuple[str, str]:
    who = rank.name
    r = rank.rank
    if c["cause"] == "exception":
        where = f", at {c['where']}" if c["where"] else ""
        # a collective library's message without its build paths and sign-off (report/stderr.py)
        msg = f": {clean(c['message']) if library_message(c['message']) else c['message']}" if c["message"] else ""
        return (f"{who} raised {c['type'] or 'an exception'}{_sp(c['step_words'])}{where}{msg}",
                f"rank {r} raised {c['type'] or 'an exception'}{_sp(c['step_short'])}{msg}")
    if c["cause"] == "collective_mismatch":
        lib = LibraryMessage(**c["library"])
        how = f"was killed by {c['signal']}" if c["signal"] else "was aborted"
        return (f"{who} {how}{_sp(c['step_words'])}: {_quote(lib)}",
                f'rank {r} {how}{_sp(c["step_short"])}: {lib.library} reported a collective mismatch ("{lib.text}")')
    if c["cause"] == "oom":
        kills = oom.kills if oom else 0
        limit = f", limit {_mib(oom.limit_bytes)}" if oom and oom.limit_bytes else ""
        text = (f"{who} was killed by the kernel's OOM killer{_sp(c['step_words'])} (SIGKILL, and the "
                f"workers' memory cgroup counted {kills} OOM kill{'s' if kills != 1 else ''} during "
                f"the run{limit})")
        return text, f"rank {r} was killed by the OOM killer{_sp(c['step_short'])}"
    if c["cause"] == "signal":
        extra = ""
        if c["signal"] == "SIGKILL":
            extra = (" (no OOM kill counted in its memory cgroup: something else killed it, e.g. a "
                     "user, the scheduler or a health check)" if c["oom_killed"] is False else
                     " (its memory cgroup was not readable, so an OOM kill could not be checked)")
        return (f"{who} was killed by {c['signal']}{_sp(c['step_words'])}{extra}",
                f"rank {r} was killed by {c['signal']}{_sp(c['step_short'])}")
    if c["cause"] == "exit":
        said = f' after printing "{c["said"]}"' if c.get("said") else ""
        return (f"{who} exited with {c['message']}{_sp(c['step_words'])}{said}",
                f"rank {r} exited with {c['message']}{_sp(c['step_short'])}{said}")
    if c["cause"] == "interrupted":
        return (f"{who} was interrupted{_sp(c['step_words'])}", f"rank {r} was interrupted")
    if c["cause"] == "never_joined":
        return (f"{who} never connected to TraceML (it failed before traceml.init(), or its node "
                "never started)", f"rank {r} never connected")
    return (f"{who} ended without a goodbye{_sp(c['step_words'])} (killed, or died inside native code; "
            "torchrun's output above has its exit code)",
            f"rank {r} ended without a goodbye{_sp(c['step_short'])}")


def diagnose(ranks: Sequence[RankSummary], oom_by_node: dict[int, Optional[OomReport]],
             run_status: str, nodes: Sequence[NodeFailure] = ()) -> Optional[dict[str, Any]]:
    """The failure verdict of a failed run (None otherwise). Annotates each failed rank in place
    with ``failure``: ``{"role": "first"|"consequence"|"independent", ...cause}``.

    ``nodes`` (status.node_failures): a node whose torchrun was killed or whose launcher vanished
    is the first failure unless a rank failed by itself before it; its ranks that left no
    evidence of their own died with it (consequences).

    An interrupted run (SIGTERM from scancel, the time limit, or ``srun --kill-on-bad-exit`` after
    another node failed) gets it too when a rank failed by itself, not by the interruption."""
    if run_status not in ("failed", "interrupted"):
        return None
    failed = [r for r in ranks if r.status in FAILED_ENDINGS]
    node_fail = {nf.node: nf for nf in nodes} if run_status == "failed" else {}
    if not failed and not node_fail:
        return None
    causes = {r.rank: classify(r, oom_by_node.get(r.node) if r.node is not None else None) for r in failed}
    _align_silent_steps(ranks, causes)
    for r in failed:  # no evidence of its own on a node that failed: it died with its node
        nf, c = node_fail.get(r.node) if r.node is not None else None, causes[r.rank]
        if nf is not None and c["cause"] == "unknown":
            c["consequence"] = ("its node's torchrun was killed" if nf.cause == "torchrun_killed"
                                else "its node's launcher vanished")
    real = [r for r in failed if not causes[r.rank]["consequence"]
            and causes[r.rank]["cause"] not in ("unknown", "never_joined")]
    if not node_fail and run_status == "failed" and not any(causes[r.rank]["cause"] in OWN_ERRORS for r in real):
        leaver = left_early(ranks, failed, causes)
        if leaver is not None:
            return _left_early_verdict(leaver, ranks, failed, causes, oom_by_node)
    if node_fail:
        nf = min(node_fail.values(), key=lambda x: (x.at is None, x.at or 0.0, x.node))
        if not real or (nf.at is not None and all(causes[r.rank]["at"] is not None and nf.at <= causes[r.rank]["at"]
                                                 for r in real)):
            return _node_verdict(nf, failed, causes, real)
    if not failed or (run_status == "interrupted" and not real):
        return None
    pool = real or [r for r in failed if causes[r.rank]["cause"] != "never_joined"] or failed
    first = min(pool, key=lambda r: (causes[r.rank]["at"] is None, causes[r.rank]["at"] or 0.0, r.rank))
    t_first = causes[first.rank]["at"]
    independent: list[RankSummary] = []
    consequences: list[RankSummary] = []
    for r in failed:
        c = causes[r.rank]
        if r is first:
            role = "first"
        elif r in real:
            role = "independent"
        elif (c["consequence"] or c["cause"] == "never_joined" or t_first is None or c["at"] is None
              or c["at"] >= t_first):
            role = "consequence"
        else:  # no evidence either way, and it ended before the first real failure
            role = "independent"
        r.failure = {"role": role, **{k: v for k, v in c.items() if k not in ("step_words", "step_short", "step_at_least")}}
        (independent if role == "independent" else consequences if role == "consequence" else []).append(r)
    c = causes[first.rank]
    oom = oom_by_node.get(first.node) if first.node is not None else None
    text, reason = describe(first, c, oom)
    parts = [text]
    if independent:
        parts.append(f"{ranks_phrase([r.rank for r in independent])} also failed with an error of "
                     + ("its own" if len(independent) == 1 else "their own"))
    if consequences:
        kinds = sorted({causes[r.rank]["consequence"] or "stopped after the first failure"
                        for r in consequences})
        parts.append(f"{ranks_phrase([r.rank for r in consequences])} failed as a consequence ("
                     + "; ".join(kinds[:3]) + ")")
    if not real:
        parts.append("every failure looks like a lost peer or connection: check the node and "
                     "network of the first one")
    nxt = _next_step(first, c)
    evidence = {"first_rank": first.rank, "node": first.node, "host": first.host or None,
                "step": c["step"], "step_at_least": bool(c.get("step_at_least")), "cause": c["cause"], "exception_type": c["type"],
                "message": c["message"], "where": c["where"], "signal": c["signal"],
                "oom_killed": c["oom_killed"], "exitcode": c["exitcode"], "library": c.get("library"),
                "said": c.get("said"),
                "consequence_ranks": [r.rank for r in consequences],
                "independent_ranks": [r.rank for r in independent]}
    return {"kind": "run_failed", "severity": "critical", "why": "; ".join(parts), "next_step": nxt,
            "culprit": first.culprit(),
            "evidence": evidence, "reason": reason}


#: failures a rank makes by itself whatever its peers did: a rank that left early does not explain them
OWN_ERRORS = ("exception", "oom", "collective_mismatch")


def left_early(ranks: Sequence[RankSummary], failed: Sequence[RankSummary],
               causes: dict[int, dict[str, Any]]) -> Optional[RankSummary]:
    """The rank that finished cleanly while the failed ranks still trained, or None: it said a
    clean goodbye before the first failure (when the times are known), after no more steps than
    the failed ranks reached, and either a failed rank was still in its loop beyond that step
    (it failed in or before a later step, or got further) or every failure is what a rank sees
    when its peer is gone (a lost connection, a timeout, a stop). Of several, the first to end."""
    reach = [(causes[r.rank]["step"], type(r.fail_step) is int) for r in failed if causes[r.rank]["step"] is not None]
    if not reach:
        return None
    t_first = min((causes[r.rank]["at"] for r in failed if causes[r.rank]["at"] is not None), default=None)
    lost_peer = all(causes[r.rank]["consequence"] or causes[r.rank]["cause"] == "unknown" for r in failed)

    def went_on(n: int) -> bool:
        return any(step > n or (step == n and in_loop) for step, in_loop in reach) or (
            lost_peer and any(step >= n for step, _ in reach))

    out = [r for r in ranks if r.status == "clean" and r.steps_produced is not None and went_on(r.steps_produced)
           and (t_first is None or r.ended_at is None or r.ended_at <= t_first)]
    return min(out, key=lambda r: (r.ended_at is None, r.ended_at or 0.0, r.steps_produced or 0, r.rank), default=None)


def _left_early_verdict(leaver: RankSummary, ranks: Sequence[RankSummary], failed: Sequence[RankSummary],
                        causes: dict[int, dict[str, Any]],
                        oom_by_node: dict[int, Optional[OomReport]]) -> dict[str, Any]:
    """The failure verdict when a rank finished cleanly while the others still trained: that rank
    first, then the first error that followed, every failed rank a consequence."""
    n = int(leaver.steps_produced or 0)
    follower = min(failed, key=lambda r: (causes[r.rank]["at"] is None, causes[r.rank]["at"] or 0.0, r.rank))
    c = causes[follower.rank]
    text, _ = describe(follower, c, oom_by_node.get(follower.node) if follower.node is not None else None)
    others = [r for r in ranks if r.status == "clean" and r is not leaver and r.steps_produced is not None
              and r.steps_produced <= n and r.ended_at is not None and (c["at"] is None or r.ended_at <= c["at"])]
    still = ranks_phrase([r.rank for r in failed])
    steps = f"{n} step{'s' if n != 1 else ''}"
    why = (f"{leaver.name} finished cleanly after {steps} while {still} {'was' if len(failed) == 1 else 'were'} "
           f"still training; {'its' if len(failed) == 1 else 'their'} error{'s' if len(failed) > 1 else ''} "
           f"followed: {text}" + (f" ({c['consequence']})" if c["consequence"] else ""))
    rest = [r for r in failed if r is not follower]
    if rest:
        why += f"; {ranks_phrase([r.rank for r in rest])} failed after it too"
    if others:
        why += f"; {ranks_phrase([r.rank for r in others])} also finished early, cleanly"
    for r in failed:
        r.failure = {"role": "consequence", **{k: v for k, v in causes[r.rank].items()
                                               if k not in ("step_words", "step_short", "step_at_least")}}
    leaver.failure = {"role": "first", "cause": "left_early", "step": n, "at": leaver.ended_at}
    evidence = {"first_rank": leaver.rank, "node": leaver.node, "host": leaver.host or None, "step": n,
                "step_at_least": False, "cause": "left_early", "exception_type": c["type"],
                "message": c["message"], "where": c["where"], "signal": c["signal"], "oom_killed": None,
                "exitcode": c["exitcode"], "library": c.get("library"), "followed_by": follower.rank,
                "left_early_ranks": sorted([leaver.rank] + [r.rank for r in others]),
                "consequence_ranks": sorted(r.rank for r in failed), "independent_ranks": []}
    return {"kind": "run_failed", "severity": "critical", "why": why,
            "next_step": f"rank {leaver.rank} ran out of data (or left its training loop) first: " + LEFT_EARLY_ADVICE,
            "culprit": leaver.culprit(), "evidence": evidence,
            "reason": (f"rank {leaver.rank} finished after {steps} while {still} "
                       f"{'was' if len(failed) == 1 else 'were'} still training; "
                       f"rank {follower.rank}'s error followed")}


def failure_began(ranks: Sequence[RankSummary]) -> Optional[float]:
    """When the run's first failure was seen (epoch seconds), None when no rank failed. What was
    measured over a span reaching past it covers the failure's own stall (a rank waiting for a
    dead peer, its DataLoader shut down, the process exiting): the performance verdicts must not
    read that as the run's behaviour (summary.cpu_threads_of keeps only what came before)."""
    return min((r.failed_at for r in ranks if r.status in FAILED_ENDINGS and r.status != "never_joined"
                and r.failed_at is not None), default=None)


def _node_verdict(nf: NodeFailure, failed: Sequence[RankSummary], causes: dict[int, dict[str, Any]],
                  real: Sequence[RankSummary]) -> dict[str, Any]:
    """The failure verdict when a node's launcher or torchrun failed first (status.node_failures)."""
    if nf.cause == "torchrun_killed":
        code = f" (its launcher exited with exit code {nf.exit_code})" if nf.exit_code is not None else ""
        what = f"torchrun was killed by {nf.signal}{code}"
        reason = (f"node {nf.node}'s torchrun was killed by {nf.signal}"
                  + (f" (exit code {nf.exit_code})" if nf.exit_code is not None else ""))
        nxt = (f"find who killed torchrun on {nf.name}: the node's kernel log (dmesg) for the OOM killer, "
               "the scheduler's log (sacct -j JOB -o State,ExitCode,MaxRSS), a health check or a user; "
               "the other ranks' errors followed from it")
    else:
        what = ("its TraceML launcher vanished: its connection closed without a goodbye (the launcher was "
                "killed, or the node was lost)")
        reason = f"node {nf.node}'s launcher vanished"
        nxt = (f"check {nf.name}: whether its `traceml run` was killed (a user, the OOM killer: dmesg) or "
               "the node failed (sinfo -R, scontrol show node); the other ranks' errors followed from it")
    own = [r for r in failed if r.node == nf.node and r not in real]
    independent = [r for r in failed if r not in own and r in real]
    consequences = [r for r in failed if r not in own and r not in real]
    steps = [causes[r.rank]["step"] for r in failed if causes[r.rank]["step"] is not None]
    parts = [f"{nf.name}: {what}" + (f", around step {max(steps)}" if steps else "")]
    if own:
        parts.append(f"its {ranks_phrase([r.rank for r in own])} ended with it")
    if independent:
        parts.append(f"{ranks_phrase([r.rank for r in independent])} also failed with an error of "
                     + ("its own" if len(independent) == 1 else "their own"))
    if consequences:
        kinds = sorted({causes[r.rank]["consequence"] or "stopped after the first failure" for r in consequences})
        parts.append(f"{ranks_phrase([r.rank for r in consequences])} failed as a consequence ("
                     + "; ".join(kinds[:3]) + ")")
    for r in failed:
        r.failure = {"role": "independent" if r in real else "consequence",
                     **{k: v for k, v in causes[r.rank].items() if k not in ("step_words", "step_short", "step_at_least")}}
    evidence = {"first_rank": None, "node": nf.node, "host": nf.host, "step": max(steps) if steps else None,
                "step_at_least": False, "cause": nf.cause, "exception_type": None, "message": None,
                "where": None, "signal": nf.signal, "oom_killed": None, "exitcode": nf.exit_code,
                "consequence_ranks": sorted(r.rank for r in own + consequences),
                "independent_ranks": sorted(r.rank for r in independent)}
    return {"kind": "run_failed", "severity": "critical", "why": "; ".join(parts), "next_step": nxt,
            "culprit": {"rank": None, "node": nf.node, "host": nf.host}, "evidence": evidence,
            "reason": reason}


def _reached_a_step(r: RankSummary) -> bool:
    return bool(r.steps or r.steps_produced or (type(r.fail_step) is int and r.fail_step > 0))


def did_not_start(ranks: Sequence[RankSummary], failure: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A failed run in which no rank reached its first step, as one headline: ``did_not_start``,
    the first failure's cause in one paragraph (Python's own error with file and line where
    there is one; from TraceML's exception hook, or from torchrun's record of the worker when it
    failed before TraceML started in it), and nothing about steps, peers or performance: no
    worker trained, so "failed as a consequence", "too few steps" and "add trace_step" would
    all mislead. None when some rank completed a step (then it is a failure during training)."""
    ev = failure["evidence"]
    if ev.get("first_rank") is None or any(_reached_a_step(r) for r in ranks):
        return None  # (or a node's launcher or torchrun failed first: its verdict says so)
    first = next(r for r in ranks if r.rank == ev["first_rank"])
    c = first.failure or {}
    failed = [r for r in ranks if r.failure]
    who = first.name
    if ev["cause"] == "exception":
        where = f" at {ev['where']}" if ev.get("where") else ""
        what = f"{who} raised {ev['exception_type'] or 'an exception'}{where}" + (
            f": {ev['message']}" if ev.get("message") else "")
        short = f"rank {first.rank} raised {ev['exception_type'] or 'an exception'}{where}" + (
            f": {ev['message']}" if ev.get("message") else "")
    elif ev["cause"] == "never_joined":
        what = (f"{who} ended before TraceML started in it (before the script imported torch or "
                "called traceml.init()), without an error TraceML could read")
        short = f"rank {first.rank} ended before TraceML started in it"
    else:
        # (the words of where it failed are not kept in the summary: classify it again)
        # (the words of where it failed are not kept in the summary, and no rank had a step)
        what, short = describe(first, {**classify(first, None), **c, "step_words": "", "step_short": ""}, None)
    same = [r for r in failed if r is not first and (r.failure or {}).get("type") == ev.get("exception_type")
            and (r.failure or {}).get("message") == ev.get("message")
            and (r.failure or {}).get("said") == ev.get("said") and ev["cause"] in ("exception", "exit")]
    others = [r for r in failed if r is not first and r not in same]
    why = f"no rank reached its first step: {what}"
    if same and not others:
        why += f"; {'the other rank' if len(same) == 1 else f'all {len(same)} other ranks'} failed the same way"
    elif same or others:
        why += f"; {ranks_phrase([r.rank for r in same + others])} failed too (see each rank below)"
    etype = ev.get("exception_type") or ""
    if ev["cause"] == "exception" and etype in ("ModuleNotFoundError", "ImportError"):
        nxt = ("install the missing module into the environment the workers run in (the Python that "
               "runs `traceml run`), or fix the import" + (f" at {ev['where']}" if ev.get("where") else "")
               + "; nothing was trained")
    elif ev["cause"] == "exception":
        nxt = (f"fix the {etype or 'error'}" + (f" at {ev['where']}" if ev.get("where") else "")
               + f": Python's traceback is in rank {first.rank}'s output above; nothing was trained")
    elif ev.get("said"):
        nxt = (f"fix what rank {first.rank}'s script said before its first step (its output above; run it "
               "with plain python to see it alone); nothing was trained")
    else:
        nxt = (f"rank {first.rank}'s output above says why it stopped before its first step "
               "(run the script with plain python to see it alone); nothing was trained")
    return {"kind": "did_not_start", "severity": "critical", "why": why, "next_step": nxt,
            "culprit": failure["culprit"], "evidence": {**ev, "same_error_ranks": [r.rank for r in same]},
            "reason": "did not start: " + short}


def _next_step(first: RankSummary, c: dict[str, Any]) -> str:
    r = first.rank
    lib = c.get("library") or {}
    if c["cause"] == "collective_mismatch" or lib.get("kind") == "mismatch":
        return MISMATCH_ADVICE
    if c["cause"] == "exception":
        return (f"fix the error on rank {r}: its traceback is in its output above and in "
                f"final_summary.json (ranks[{r}].last_events); the other ranks' errors followed from it")
    if c["cause"] == "oom":
        return ("give the job more memory (Slurm --mem / --mem-per-gpu) or use less host memory per "
                "rank: fewer DataLoader workers or a smaller prefetch_factor, no dataset cached in "
                "RAM per rank; the memory peak per rank is below")
    if c["cause"] == "signal" and c["signal"] == "SIGKILL":
        return ("find who killed it: the scheduler's log (sacct -j JOB -o State,ExitCode,MaxRSS), "
                "the node's kernel log (dmesg) for the OOM killer, or a health check")
    if c["cause"] == "exit":
        return f"see why rank {r}'s script exited with that status (its output above)"
    if c["cause"] == "never_joined":
        return (f"see rank {r}'s output above for why it never started; a script without "
                "traceml.init() cannot report")
    if lib:
        return (f"{lib['library']}'s message above (in rank {r}'s output) says what failed; rank {r} "
                "died in native code, so there is no Python traceback")
    return (f"torchrun's output above shows rank {r}'s exit code or signal; a crash inside native "
            "code (a segfault in an extension) leaves no Python traceback")
