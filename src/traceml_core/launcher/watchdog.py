"""Node 0's watchdog: what the monitor loop checks once a second while the workers run.

It reads the aggregator's ``status`` (through the :class:`~.keeper.AggregatorKeeper`) and acts:

* **nodes**: a node that never joins, or whose launcher vanishes, ends the run only when training
  is provably stuck (no step reached the aggregator for ``aggregator_wait`` seconds): telemetry
  trouble alone never stops a healthy run;
* **hung ranks** (``--hang-timeout``, off by default): a rank that is still connected and has not
  finished sent no step for that long: the run is stopped, exit status 124;
* **the hang detection's lines** (aggregator/hangwatch.py decides, on node 0's aggregator): a hang
  named with its ranks, node and place, a rank working through a long pause; printed as they
  come (the status carries the lines after the last one printed).

At the end it says what failed from node 0's point of view (:meth:`Watchdog.failure_reason`), which
:func:`.outcome.judge` puts in the run's reason. See docs/reliability.md.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..config import LaunchConfig
from .keeper import AggregatorKeeper
from .supervise import log
from .token import Token, disagreement_hint

#: seconds between two status queries of node 0's launcher
WATCH_INTERVAL_S = 1.0
#: how many nodes a log line names one by one; the rest are counted (a line stays readable, and a
#: 65,536-node run does not write megabytes of log)
NAMED_NODES = 8


def node_names(nodes: list[int], hosts: dict) -> str:
    """``node 3 (gpu07), node 5`` for at most NAMED_NODES nodes, then ``and N more (nodes a-b,...)``."""
    def name(n: int) -> str:
        return f"node {n}" + (f" ({hosts[str(n)]})" if str(n) in hosts else "")

    text = ", ".join(name(n) for n in nodes[:NAMED_NODES])
    if len(nodes) > NAMED_NODES:
        rest = sorted(nodes[NAMED_NODES:])
        text += f" and {len(rest):,} more (nodes {rest[0]}-{rest[-1]})" if rest[-1] - rest[0] + 1 == len(rest) \
            else f" and {len(rest):,} more"
    return text


class Watchdog:
    def __init__(self, config: LaunchConfig, token: Token, keeper: AggregatorKeeper,
                 stop: Callable[[str], None], relay_flush_s: Optional[float] = None) -> None:
        """``stop(reason)``: stops the workers (the starter's terminate); ``relay_flush_s``: how
        long node 0's relay holds steps before it passes them on (None: no relay)."""
        self.config = config
        self.token_info = token
        self.keeper = keeper
        self.stop = stop
        self.relay_flush_s = relay_flush_s
        self.started = time.monotonic()
        self._next_watch = 0.0
        self._last_records = -1
        self._last_progress = time.monotonic()
        self._failure: Optional[str] = None
        self.failed_nodes: list[int] = []
        #: the hang watchdog stopped the run (the launcher then exits with HANG_EXIT_CODE)
        self.hung = False
        #: the hang detection runs in the aggregator (aggregator/hangwatch.py); its lines are
        #: printed here, after the last one printed
        self.watching = config.hang_report_after != "off"
        self._notice = 0

    def training_started(self) -> None:
        """The workers were told to go: the node-join window and the progress clock start now."""
        self.started = time.monotonic()
        self._last_progress = time.monotonic()

    def tick(self) -> None:
        """Called by the monitor loop while the workers run."""
        hang = self.config.hang_timeout
        if self.keeper.handle is None or self._failure is not None or (self.config.nnodes == 1 and not hang
                                                                       and not self.watching):
            return
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_INTERVAL_S
        # a hang report being taken over the control connection: next tick
        status = self.keeper.status(wait=False, notices_after=self._notice)
        if status is None:
            return  # no aggregator to ask: telemetry trouble alone never stops a run
        self._print_notices(status)
        if hang and self._check_hang(status, hang):
            return
        if self.config.nnodes == 1:
            return
        records = int(status.get("records", 0))
        if records != self._last_records:
            self._last_records, self._last_progress = records, now
        stalled = now - self._last_progress
        wait = self.config.aggregator_wait
        joined = set(status.get("nodes_joined", []))
        missing = [n for n in range(self.config.nnodes) if n not in joined]
        lost = list(status.get("nodes_lost", []))
        hosts = self._hosts(status)
        if missing and now - self.started > wait and stalled > wait:
            self._fail(missing, hosts, f"never joined within {wait:.0f} s" + self._refused_note(status))
        elif lost and stalled > min(wait, 30.0):
            self._fail(lost, hosts, f"vanished (its launcher's connection closed) and training has made "
                                    f"no progress for {stalled:.0f} s")

    def _print_notices(self, status: dict) -> None:
        for entry in status.get("notices") or []:
            if isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int and entry[0] > self._notice:
                self._notice = entry[0]
                log(str(entry[1]))

    def take_hang_report(self, silent_s: float, threshold_s: float, source: str) -> Optional[dict[str, Any]]:
        """The hang report of this silence (the one the aggregator declared, else one taken now),
        printed to the log when it is new; the aggregator keeps it for the summary."""
        from ..report.hang import render

        report = self.keeper.autopsy(silent_s, threshold_s, source)
        if report is None:
            log(f"warning: no rank completed a step for {silent_s:.0f} s, but the hang report could not "
                "be taken (no answer from the aggregator)")
            return None
        if not report.get("rule"):      # a declared one was printed when it was declared
            for line in render(report):
                log(line)
        return report

    def _check_hang(self, status: dict, hang: float) -> bool:
        """The hang watchdog (``--hang-timeout``): a rank that has stepped, has not said bye and
        is still connected sent no step for ``hang`` seconds. Stops the workers, naming the ranks."""
        silent = [s for s in status.get("silent") or [] if isinstance(s, list) and len(s) >= 5]
        # relayed steps reach the aggregator once per merge window: silence that short is not a hang
        slack = self.relay_flush_s + WATCH_INTERVAL_S if self.relay_flush_s is not None else 0.0
        if not silent or not silent[0][1] > hang + slack:
            return False
        stuck = [s for s in silent if s[1] > hang + slack]
        names = "; ".join(f"rank {r} (node {n}, {h or '?'}) after {steps} steps, silent {age:.0f} s"
                          for r, age, steps, n, h in stuck)
        more = "" if len(stuck) < len(silent) or len(silent) < 8 else " (and maybe more)"
        src = self.config.flag_source("hang_timeout")
        self.hung = True
        self._failure = (f"training looks hung: no step for more than {hang:g} s from {names}{more}; "
                         f"stopped by the hang watchdog ({src}={hang:g})")
        # where every rank is stuck, taken before the workers are stopped (the aggregator answers
        # with the report it declared for this silence, if any)
        if self.watching:
            status = self.keeper.status(notices_after=self._notice)
            if status is not None:
                self._print_notices(status)
            self.take_hang_report(silent[0][1], hang, f"{src}={hang:g}")
        self.stop(self._failure)
        return True

    def _refused_note(self, status: dict) -> str:
        """Why a node may not have joined: its hellos were refused (tokens that differ)."""
        refused = int(status.get("refused") or 0)
        if not refused:
            return ""
        return (f" (node 0 refused {refused} connection(s) that did not authenticate; "
                f"{disagreement_hint(self.token_info)})")

    def _hosts(self, status: dict) -> dict[str, str]:
        """Hostnames by node: what joined nodes said, else what the cluster plugin listed (so a
        node that never joined is still named)."""
        known = {str(n): h for n, h in enumerate(self.config.hosts_by_node)}
        return {**known, **(status.get("hosts") or {})}

    def _fail(self, nodes: list[int], hosts: dict, what: str) -> None:
        self.failed_nodes = nodes
        self._failure = f"{node_names(nodes, hosts)} {what}"
        self.stop(self._failure)

    def failure_reason(self) -> Optional[str]:
        """Why the run failed from node 0's point of view: the hang, or a node that never joined,
        vanished or failed."""
        if self._failure is not None or self.config.nnodes == 1:
            return self._failure
        status = self.keeper.status()
        if not status:
            return None
        hosts = self._hosts(status)

        parts = []
        failed = {int(n): code for n, code in status.get("nodes_failed", {}).items()}
        if failed:
            shown = sorted(failed.items())
            parts.append(", ".join(f"{node_names([n], hosts)} failed (exit code {code})"
                                   for n, code in shown[:NAMED_NODES])
                         + (f" and {len(shown) - NAMED_NODES:,} more nodes failed" if len(shown) > NAMED_NODES else ""))
        lost = [n for n in status.get("nodes_lost", []) if n not in failed]
        if lost:
            parts.append(node_names(lost, hosts) + " vanished (its launcher's connection closed)")
        joined = set(status.get("nodes_joined", []))
        missing = [n for n in range(self.config.nnodes) if n not in joined]
        if missing:
            parts.append(node_names(missing, hosts) + " never joined" + self._refused_note(status))
        self.failed_nodes = sorted(set(failed) | set(lost) | set(missing))
        return "; ".join(parts) or None
