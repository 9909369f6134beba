"""``traceml run``: one launch per process, through one lifecycle, in either layout.

:class:`NodeLaunch` drives the phases of :mod:`.lifecycle` (pre-flight -> telemetry up ->
training -> finishing -> done) with a :class:`~.starters.WorkerStarter` for the layout (torchrun
per node, or one task per GPU) and the telemetry duties the starter gives this process:

* the **aggregator keeper** (node 0, or rank 0's task; :mod:`.keeper`) starts node 0's
  aggregator before anything else, so a port clash is reported before training starts, keeps it
  alive and at the end asks it for the final summary, which it prints;
* the **node link** (every node's launcher, or local rank 0's task; :mod:`.nodelink`) starts the
  node's relay, which joins the aggregator (waiting up to ``aggregator_wait`` with backoff: node 0
  may still be in a slow ``module load``), serves the link probe, and at the end says ``bye``;
* the **watchdog** (with the keeper; :mod:`.watchdog`) runs in the monitor loop while the workers
  train.

How the launch ended becomes an exit status and a reason in one pure function
(:func:`.outcome.judge`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ..config import LaunchConfig
from ..runinfo import ENV_VAR as RUN_INFO_VAR, RunInfo
from .keeper import AggregatorKeeper
from .lifecycle import LifecycleRecord, Phase
from .memcg import OomWatch
from .nodelink import NodeLink
from .outcome import (HANG_EXIT_CODE, Outcome, WorkersEnded, allocation_start, explain_interrupt, judge,
                      scheduled_end, status_of)
from .preflight import check_master_port, check_script
from .starters import STOP_GRACE_S, WorkerStarter, make_starter
from .supervise import log
from .token import Token, resolve_token
from .watchdog import Watchdog

__all__ = ["launch", "NodeLaunch", "HANG_EXIT_CODE", "STOP_GRACE_S"]

#: seconds between two turns of the monitor loop
TICK_S = 0.2
#: node 0's launcher waits at most this long for the scheduler's answer to when the job began
#: (asked at its start, on a Slurm that does not give SLURM_JOB_START_TIME) before starting the
#: aggregator without it
ALLOCATION_ASK_S = 2.0
#: seconds a task (rank 0, or a node's local rank 0) waits, after its own worker ended, for the
#: other ranks to end; srun's --kill-on-bad-exit or DDP itself normally ends them together
OTHERS_GRACE_S = 60.0


def launch(config: LaunchConfig, script: str, script_args: Sequence[str],
           environ: Optional[Mapping[str, str]] = None, *, torchrun_args: Sequence[str] = (),
           module: bool = False, no_python: bool = False) -> int:
    """Run this process's part of the job; returns its exit status. ``torchrun_args``: torchrun
    flags passed on from the command line (runargs.py); ``module``/``no_python`` are torchrun's
    ``--module``/``--no-python``, already among them."""
    environ = os.environ if environ is None else environ
    starter = make_starter(config, environ, script, script_args, torchrun_args=torchrun_args,
                           module=module, no_python=no_python)
    return NodeLaunch(config, starter, environ).run()


class NodeLaunch:
    """One launch through the phases of :mod:`.lifecycle`; :attr:`record` says when each began."""

    def __init__(self, config: LaunchConfig, starter: WorkerStarter, environ: Mapping[str, str]) -> None:
        self.config = config
        self.starter = starter
        self.environ = environ
        self.duties = starter.duties
        self.speaks = starter.duties.speaks_for_node
        self.record = LifecycleRecord(allocation_start=config.job_start_time, restarts=config.restart_count)
        self._alloc_ask: Optional[threading.Thread] = None
        self._end_ask: Optional[threading.Thread] = None
        if self.duties.keeps_aggregator and config.job_start_time is None and config.job_id:
            # older Slurm does not give the job its start: ask the scheduler, in the background
            # (the aggregator is given the answer when it starts, so even an attempt whose
            # launcher is killed before its lifecycle record arrives has its window)
            self._alloc_ask = threading.Thread(target=self._ask_allocation_start, name="traceml-alloc-start",
                                               daemon=True)
            self._alloc_ask.start()
        self.token: Optional[Token] = None
        self.keeper: Optional[AggregatorKeeper] = None
        self.link: Optional[NodeLink] = None
        self.watchdog: Optional[Watchdog] = None
        self.oom: Optional[OomWatch] = None
        self.view: Any = None
        self._telemetry_at = 0.0
        self._training_at = 0.0

    def _early_signal(self, signum: int, at: float) -> None:
        """The early warning of ``--signal`` reached node 0's launcher: ask the cluster, in the
        background (from a signal handler), when it means to end the job, for the ledger's
        "N s before the time limit"."""
        def ask() -> None:
            end = scheduled_end(self.config)
            if end is not None and self.record.scheduled_end is None:
                self.record.scheduled_end = end

        self._end_ask = threading.Thread(target=ask, name="traceml-scheduled-end", daemon=True)
        self._end_ask.start()

    def _ask_allocation_start(self) -> None:
        start = allocation_start(self.config)
        if start is not None and self.record.allocation_start is None:
            self.record.allocation_start = start

    def run(self) -> int:
        try:
            status = self._preflight()
            if status is not None:
                return status
            code = self._train()
            return self._finish(code)
        finally:
            if self.record.phase is not Phase.DONE:
                self.record.enter(Phase.DONE)

    # -- pre-flight ------------------------------------------------------------------------------
    def _preflight(self) -> Optional[int]:
        """Refuse a launch that cannot work (PreflightError, exit status 2) before anything starts;
        an exit status here ends the launch (a signal before training)."""
        self.record.enter(Phase.PREFLIGHT)
        s = self.starter
        # step 1 (cheap): the script exists and compiles; node 0's master port is free (node 0's
        # launcher, or rank 0's task, hosts torchrun's rendezvous store); nothing has started yet
        check_script(s.script, module=s.module, no_python=s.no_python)
        if self.duties.keeps_aggregator:
            check_master_port(self.config.master_port, self.config.flag_source("master_port"),
                              self.config.nnodes)
        if self.speaks:
            for warning in self.config.warnings:
                log(f"warning: {warning}")
        s.check()
        self.token = resolve_token(self.config, self.environ)
        if self.token.warning and self.speaks:
            log(f"warning: {self.token.warning}")
        status = s.preflight()
        if status is None:
            # the OOM killer's count in the workers' memory cgroup, from before they start
            self.oom = OomWatch().start()
        return status

    # -- telemetry up, training ------------------------------------------------------------------
    def _train(self) -> int:
        """Telemetry up, then the workers, watched by the monitor loop until they end; their exit
        code. On any exception what was started is killed (and the exception goes on)."""
        c, s = self.config, self.starter
        assert self.token is not None
        self.record.enter(Phase.TELEMETRY_UP)
        if self.speaks:
            log(s.describe())
        self._telemetry_at = time.monotonic()
        try:
            if self.duties.keeps_aggregator:
                if self._alloc_ask is not None:
                    self._alloc_ask.join(ALLOCATION_ASK_S)  # asked at the launch: mostly answered by now
                self.keeper = AggregatorKeeper(c, self.token.value)
                self.keeper.start(s.script, s.script_args,  # raises before training on a clash
                                  allocation_start=self.record.allocation_start)
            relay = None
            if self.duties.links_node:
                self.link = NodeLink(c, self.token)
                upstream = self.keeper.upstream if self.keeper else (c.aggregator_host, c.aggregator_port)
                relay = self.link.join(upstream, c.aggregator_wait, s.interrupted, port=s.relay_port,
                                       announce=self.keeper is None)
                # multi-node: the bandwidth probe between the launchers (node 0 runs it before its
                # workers start; bounded, --link-probe off skips it)
                left = c.aggregator_wait - (time.monotonic() - self._telemetry_at)
                self.link.link_probe(self.keeper, left, s.interrupted)
            host, port, connect_wait = s.endpoint(relay)
            info = RunInfo(
                run_name=c.run_name, job_id=c.job_id, nnodes=c.nnodes, node_rank=c.node_rank,
                nproc_per_node=c.nproc_per_node, aggregator_host=host, aggregator_port=port,
                token=self.token.value, connect_wait=connect_wait, mode=c.mode, logs_dir=c.logs_dir,
                auto_steps=c.auto_steps,
                cpu_request=cpu_request(c.cluster, self.environ))
            if self.keeper is not None:
                self.watchdog = Watchdog(c, self.token, self.keeper, s.terminate,
                                         relay.flush_s if relay is not None else None)
            self._start_view()
            self.record.enter(Phase.TRAINING)
            self._training_at = time.monotonic()
            pipes = self.view.popen_kwargs() if self.view else {}
            s.start({RUN_INFO_VAR: info.to_env()},
                    (pipes["stdout"], pipes["stderr"]) if pipes.get("stdout") is not None else ())
            if self.duties.keeps_aggregator:
                s.on_user_signal(self._early_signal)
            if self.view:
                self.view.attach()
            if self.watchdog is not None:
                self.watchdog.training_started()
            return self._monitor(s.wait, self._tick)
        except BaseException:
            s.abort()
            raise
        finally:
            if self.view:
                self.view.stop()  # the final picture stays on screen; the summary prints below it

    def _start_view(self) -> None:
        if self.starter.live_view and self.keeper is not None:
            from ..views import start_view

            self.view = start_view(self.config, self.keeper.snapshot)  # --mode cli|dashboard, else None

    def _monitor(self, done: Callable[[float], Any], tick: Optional[Callable[[], None]],
                 deadline: Optional[float] = None) -> Any:
        """The one monitor loop: ``done(TICK_S)`` until it answers (not None), with ``tick()``
        between; None once the monotonic ``deadline`` passed."""
        while True:
            result = done(TICK_S)
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if tick is not None:
                tick()

    def _tick(self) -> None:
        """While the workers train: node 0's aggregator kept alive, and the watchdog's round."""
        if self.keeper is not None:
            self.keeper.ensure_alive()
        if self.watchdog is not None:
            self.watchdog.tick()

    # -- finishing -------------------------------------------------------------------------------
    def _finish(self, code: int) -> int:
        s, c = self.starter, self.config
        self.record.enter(Phase.FINISHING)
        if self.link is not None and self.link.first_step_at() is not None:
            self.record.first_step(self.link.first_step_at())
        hung = self.watchdog.hung if self.watchdog is not None else False
        ended = WorkersEnded(code, s.interrupted_by, hung)
        if self._end_ask is not None:   # the cluster's answer to the early warning (2 s at most)
            self._end_ask.join(ALLOCATION_ASK_S)
        self.record.signals = {signal.Signals(n).name: at for n, at in sorted(s.signals_received.items(),
                                                                              key=lambda kv: kv[1])}
        report = {**s.report(code), "oom": self.oom.report() if self.oom else None,
                  "lifecycle": self.record.to_wire()}
        wait = s.waits_for_others and ended.signal is None and not hung
        if self.speaks:
            log(s.ended_words(code, time.monotonic() - self._training_at)
                + ("; waiting for the other ranks" if wait else ""))
        text: Optional[str] = None
        try:
            if wait:   # hung ranks never end by themselves: srun ends them once this task exits
                self._monitor(self._others_ended, None, time.monotonic() + OTHERS_GRACE_S)
            failure = self.watchdog.failure_reason() if (self.watchdog and status_of(ended) != 0) else None
            failure = failure or (s.startup_error if status_of(ended) != 0 else None)  # (agent.port_taken)
            cause = None
            if ended.signal is not None and self.speaks:
                cause = explain_interrupt(c, int(ended.signal), s.interrupted_at or time.time())
            outcome = judge(ended, failure=failure, cause=cause)
            # a second SIGTERM (srun --kill-on-bad-exit, the time limit) must not kill the summary
            text = self._report(outcome, report)
        finally:
            s.close()
        if text:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
        if outcome.reason and self.speaks:
            log(f"error: {outcome.reason}" if not outcome.interrupted else f"stopped: {outcome.reason}")
        self.record.enter(Phase.DONE)
        return outcome.status

    def _others_ended(self, pause: float) -> Optional[bool]:
        """Rank 0: every rank has ended (as the aggregator sees it); a node's local rank 0: the
        node's other ranks have left its relay. None (after ``pause`` s) while they have not."""
        if self.keeper is not None:
            ended = self.keeper.all_ranks_ended()
        else:
            ended = self.link is None or self.link.ranks_connected() == 0
        if ended:
            return True
        time.sleep(pause)
        return None

    def _report(self, outcome: Outcome, report: dict[str, Any]) -> Optional[str]:
        """Node 0: the final summary's text (always written, rebuilt if need be). Others: ``bye``
        with this node's worker report (torchrun's failed workers, OOM kills)."""
        link, keeper = self.link, self.keeper
        if link is not None:
            link.stop_extras()
        if keeper is not None:
            keeper.ensure_alive()  # so the summary is the live one, with exact loss counts
            if link is not None:
                link.drain()
            text = keeper.finish(outcome.summary_exit_code(self.starter.knows_every_worker),
                                 interrupted=outcome.interrupted, reason=outcome.reason,
                                 failed_nodes=self.watchdog.failed_nodes if self.watchdog else [],
                                 report=report)
            if link is not None:
                link.close()
            return text
        if link is not None:
            status = "interrupted" if outcome.interrupted else ("clean" if outcome.status == 0 else "error")
            link.close(bye={"t": "bye", "status": status, "exit_code": outcome.status, **report})
        return None


#: the most of the cluster's CPU request a rank's event carries (the wire takes 2,000 characters)
MAX_CPU_REQUEST_CHARS = 600


def cpu_request(cluster: str, environ: Mapping[str, str]) -> Optional[dict]:
    """What the cluster plugin says the scheduler gave each task in CPUs (for the input-bound
    verdict's CPU cause, report/cpubinding.py); None where no plugin or it does not know. Never
    raises: telemetry must not cost the launch."""
    if not cluster or cluster == "none":
        return None
    try:
        import json

        from ..plugins import load_cluster_environment

        cls = load_cluster_environment(cluster)
        got = cls().cpu_request(environ) if cls is not None else None
        if not isinstance(got, dict) or len(json.dumps(got)) > MAX_CPU_REQUEST_CHARS:
            return None
        return got
    except Exception:  # noqa: BLE001 - a plugin's bug costs the fact, not the run
        return None
