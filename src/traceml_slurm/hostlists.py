"""Thin wrapper over python-hostlist: whitespace, duplicates and errors in Slurm's terms."""

from __future__ import annotations

import re

import hostlist

from traceml_core.errors import ConfigError

_TASKS_ITEM = re.compile(r"^\s*(\d+)\s*(?:\(x\s*(\d+)\s*\))?\s*$")


def expand_nodelist(text: str, variable: str) -> list[str]:
    """Expand a Slurm node list (``node[01-03,7],gpu-a[1-2]``) in Slurm's order, without duplicates.

    Raises ConfigError naming ``variable`` when the list is empty or malformed.
    """
    compact = "".join(text.split())
    if not compact:
        raise ConfigError(
            f"{variable} is empty, so there is no node to use as the master. It is set by Slurm inside "
            f"a job; run `traceml run` through `srun` inside an sbatch/salloc allocation, or pass "
            f"--master-addr explicitly.",
            variable=variable,
        )
    try:
        hosts = hostlist.expand_hostlist(compact)
    except hostlist.BadHostlist as exc:
        raise ConfigError(
            f"{variable}={text!r} is not a valid Slurm node list ({exc}). Expected a form such as "
            f"'node[01-04],gpu7'. Check what set it, or pass --master-addr explicitly.",
            variable=variable,
        ) from None
    seen: set[str] = set()
    ordered = [h for h in hosts if h and not (h in seen or seen.add(h))]
    if not ordered:
        raise ConfigError(f"{variable}={text!r} names no host.", variable=variable)
    return ordered


def expand_tasks_per_node(text: str, variable: str) -> list[int]:
    """Expand Slurm's compressed per-node counts (``2(x3),1`` -> ``[2, 2, 2, 1]``)."""
    counts: list[int] = []
    for item in text.split(","):
        m = _TASKS_ITEM.match(item)
        if not m:
            raise ConfigError(
                f"{variable}={text!r} is not in Slurm's per-node count form (for example '2(x3),1'). "
                f"It is set by Slurm; if you set it yourself, unset it.",
                variable=variable,
            )
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts
