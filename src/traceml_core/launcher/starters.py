"""Worker starters: how one ``traceml run`` process starts its workers, in each layout.

The launch lifecycle (:class:`~.run.NodeLaunch`) is the same in every layout; what differs is who
starts the workers, which telemetry duties this process holds, and what it knows at the end.
:class:`WorkerStarter` is that difference, with two implementations:

* :class:`TorchrunStarter`, the node layout (one launcher per node): the torchrun process starts
  first and checks the workers' Python (:mod:`.agent`: it imports torch, which torchrun needs
  anyway), then starts ``nproc_per_node`` workers on the launcher's go. The launcher keeps the
  aggregator on node 0 and the node's link on every node.
* :class:`TaskStarter`, the task layout (Lightning's, submitit's and many sites' one srun task per
  GPU: ``srun --ntasks-per-node=G traceml run train.py``): no torchrun. The cluster plugin gave
  this task its rank (:attr:`LaunchConfig.task_rank`), its local rank and the world; the task
  runs the script once, through the worker bootstrap, with the environment torchrun would have
  given it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``). Rank 0 keeps the aggregator; local rank 0 of each node holds
  the node's link, its relay on a port every task of the node knows without talking
  (:func:`relay_port`). Every task's worker sends its steps to that relay on loopback; a worker
  that starts before the relay listens keeps retrying in the background (steps are buffered
  meanwhile).

  What a task cannot know: another task's exit code. A rank that dies without a word (SIGKILL)
  is seen by node 0 as a connection closed without ``bye`` ("crashed" or "vanished"), not with
  its signal; and rank 0's task, whose own worker ended cleanly, cannot vouch for the run's exit
  code (:meth:`.outcome.Outcome.summary_exit_code`).
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from ..config import LaunchConfig
from .agent import FD_VAR as AGENT_FD_VAR
from .preflight import AgentLink, PreflightError, WorkerProbe, check_cpus, check_probe, probe_failure
from .relay import Relay
from .supervise import Supervisor, log
from .torchrun import agent_command, torchrun_command, worker_command

#: seconds the workers get after SIGTERM before their process group is killed; with the
#: aggregator's finalisation budget this stays inside Slurm's default KillWait of 30 s
STOP_GRACE_S = 15.0
#: seconds a worker's init() may spend connecting to its node's relay before training goes on
#: (the launcher has already waited for the aggregator; a task's worker keeps retrying in the
#: background)
WORKER_CONNECT_WAIT_S = 5.0
#: the task layout's relay port is the aggregator's + this: under Slurm the last port of the job's
#: block of four (master, aggregator, the dashboard's default, spare), so no other job uses it.
#: (The node layout's link probe serves on that spare port; in the task layout it takes the
#: dashboard's default: nodelink.probe_port.)
RELAY_PORT_OFFSET = 2


@dataclass(frozen=True)
class Duties:
    """The telemetry duties of one ``traceml run`` process."""

    #: node 0's aggregator and the watchdog (:mod:`.keeper`, :mod:`.watchdog`)
    keeps_aggregator: bool
    #: the node's relay, system samples, link probe and stack dumps (:mod:`.nodelink`)
    links_node: bool

    @property
    def speaks_for_node(self) -> bool:
        """Logs the node's lines (warnings, the run line, how the workers ended) once per node."""
        return self.keeps_aggregator or self.links_node


class WorkerStarter(ABC):
    """Starts, watches and stops this process's workers; says what it knows of them."""

    duties: Duties
    #: the exit code it sees covers every worker it speaks for (torchrun: the node's); a task
    #: knows only its own worker's
    knows_every_worker: bool
    #: after its own workers ended, wait (bounded) for the rest of the run before finishing
    waits_for_others: bool
    #: node 0's live view (--mode cli|dashboard) can show above its workers' output
    live_view: bool
    #: the port the node's relay listens on (0: any free one)
    relay_port: int = 0
    sup: Optional[Supervisor] = None

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], script: str,
                 script_args: Sequence[str], *, torchrun_args: Sequence[str] = (), module: bool = False,
                 no_python: bool = False) -> None:
        self.config = config
        self.environ = environ
        self.script = script
        self.script_args = list(script_args)
        self.torchrun_args = list(torchrun_args)
        self.module = module
        self.no_python = no_python
        self.duties = self.duties_of(config)

    @staticmethod
    @abstractmethod
    def duties_of(config: LaunchConfig) -> Duties:
        """This process's telemetry duties in the layout."""

    # -- pre-flight ----------------------------------------------------------------------------
    def check(self) -> None:
        """Cheap checks and notes, before anything starts (may raise PreflightError)."""

    def preflight(self) -> Optional[int]:
        """The checks that need the workers' interpreter; an exit status ends the launch here
        (a signal before training), a PreflightError refuses it."""
        return None

    @abstractmethod
    def describe(self) -> str:
        """The run's line in the log, once per node."""

    # -- training ------------------------------------------------------------------------------
    @abstractmethod
    def endpoint(self, relay: Optional[Relay]) -> tuple[str, int, float]:
        """Where the workers send their telemetry: (host, port, seconds init() may wait)."""

    @abstractmethod
    def start(self, run_env: Mapping[str, str], outputs: tuple[int, ...] = ()) -> None:
        """Start the workers with ``run_env`` added to their environment (the run info);
        ``outputs``: (stdout, stderr) file descriptors for them (a live view), or ()."""

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """The workers' exit code, or None while they run (after ``timeout`` seconds)."""
        assert self.sup is not None
        return self.sup.wait(timeout)

    @property
    def interrupted_by(self) -> Optional[int]:
        """The signal (SIGTERM, SIGINT, SIGHUP) that asked this launcher to stop, or None."""
        return self.sup.interrupted_by if self.sup is not None else None

    @property
    def interrupted_at(self) -> Optional[float]:
        return self.sup.interrupted_at if self.sup is not None else None

    def interrupted(self) -> bool:
        return self.interrupted_by is not None

    @property
    def signals_received(self) -> dict[int, float]:
        """Every signal this launcher received: the first arrival of each (epoch seconds)."""
        return dict(self.sup.received) if self.sup is not None else {}

    def on_user_signal(self, callback: Callable[[int, float], None]) -> None:
        """``callback(signum, at)`` on the first USR1/USR2 (from the signal handler: not blocking)."""
        if self.sup is not None:
            self.sup.on_user_signal = callback

    def terminate(self, reason: str) -> None:
        """Stop the workers on our own initiative (a node vanished, a rank hung)."""
        if self.sup is not None:
            self.sup.terminate(reason)

    def abort(self) -> None:
        """Abandon the launch: kill whatever was started, at once."""
        if self.sup is not None:
            self.sup.signal_now(signal.SIGKILL)
            self.sup.wait()
            self.sup.restore()

    # -- the end -------------------------------------------------------------------------------
    @abstractmethod
    def report(self, code: int) -> dict[str, Any]:
        """What this process knows of how its workers ended, for the node's report (wire/frames
        worker_report): ``workers``, those that failed and how (rank, pid, exit code, signal)."""

    @abstractmethod
    def ended_words(self, code: int, elapsed: float) -> str:
        """``workers ended with exit code 1 after 12.3 s``."""

    def close(self) -> None:
        """The launcher's own signal dispositions back (the summary comes next)."""
        if self.sup is not None:
            self.sup.restore()

    #: why no worker could start at all, in one paragraph (set by :meth:`report`; None: they did)
    startup_error: Optional[str] = None


class TorchrunStarter(WorkerStarter):
    """The node layout: one torchrun per node, started through the pre-flight agent."""

    knows_every_worker = True
    waits_for_others = False
    live_view = True
    agent: Optional[AgentLink] = None

    @staticmethod
    def duties_of(config: LaunchConfig) -> Duties:
        return Duties(keeps_aggregator=config.node_rank == 0, links_node=True)

    def check(self) -> None:
        if not self.no_python:
            crowded = check_cpus(self.config.nproc_per_node)
            if crowded:
                log(f"warning: {crowded}")

    def preflight(self) -> Optional[int]:
        """The torchrun process starts first: it imports torch (pre-flight, step 2) while we wait,
        and starts torchrun only when told to (:meth:`start`)."""
        c = self.config
        agent = self.agent = AgentLink()
        cmd = agent_command(torchrun_command(c, self.script, self.script_args, extra=self.torchrun_args))
        env = dict(self.environ)
        env[AGENT_FD_VAR] = str(agent.child_fd)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if c.omp_threads:  # the task's CPUs over its workers (config.omp_threads); the user's own wins
            env.setdefault("OMP_NUM_THREADS", c.omp_threads)
        sup = self.sup = Supervisor(cmd, env, grace=STOP_GRACE_S, pass_fds=(agent.child_fd,))
        try:
            sup.start()
        except BaseException:
            agent.close()
            sup.restore()
            raise
        agent.spawned()
        try:
            reply = agent.wait_ready(lambda: sup.poll() is None and sup.interrupted_by is None, log)
            if reply is None or not reply.get("ready"):
                agent.abort()
                code = sup.wait()
                sup.restore()
                if sup.interrupted_by is not None:
                    log(f"interrupted by {signal.Signals(sup.interrupted_by).name} before training started")
                    return 128 + int(sup.interrupted_by)
                if reply is None:
                    raise PreflightError(
                        f"traceml run: the torchrun process ended (exit code {code}) before it could "
                        "check the workers' Python; its output above says why. Nothing was started.")
                raise probe_failure(reply, self.script)
            if reply.get("owns_workers") is False:
                log("warning: this torch does not let TraceML tie the workers' lives to torchrun's; if "
                    "torchrun dies, the launcher stops the workers it left behind instead")
            if not self.no_python:  # pre-flight, step 3: the worker count against the GPUs torch sees
                check_probe(WorkerProbe(str(reply.get("torch")), int(reply.get("cuda_devices") or 0),
                                        reply.get("module"), str(reply.get("python"))),
                            c.nproc_per_node, c.flag_source("nproc_per_node"))
        except BaseException:
            self.abort()
            raise
        return None

    def describe(self) -> str:
        c = self.config
        return (f"run {c.run_name}: node {c.node_rank}/{c.nnodes}, {c.nproc_per_node} workers, "
                f"master {c.master_addr}:{c.master_port}, aggregator {c.aggregator_host}:{c.aggregator_port}")

    def endpoint(self, relay: Optional[Relay]) -> tuple[str, int, float]:
        if relay is None:
            return "127.0.0.1", 0, 0.0
        return relay.host, relay.port, WORKER_CONNECT_WAIT_S

    def start(self, run_env: Mapping[str, str], outputs: tuple[int, ...] = ()) -> None:
        assert self.agent is not None
        if not self.agent.go(dict(run_env), outputs):
            log("warning: the torchrun process was gone before training could start")

    def abort(self) -> None:
        if self.agent is not None:
            self.agent.abort()
        super().abort()

    def report(self, code: int) -> dict[str, Any]:
        """torchrun's own record of which workers failed how (sent by the agent), and how torchrun
        itself ended: its exit code, when, and, when a signal killed it that the launcher did not
        send (the OOM killer, a user, a health check), the signal's name: the summary then names
        this node's torchrun as the failure its ranks followed (report/failure.py);
        ``stopped_at``: when a signal to the launcher (scancel, the time limit, srun stopping the
        step) made it stop torchrun, so a node lost before that is the failure."""
        assert self.agent is not None and self.sup is not None
        rows = self.agent.collect_failures() if code != 0 else []
        self.startup_error = self.agent.startup_error
        self.agent.close()
        sup = self.sup
        ours = sup.interrupted_by is not None or sup.terminated is not None
        return {"workers": rows, "torchrun": {
            "exitcode": code, "signal": signal.Signals(-code).name if code < 0 and not ours else None,
            "at": time.time(), "stopped_at": sup.interrupted_at}}

    def ended_words(self, code: int, elapsed: float) -> str:
        return f"workers ended with exit code {code} after {elapsed:.1f} s"


def relay_port(config: LaunchConfig) -> int:
    """The task layout's relay port on every node (:data:`RELAY_PORT_OFFSET`)."""
    return config.aggregator_port + RELAY_PORT_OFFSET


def worker_env(config: LaunchConfig, environ: Mapping[str, str], run_env: Mapping[str, str]) -> dict[str, str]:
    """The task's environment plus what torchrun would give its worker, plus ``run_env``."""
    assert config.task_rank is not None and config.local_rank is not None
    env = dict(environ)
    env.update({
        "RANK": str(config.task_rank), "LOCAL_RANK": str(config.local_rank),
        "WORLD_SIZE": str(config.world_size), "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "GROUP_RANK": str(config.node_rank), "NODE_RANK": str(config.node_rank),
        "MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port),
        **run_env,
    })
    env.setdefault("PYTHONUNBUFFERED", "1")
    if config.omp_threads:  # the task's CPUs (config.omp_threads); the user's own value wins
        env.setdefault("OMP_NUM_THREADS", config.omp_threads)
    return env


class TaskStarter(WorkerStarter):
    """The task layout: this process is one rank; its worker is the script, run once."""

    knows_every_worker = False
    waits_for_others = True
    live_view = False

    @staticmethod
    def duties_of(config: LaunchConfig) -> Duties:
        return Duties(keeps_aggregator=config.task_rank == 0, links_node=config.local_rank == 0)

    def __init__(self, config: LaunchConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.rank, self.local = int(config.task_rank or 0), int(config.local_rank or 0)
        self.relay_port = relay_port(config)

    def check(self) -> None:
        ignored = [a for a in self.torchrun_args if a not in ("--module", "--no-python")]
        if ignored and self.duties.speaks_for_node:
            log(f"note: torchrun flags {' '.join(ignored)} do not apply in the task layout (no torchrun: "
                f"each task is one rank) and are ignored")

    def describe(self) -> str:
        c = self.config
        return (f"run {c.run_name}: node {c.node_rank}/{c.nnodes}, one task per GPU "
                f"({c.nproc_per_node} per node, {c.world_size} ranks), master "
                f"{c.master_addr}:{c.master_port}, aggregator {c.aggregator_host}:{c.aggregator_port}")

    def endpoint(self, relay: Optional[Relay]) -> tuple[str, int, float]:
        # the node's relay may be another task's: its fixed port, whether it listens yet or not
        return "127.0.0.1", self.relay_port, WORKER_CONNECT_WAIT_S

    def start(self, run_env: Mapping[str, str], outputs: tuple[int, ...] = ()) -> None:
        cmd = worker_command(self.script, self.script_args, module=self.module, no_python=self.no_python)
        self.sup = Supervisor(cmd, worker_env(self.config, self.environ, run_env), grace=STOP_GRACE_S)
        self.sup.start()

    def report(self, code: int) -> dict[str, Any]:
        if code == 0:
            return {"workers": []}
        proc = self.sup.proc if self.sup is not None else None
        return {"workers": [{"rank": self.rank, "local_rank": self.local, "pid": proc.pid if proc is not None else 0,
                 "exitcode": code, "signal": signal.Signals(-code).name if code < 0 else None,
                 "ts": time.time(), "message": ""}]}

    def ended_words(self, code: int, elapsed: float) -> str:
        return f"rank {self.rank}: worker ended with exit code {code} after {elapsed:.1f} s"


def make_starter(config: LaunchConfig, environ: Mapping[str, str], script: str, script_args: Sequence[str],
                 **kwargs: Any) -> WorkerStarter:
    from ..config import TASK_LAYOUT

    cls = TaskStarter if config.layout == TASK_LAYOUT else TorchrunStarter
    return cls(config, environ, script, script_args, **kwargs)
