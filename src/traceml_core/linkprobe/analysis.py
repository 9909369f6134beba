"""Judging a link probe: pure functions from measured transfers to per-node rates and the slow node.

Passive timings cannot find a slow link in a ring all-reduce: every rank waits equally for the
slowest hop. So the node launchers measure actively (see :mod:`.probe`): in round 1 every node
sends to the next one (ring order), in round 2 to the previous one, all pairs of a round at once.
Each node thus sends to two different peers and receives from two different peers, and:

* a node whose **sending** is slow (a degraded NIC or cable, a rate limit on its egress) is slow
  in both of its sends while each of its receivers still receives fast from its other peer, so
  the best of a node's sends names it;
* likewise the best of a node's receives names a node whose **receiving** is slow.

With two nodes each node has one peer, so a slow pair cannot be pinned on either end: the summary
then names the slow *direction* (``slow_link``), not a node. A node is slow when its best rate in
one direction is below ``PROBE_SLOW_FRACTION`` of the median of the other nodes' best rates in
that direction (thresholds.py says why).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

from ..report.stats import median
from ..report.thresholds import PROBE_SLOW_FRACTION


@dataclass(frozen=True)
class Pair:
    """One measured transfer: node ``src`` sent ``nbytes`` to node ``dst`` in ``seconds``."""

    src: int
    dst: int
    nbytes: int = 0
    seconds: float = 0.0
    error: Optional[str] = None

    @property
    def gbps(self) -> Optional[float]:
        """10^9 bytes per second (the unit of nccl-tests' bandwidths), None when it failed."""
        if self.error is not None or self.seconds <= 0 or self.nbytes <= 0:
            return None
        return self.nbytes / self.seconds / 1e9


def schedule(nnodes: int) -> list[list[tuple[int, int]]]:
    """The probe's rounds: ``[(src, dst), ...]`` per round; every pair of a round runs at once."""
    if nnodes < 2:
        return []
    forward = [(i, (i + 1) % nnodes) for i in range(nnodes)]
    if nnodes == 2:
        return [[(0, 1)], [(1, 0)]]   # one direction at a time: each direction has the link alone
    backward = [(i, (i - 1) % nnodes) for i in range(nnodes)]
    return [forward, backward]


def _best(pairs: Sequence[Pair], node: int, side: str) -> Optional[float]:
    rates = [p.gbps for p in pairs if getattr(p, side) == node and p.gbps is not None]
    return max(rates) if rates else None


def analyse(pairs: Sequence[Pair], hosts: Sequence[str], *, bytes_per_pair: int,
            seconds: float) -> dict[str, Any]:
    """The summary's ``communication.probe`` section (docs/summary-schema.md)."""
    nnodes = len(hosts)

    def host(n: int) -> Optional[str]:
        return hosts[n] if 0 <= n < nnodes and hosts[n] else None

    nodes = [{"node": n, "host": host(n), "gbps": _r(_best(pairs, n, "src")),
              "recv_gbps": _r(_best(pairs, n, "dst"))} for n in range(nnodes)]
    slow_node, slow_link = None, None
    candidates = []
    for key, direction in (("gbps", "send"), ("recv_gbps", "receive")):
        for nd in nodes:
            mine = nd[key]
            others = [o[key] for o in nodes if o is not nd and o[key] is not None]
            if mine is None or not others:
                continue
            ref = median(others) or 0.0
            if ref > 0 and mine < PROBE_SLOW_FRACTION * ref:
                candidates.append((mine / ref, nd, direction, ref))
    if candidates and nnodes >= 3:
        ratio, nd, direction, ref = min(candidates, key=lambda c: c[0])
        slow_node = {"node": nd["node"], "host": nd["host"], "gbps": nd["gbps" if direction == "send"
                                                                       else "recv_gbps"],
                     "others_gbps": _r(ref), "direction": direction, "ratio": round(ratio, 4)}
    elif candidates:
        # two nodes: the slow direction, not a culprit (either end could be at fault)
        slow = min((p for p in pairs if p.gbps is not None), key=lambda p: p.gbps or 0.0)
        fast = [p.gbps for p in pairs if p.gbps is not None and p is not slow]
        slow_link = {"src": slow.src, "dst": slow.dst, "src_host": host(slow.src),
                     "dst_host": host(slow.dst), "gbps": _r(slow.gbps),
                     "others_gbps": _r(median(fast)) if fast else None}
    return {
        "bytes_per_pair": bytes_per_pair, "seconds": round(seconds, 3), "error": None,
        "pairs": [{**asdict(p), "gbps": _r(p.gbps), "src_host": host(p.src), "dst_host": host(p.dst)}
                  for p in pairs],
        "nodes": nodes, "slow_node": slow_node, "slow_link": slow_link,
    }


def suspect_pairs(section: dict[str, Any]) -> list[tuple[int, int]]:
    """The transfers behind a node or direction :func:`analyse` named, to measure again before
    the name stands: a slow sender's sends, a slow receiver's receives, a slow direction and its
    reverse."""
    pairs = [(p["src"], p["dst"]) for p in section.get("pairs") or [] if p.get("error") is None]
    slow, link = section.get("slow_node"), section.get("slow_link")
    if slow:
        side = 0 if slow["direction"] == "send" else 1
        return [p for p in pairs if p[side] == slow["node"]]
    if link:
        return [p for p in pairs if {p[0], p[1]} == {link["src"], link["dst"]}]
    return []


#: confirmation passes at most before a slow node or direction is named. Noise only ever slows a
#: transfer (a busy CPU, other traffic), so the best of a few measurements is the link; a pass
#: measures only the transfers still suspect, so a link that is really slow costs every pass and
#: one slowed by a moment's load usually clears in the first (one pass named a direction at 0.82
#: against 1.66 GB/s between two idle links on a loaded 2-core machine)
CONFIRM_PASSES = 3


def confirm(pairs: Sequence[Pair], judge: Callable[[Sequence[Pair]], dict[str, Any]],
            again: Callable[[tuple[int, int]], Optional[Pair]],
            passes: int = CONFIRM_PASSES) -> Optional[dict[str, Any]]:
    """Judge ``pairs``; while someone is named, measure the suspect transfers ``again`` (up to
    ``passes`` times), keep each one's best, and judge again. None when ``again`` gave up (the
    probe was stopped)."""
    pairs = list(pairs)
    section = judge(pairs)
    for _ in range(passes):
        suspect = suspect_pairs(section)
        if not suspect:
            break
        for pair in suspect:
            got = again(pair)
            if got is None:
                return None
            pairs = [best_of(p, got) if (p.src, p.dst) == pair else p for p in pairs]
        section = judge(pairs)
    return section


def best_of(a: Pair, b: Pair) -> Pair:
    """One pair measured twice: the faster measurement (noise only ever slows a transfer)."""
    if b.gbps is None:
        return a
    if a.gbps is None or b.gbps > a.gbps:
        return b
    return a


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 4)


def failed(why: str) -> dict[str, Any]:
    """The probe section when the probe could not run at all."""
    return {"bytes_per_pair": 0, "seconds": 0.0, "error": why, "pairs": [], "nodes": [],
            "slow_node": None, "slow_link": None}
