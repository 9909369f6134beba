"""Causes and consequences, declared: how findings relate, whatever order the rules ran in.

Every rule finds what it finds on its own (no rule reads another's finding). Then this graph is
applied to what was found:

* a **link** says that a cause, found *where* its effect is, explains it: the cause is listed
  right before the effect, and the effect says so (``evidence.explained_by``); where the effect
  is only the cause seen from another side (the rank whose DataLoader paces an input-bound run is
  slower *in its input*), it is demoted to information;
* a **contradiction** drops a verdict that cannot stand beside another one found ("the time goes
  into the model's own work" beside "the ranks wait for one rank").

"Where": the same rank; for a cause of a node (more threads than cores on a node) the effect's
rank on that node; for a cause or effect of the whole run, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .. import thresholds as T
from .base import SEVERITIES, Finding

#: what an explained effect becomes
EXPLAINED, INFO = "explained", "info"


def same_place(cause: Finding, effect: Finding, node_of: dict[int, Any]) -> bool:
    """Whether ``cause`` is found where ``effect`` is (see the module docstring)."""
    if cause.culprit is None:  # a cause of the whole run
        return True
    c, e = cause.culprit, effect.culprit or {}
    if c.get("rank") is not None:
        return c["rank"] == e.get("rank")
    if e.get("rank") is not None:
        return node_of.get(e["rank"]) == c.get("node")
    return True


def _input_paces(cause: Finding, effect: Finding) -> bool:
    # the run waits for data, and the straggler is the rank whose DataLoader paces it (its excess
    # is its measured wait for batches): the same wait seen from that rank. (Time between steps
    # on one rank is not linked: it may be work of that rank's own, not input.)
    return cause.evidence.source == "fetch" and getattr(effect.evidence, "phase", None) == "input"


def _threads_slow_it(cause: Finding, effect: Finding) -> bool:
    # only a straggler whose excess is mostly its wait for a core (measured) comes from too many
    # threads, or, with several threads per rank, one whose excess is where they compute (only
    # the training thread's wait is measured: an operator split over threads that wait for a core
    # takes longer on the training thread without it waiting at all)
    ev = effect.evidence
    wait = getattr(ev, "cpu_wait_ms", None)
    waited = wait is not None and wait >= T.CAUSE_SHARE * ev.excess_ms
    threaded = max(cause.evidence.threads_per_rank or [1]) > 1 and ev.phase in T.INTRA_OP_PHASES
    return waited or threaded


def _between_steps(cause: Finding, effect: Finding) -> bool:
    # one rank's periodic pauses are its excess between steps
    return getattr(effect.evidence, "phase", None) == "outside"


@dataclass(frozen=True)
class Link:
    cause: str
    effect: str
    #: why the cause explains the effect (the docs print it)
    because: str
    #: a further condition on the two findings, beyond being in the same place
    when: Optional[Callable[[Finding, Finding], bool]] = None
    #: what the effect becomes: EXPLAINED (listed after the cause, saying so) or INFO (demoted)
    becomes: str = EXPLAINED


LINKS: tuple[Link, ...] = (
    Link("memory_creep", "straggler", "a rank whose memory grows is slowed by it (allocation, a scan of a "
         "growing cache, swapping)"),
    Link("memory_creep", "work_imbalance", "a rank that scans memory it keeps growing does more work per step "
         "as it grows"),
    Link("input_bound", "straggler", "in a run that waits for data, the rank whose DataLoader is slowest "
         "paces it and is slower in its input: the same wait, seen from that rank", _input_paces, INFO),
    Link("periodic_work", "straggler", "a rank that alone pauses between steps every k steps is slower by its "
         "pauses: the same time, seen as its excess", _between_steps, INFO),
    Link("periodic_work", "work_imbalance", "a rank that alone evaluates every k steps does more work by "
         "that evaluation: the same time, seen as its excess", _between_steps, INFO),
    Link("cpu_oversubscribed", "straggler", "ranks that ask for more threads than their node has cores slow "
         "each other down at random", _threads_slow_it),
    Link("cpu_oversubscribed", "work_imbalance", "ranks that ask for more threads than their node has cores "
         "slow each other down at random", _threads_slow_it),
    Link("cpu_oversubscribed", "communication_bound", "too many threads starve gloo's communication threads"),
    Link("cpu_oversubscribed", "compute_bound", "too many threads make the model's own work slower"),
    Link("cpu_oversubscribed", "cpu_contention", "the ranks' own threads are what holds the cores"),
    Link("memory_creep", "cpu_contention", "a rank whose memory grows computes slower (allocation, page "
         "faults, a scan of what it keeps): its own, not its core's", lambda c, e: e.evidence.excused_rank is not None),
    Link("input_bound", "low_gpu_util", "GPUs that wait for data are idle"),
    Link("communication_bound", "low_gpu_util", "GPUs that wait for the network are idle"),
)

#: a verdict dropped when any of these is found: "the time goes into the model's own work"
#: cannot stand beside "ranks wait for one rank", "ranks wait for data", "ranks wait for the
#: network", "the ranks pause between steps", "the GPUs are idle" or "one rank does more work"
#: (where communication is not measured, backward includes the all-reduce wait, so a waiting
#: rank looks compute-bound)
CONTRADICTS: dict[str, tuple[str, ...]] = {
    "compute_bound": ("straggler", "work_imbalance", "input_bound", "communication_bound", "low_gpu_util",
                      "periodic_work"),
}


def causes_of(kind: str) -> list[Link]:
    """The links into ``kind``, those that make it information first: an effect that is only its
    cause seen from another side (the pacing rank of an input-bound run) is that, whatever else
    may also slow it."""
    return sorted((lk for lk in LINKS if lk.effect == kind), key=lambda lk: lk.becomes != INFO)


def explains(link: Link, cause: Finding, effect: Finding, node_of: dict[int, Any]) -> bool:
    return (link.cause == cause.kind and link.effect == effect.kind and same_place(cause, effect, node_of)
            and (link.when is None or link.when(cause, effect)))


def arrange(found: list[Finding], node_of: dict[int, Any], kinds: Sequence[str]) -> list[Finding]:
    """``found`` without the verdicts a finding contradicts, sorted by severity then ``kinds``
    order, each cause right before the first effect it explains, the effects saying so."""
    present = {f.kind for f in found}
    found = [f for f in found if not set(CONTRADICTS.get(f.kind, ())) & present]
    for effect in found:
        for link in causes_of(effect.kind):
            cause = next((c for c in found if c is not effect and explains(link, c, effect, node_of)), None)
            if cause is None:
                continue
            effect.evidence.explained_by = cause.kind
            if link.becomes == INFO:
                effect.severity = "info"
                effect.notes.append(f"demoted: {link.because}")
            break
    found.sort(key=lambda f: (SEVERITIES.index(f.severity), kinds.index(f.kind) if f.kind in kinds else 99))
    for effect in [f for f in found if f.evidence.explained_by]:
        cause = next((c for c in found if c.kind == effect.evidence.explained_by), None)
        if cause is not None and found.index(cause) > found.index(effect):
            found.remove(cause)
            found.insert(found.index(effect), cause)
    return found


#: beside a run's failure or hang (its headline), the performance verdicts of the steps before it
#: are information: the failure is what to fix, and a short run cut by a failing rank (or a busy
#: machine's few steps) makes a straggler or a slow all-reduce out of noise (a collective mismatch
#: at load 8 listed COMMUNICATION-BOUND and a critical STRAGGLER). Except a cause that can make a
#: run fail: memory that keeps growing ends in an out-of-memory kill.
MAY_FAIL_A_RUN = ("memory_creep",)


def beside_failure(kind: str, severity: str) -> str:
    """The severity a performance verdict keeps beside a failure or hang headline."""
    return severity if kind in MAY_FAIL_A_RUN else "info"

