"""Rank lists in words: the one notation every sentence, table and report uses.

Consecutive ranks are runs (``0-3,7,9-12``): exact, and short however large the job, since ranks
that fail or stall together are usually neighbours (a node's ranks, a whole node group). Very
irregular lists are cut after ``most`` runs and say how many runs were left out.
"""

from __future__ import annotations

from typing import Iterable

#: past this many ranks a phrase also gives the count ("12 ranks (0-11)")
COUNT_FROM = 8


def rank_ranges(ranks: Iterable[int], most: int = 0) -> str:
    """``0-3,7``; with ``most``, at most that many runs, then ``,... (N more runs)``."""
    out: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if start is None:
            start = prev = r
        elif r == prev + 1:  # type: ignore[operator]
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    if most and len(out) > most:
        return ",".join(out[:most]) + f",... ({len(out) - most:,} more runs)"
    return ",".join(out)


def ranks_phrase(ranks: Iterable[int], most: int = 8) -> str:
    """``rank 3``, ``ranks 0-3,7``, or with many ranks ``12 ranks (0-11)``."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    ranges = rank_ranges(rs, most)
    if len(rs) >= COUNT_FROM:
        return f"{len(rs):,} ranks ({ranges})"
    return f"ranks {ranges}"


__all__ = ["rank_ranges", "ranks_phrase"]
