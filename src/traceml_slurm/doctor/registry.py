"""All checks in presentation order, and running a list of them on one node with timing.

A check that raises is a failed check naming the exception (a bug of ours, reported as such), never
a crash of the doctor; ``--ignore`` takes exact ids or a whole group (``gpu`` or ``gpu.*``).
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

from . import context, controller, crossnode, filesystem, gpu, network, software, walltime
from .model import TORCH_CHECKS, CheckSpec, Outcome, Status, failed, is_ignored
from .node import NodeContext

LOCAL_SPECS: tuple[CheckSpec, ...] = (
    context.CHECKS + gpu.CHECKS + software.CHECKS + network.CHECKS + filesystem.CHECKS + walltime.CHECKS
    + controller.CHECKS
)
NODE_SPECS = tuple(s for s in LOCAL_SPECS if s.scope == "node")
JOB_SPECS = tuple(s for s in LOCAL_SPECS if s.scope == "job")

ALL_IDS: tuple[str, ...] = tuple(s.id for s in LOCAL_SPECS) + tuple(i for i, _ in crossnode.CROSS)
TITLES: dict[str, str] = {**{s.id: s.title for s in LOCAL_SPECS}, **dict(crossnode.CROSS)}


class UnknownCheck(ValueError):
    pass


def parse_ignore(text: Optional[str]) -> frozenset[str]:
    """``a.b,gpu`` -> the ids; raises UnknownCheck naming what matches nothing."""
    if not text:
        return frozenset()
    items = [p.strip() for p in text.split(",") if p.strip()]
    groups = {i.split(".", 1)[0] for i in ALL_IDS}
    bad = [i for i in items if i not in ALL_IDS and i.rstrip(".*") not in groups]
    if bad:
        raise UnknownCheck(f"--ignore names unknown check(s): {', '.join(bad)}. Known ids: {', '.join(ALL_IDS)} "
                           f"(or a group: {', '.join(sorted(groups))}).")
    return frozenset(items)


def run_checks(specs: Iterable[CheckSpec], ctx: NodeContext) -> dict[str, Outcome]:
    """Run ``specs`` (skipping ignored ones) on this node; the torch child starts first."""
    specs = [s for s in specs if not is_ignored(s.id, ctx.options.ignore)]
    if any(s.id in TORCH_CHECKS for s in specs):
        ctx.start_background()
    if any(s.group in ("ctl", "time") for s in specs):
        controller.answers(ctx).start()  # every question to the controller at once, in the background
    out: dict[str, Outcome] = {}
    # the torch checks last: everything else (scontrol calls, sockets, files) runs while torch imports
    for spec in sorted(specs, key=lambda s: s.id in TORCH_CHECKS):
        t0 = time.perf_counter()
        try:
            outcome = spec.run(ctx)
        except Exception as exc:  # noqa: BLE001 - a bug in a check must not stop the others
            outcome = failed(f"the check itself crashed: {type(exc).__name__}: {exc}",
                             "This is a bug in traceml's doctor: please report it with this line; --ignore "
                             f"{spec.id} skips it meanwhile.")
        outcome.duration_s = time.perf_counter() - t0
        out[spec.id] = outcome
    return out


__all__ = ["ALL_IDS", "JOB_SPECS", "LOCAL_SPECS", "NODE_SPECS", "Status", "TITLES", "TORCH_CHECKS", "UnknownCheck", "is_ignored",
           "parse_ignore", "run_checks"]
