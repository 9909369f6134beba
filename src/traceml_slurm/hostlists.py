"""Thin wrapper over python-hostlist: Slurm's separators, duplicates, bounds and errors in Slurm's terms.

Slurm's own parser (``scontrol show hostnames``) separates hosts by commas AND whitespace:
``alpha beta gamma`` is three hosts, ``node[1-2] node3`` is node1..node3. We do the same (joining
the words would make one host ``alphabetagamma``). Whitespace inside brackets is refused: Slurm
reads ``node[1-2, 3]`` as node1, node2, node03, which nobody means. Expansion is bounded by
:data:`traceml_core.limits.NODES`, so a list such as ``node[1-99999999]`` is an error, not a
memory bomb.
"""

from __future__ import annotations

import re

import hostlist

from traceml_core import limits
from traceml_core.errors import ConfigError

_TASKS_ITEM = re.compile(r"^\s*(\d{1,18})\s*(?:\(x\s*(\d{1,18})\s*\))?\s*$")


def _commas(text: str, variable: str) -> str:
    """Slurm's separators (commas, whitespace outside brackets) as commas."""
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch.isspace():
            if depth:
                raise ConfigError(
                    f"{variable}={text[:200]!r} has whitespace inside [...], which Slurm would read as zero "
                    f"padding (node[1-2, 3] is node1, node2, node03). Remove the spaces inside the brackets.",
                    variable=variable)
            ch = ","
        out.append(ch)
    return ",".join(p for p in "".join(out).split(",") if p)


def expand_nodelist(text: str, variable: str) -> list[str]:
    """Expand a Slurm node list (``node[01-03,7] gpu-a[1-2]``) in Slurm's order, without duplicates.

    Raises ConfigError naming ``variable`` when the list is empty, malformed or longer than
    :data:`~traceml_core.limits.NODES` allows.
    """
    if len(text) > limits.NODELIST_CHARS.hi:
        raise ConfigError(
            f"{variable} is {len(text):,} characters long, more than a Slurm node list can be "
            f"({limits.NODELIST_CHARS.hi:,}). Check what set it, or pass --master-addr explicitly.",
            variable=variable)
    compact = _commas(text, variable)
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
        what = ("more hosts than TraceML supports (" + f"{limits.NODES.hi:,}; {limits.NODES.why})"
                if "too large" in str(exc) else f"{exc}")
        raise ConfigError(
            f"{variable}={text[:200]!r} is not a valid Slurm node list ({what}). Expected a form such as "
            f"'node[01-04],gpu7'. Check what set it, or pass --master-addr explicitly.",
            variable=variable,
        ) from None
    seen: set[str] = set()
    ordered = [h for h in hosts if h and not (h in seen or seen.add(h))]
    if not ordered:
        raise ConfigError(f"{variable}={text!r} names no host.", variable=variable)
    if len(ordered) > limits.NODES.hi:
        raise ConfigError(
            f"{variable}={text[:200]!r} names {len(ordered):,} hosts, more than TraceML supports "
            f"({limits.NODES.hi:,}; {limits.NODES.why}).", variable=variable)
    return ordered


def tasks_per_node(text: str, variable: str) -> list[tuple[int, int]]:
    """Slurm's compressed per-node counts as ``(count, nodes)`` runs (``2(x3),1`` -> ``[(2, 3), (1, 1)]``),
    never expanded: ``1(x99999999999)`` is refused by the node bound, not allocated."""
    runs: list[tuple[int, int]] = []
    total = 0
    for item in text.split(","):
        m = _TASKS_ITEM.match(item)
        if not m:
            raise ConfigError(
                f"{variable}={text[:200]!r} is not in Slurm's per-node count form (for example '2(x3),1'). "
                f"It is set by Slurm; if you set it yourself, unset it.",
                variable=variable,
            )
        count, nodes = int(m.group(1)), int(m.group(2) or 1)
        total += nodes
        if total > limits.NODES.hi:
            raise ConfigError(
                f"{variable}={text[:200]!r} describes more than {limits.NODES.hi:,} nodes "
                f"({limits.NODES.why}). It is set by Slurm; if you set it yourself, unset it.",
                variable=variable)
        runs.append((count, nodes))
    return runs


def expand_tasks_per_node(text: str, variable: str) -> list[int]:
    """Expand Slurm's compressed per-node counts (``2(x3),1`` -> ``[2, 2, 2, 1]``), bounded by the
    node limit."""
    return [count for count, nodes in tasks_per_node(text, variable) for _ in range(nodes)]


def compress_hosts(hosts: list[str]) -> str:
    """``node[3,7]``: hosts as one Slurm host list (what ``--exclude`` and ``--nodelist`` take)."""
    return hostlist.collect_hostlist(sorted(set(hosts)))


#: a Slurm node name as the node store keeps and prints it: letters, digits, ``.``, ``_``, ``-``
#: (what Slurm's own node names and DNS names use), at most 255 characters. Anything else (a
#: newline, a comma, a bracket, a space) could forge a line of a log or summary, or break the
#: ``#SBATCH --exclude`` line it would be pasted into.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


def is_host_name(name: object) -> bool:
    """Whether ``name`` is a host name the node store may keep and print (:data:`HOST_NAME`)."""
    return isinstance(name, str) and HOST_NAME.fullmatch(name) is not None


def shown(text: object, limit: int = 80) -> str:
    """``text`` fit to quote in one line of a note: its ``repr``, cut to ``limit`` characters."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit - 4] + "...'"
