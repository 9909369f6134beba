"""One process's telemetry session (sdk/api.py states the contract with training code).

:class:`InitArgs` is what the script passed to ``init()``; None there means the launcher's hand-over
(:class:`~traceml_core.runinfo.RunInfo`) or torchrun's variables (:class:`TorchrunVars`) decide. A
:class:`Session` starts from them, shuts down within a bound, and hears how the process ends
(:func:`install_exit_hooks`).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .. import limits
from ..errors import ConfigError, show
from ..runinfo import ENV_VAR, RunInfo
from .recorder import StepRecorder
from .tracer import TRACER, Tracer

log = logging.getLogger("traceml")

#: default seconds ``init`` waits for the aggregator when neither RunInfo nor the caller says
DEFAULT_CONNECT_WAIT = 3.0
#: default bound on the flush at exit
DEFAULT_FLUSH_TIMEOUT = 2.0
_EVENT_TEXT_MAX = 16_000

_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: Any) -> None:
    if key in _warned:
        return
    _warned.add(key)
    log.warning(msg, *args)


@dataclass(frozen=True)
class InitArgs:
    """``init()``'s arguments (see its docstring); None means "not given"."""

    aggregator: Optional[str] = None
    token: Optional[str] = None
    run_name: Optional[str] = None
    job_id: Optional[str] = None
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    node_rank: Optional[int] = None
    connect_wait: Optional[float] = None
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT
    batch_size: int = 1024
    max_buffered_steps: int = 65_536
    enabled: bool = True


#: (field, variable, bound) of each variable torchrun sets that ``init()`` reads
TORCHRUN_VARIABLES = (("rank", "RANK", limits.TASK_RANK), ("local_rank", "LOCAL_RANK", limits.LOCAL_RANK),
                      ("world_size", "WORLD_SIZE", limits.TASKS), ("group_rank", "GROUP_RANK", limits.NODE_RANK))


@dataclass(frozen=True)
class TorchrunVars:
    """torchrun's variables for each worker, read like every variable TraceML takes: bounded
    (:mod:`traceml_core.limits`), from the mapping given, a bad one a paragraph naming it, its value
    and the fix. With :meth:`~traceml_core.limits.Limit.parse`, not an EnvSettings model: every rank
    reads them in ``init()``, and pydantic would cost it +160 ms of CPU (the SDK imports none)."""

    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    #: the node's rank in torchrun's rendezvous (when no launcher said it)
    group_rank: Optional[int] = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "TorchrunVars":
        """The variables set in ``environ`` (a blank one counts as unset); ConfigError on a bad one."""
        values = {}
        for field, var, limit in TORCHRUN_VARIABLES:
            raw = environ.get(var)
            if raw is not None and raw.strip():
                try:
                    values[field] = limit.parse(raw)
                except ValueError as exc:
                    raise ConfigError(f"{var}={show(raw.strip())} {exc}. torchrun sets {var} for each "
                                      "worker; if your script or shell sets it, correct or remove that.",
                                      variable=var) from None
        return cls(**values)  # type: ignore[arg-type]


def _first(*values: Any) -> Any:
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


@dataclass(eq=False)
class Session:
    """Everything ``init`` set up for this process."""

    args: InitArgs
    active: bool = False
    closed: bool = False
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    node: int = 0
    run: str = ""
    job: Optional[str] = None
    address: Optional[tuple[str, int]] = None
    recorder: Optional[StepRecorder] = None
    tracer: Tracer = TRACER
    client: Any = None
    probe: Any = None
    #: the CPU probe (sdk/threads.py): threads, cores, the training thread's wait for a core
    cpu: Any = None
    status: str = "clean"
    error: Optional[str] = None
    #: the step a fatal error happened in (or, between steps, the next step's index), and
    #: whether it happened inside that step's ``trace_step`` block
    fail_step: Optional[int] = None
    fail_in_step: bool = False
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT
    reason_off: Optional[str] = None

    # ---- start ----------------------------------------------------------------------------------
    def start(self, environ: Mapping[str, str]) -> None:
        """Who and where this rank is, then (unless tracing is off, :attr:`reason_off` says why)
        the client, the recorder and the patches; :attr:`active` once steps are recorded."""
        a = self.args
        self.flush_timeout = float(a.flush_timeout)
        info = RunInfo.from_env(environ)
        # arguments shadow their variables, which are then not read at all (even a bad one)
        given = (a.rank, a.local_rank, a.world_size, a.node_rank)
        tv = TorchrunVars() if None not in given else TorchrunVars.from_environ(environ)
        self.rank = _first(a.rank, tv.rank, 0)
        self.local_rank = _first(a.local_rank, tv.local_rank, 0)
        self.world = _first(a.world_size, tv.world_size, 1)
        self.node = _first(a.node_rank, info.node_rank if info is not None else None, tv.group_rank, 0)
        self.run = a.run_name or (info.run_name if info is not None else "local")
        self.job = _first(a.job_id, info.job_id if info is not None else None)
        if info is not None and not a.aggregator:
            # under `traceml run` the launcher named the run and the job, and the run's token is
            # bound to both: another name from init() would only get this rank refused
            for arg, given, launcher in (("run_name", a.run_name, info.run_name), ("job_id", a.job_id, info.job_id)):
                if given is not None and str(given) != str(launcher):
                    warn_once(f"init-{arg}", "traceml: init(%s=%r) is ignored under `traceml run`, "
                              "which set it to %r (the launcher names the run: `traceml run "
                              "--run-name NAME`)", arg, given, launcher)
            self.run, self.job = info.run_name, info.job_id
        if not a.enabled:
            self.reason_off = "disabled by init(enabled=False)"
            return
        if a.aggregator:
            host, sep, port = a.aggregator.rpartition(":")
            if not sep or not host:
                raise ValueError(f"aggregator address {a.aggregator!r} is not HOST:PORT")
            self.address = (host.strip("[]"), int(port))
        elif info is not None:
            self.address = (info.aggregator_host, int(info.aggregator_port))
        else:
            bad = bool(environ.get(ENV_VAR))
            self.reason_off = f"{ENV_VAR} is set but unreadable" if bad else f"no run info ({ENV_VAR} is not set)"
            if self.rank == 0 or bad:
                warn_once("no-run-info", "traceml: %s -- telemetry is off for this process. Start the "
                          "script with `traceml run script.py ...` to collect it (or pass "
                          "init(aggregator=, token=)).", self.reason_off)
            return
        if multiprocessing.parent_process() is not None and not a.aggregator:
            # a DataLoader worker (or other multiprocessing child) importing the training script:
            # it inherits the rank's environment and must not pose as that rank
            self.reason_off = "multiprocessing child process"
            return
        wait = max(0.0, float(_first(a.connect_wait, info.connect_wait if info is not None else None,
                                     DEFAULT_CONNECT_WAIT)))
        self._connect(_first(a.token, info.token if info is not None else None, ""),
                      info.cpu_request if info is not None else None, wait)

    def _connect(self, token: str, cpu_request: Optional[dict], wait: float) -> None:
        import torch  # noqa: F401  (the SDK instruments torch; fail here, not in the hot path)

        from ..wire.auth import relay_aud
        from ..wire.client import ClientConfig, TelemetryClient
        from . import spans, work, worksample
        from .memory import MEMORY_INTERVAL_S, MemoryProbe
        from .responders import answer
        from .threads import ThreadsProbe

        a = self.args
        batch = max(1, int(a.batch_size))
        recorder = self.recorder = StepRecorder(rank=self.rank, batch_size=batch,
                                                max_batches=max(2, int(a.max_buffered_steps) // batch))
        self.probe = MemoryProbe(TRACER)
        host, port = self.address  # type: ignore[misc]
        client = self.client = TelemetryClient(
            ClientConfig(host, port, token, aud=relay_aud(self.node), run=self.run, job=self.job,
                         node=self.node, rank=self.rank, kind="rank", world=self.world,
                         hostname=socket.gethostname(), extra={"local_rank": self.local_rank},
                         name=f"traceml-rank{self.rank}", peer="this node's relay"),
            source=recorder, on_refused=self.refused, on_frame=lambda req: answer(self, req))
        recorder.on_backlog = client.wake
        client.add_periodic(self.probe, MEMORY_INTERVAL_S)
        client.add_periodic(recorder.refresh_wall_offset, 5.0)
        # a blocked training thread's last records still travel (sdk/recorder.py)
        client.add_periodic(lambda: recorder.seal_stalled() and client.wake(), 0.1)
        # threads against cores, and the wait for a core of the thread that trains (the one in init);
        # what its steps consume (batches, CPU per phase), on sampled steps
        sampler = worksample.WorkSampler(TRACER)
        self.cpu = ThreadsProbe(recorder, threading.current_thread().native_id, request=cpu_request,
                                notify=self.notify, sampler=sampler)
        client.add_periodic(self.cpu, 0.5)
        client.add_periodic(sampler.tick, worksample.INTERVAL_S)
        install_exit_hooks()
        TRACER.start(recorder, notify=self.notify)   # the patches; DDP models built before init()
        spans.install(spans.event_sender(self.notify))   # checkpoint saves timed, progress marks
        work.install(spans.event_sender(self.notify))    # what a step is worth, if the script declared it
        self.active = True
        client.start()
        connected = client.wait_connected(wait)
        recorder.seal_at = time.perf_counter_ns() + recorder.seal_ns   # the first batch starts now
        if not connected and client.refused_reason is None:
            warn_once("no-aggregator", "traceml: no answer from the aggregator at %s:%d within %.1fs "
                      "(rank %d); training continues and telemetry keeps retrying in the background "
                      "-- steps are buffered, and counted as lost if the buffer fills",
                      host, port, wait, self.rank)

    def refused(self, reason: str) -> None:
        """(client thread) The aggregator refused this rank: stop recording; the client discards
        and counts what was pending."""
        self.reason_off = f"refused by the aggregator: {reason}"
        TRACER.stop()

    def notify(self, frame: dict[str, Any]) -> bool:
        """Queue a frame for the aggregator (events such as the step source); False when off."""
        if not self.active or self.closed or self.client is None:
            return False
        frame.setdefault("rank", self.rank)
        return bool(self.client.submit(frame))

    # ---- the end --------------------------------------------------------------------------------
    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Flush, send ``bye`` and stop, within ``timeout`` (default: init's ``flush_timeout``)."""
        if self.closed:
            return
        TRACER.owners.before_shutdown()   # the final step-source notice goes out before the bye
        try:
            from .spans import PROGRESS

            PROGRESS.final()               # where the rank's steps ended, before the bye too
        except Exception:  # noqa: BLE001
            pass
        if self.cpu is not None:
            self.cpu.final()              # the run's wait for a core, before the bye too
        self.closed = True
        TRACER.stop()
        r, client = self.recorder, self.client
        if r is None or client is None:
            return
        try:
            TRACER.timing.drain(TRACER, final=True)
            r.flush_partial()

            def bye() -> dict[str, Any]:
                return {"t": "bye", "rank": self.rank, "status": self.status, "steps": r.count,
                        "dropped": r.lost, "error": self.error, "fail_step": self.fail_step,
                        "fail_in_step": self.fail_in_step}

            told = client.close(self.flush_timeout if timeout is None else timeout, bye=bye)
            if self.probe is not None:
                self.probe.close()
            if r.lost and client.refused_reason is None:
                # the count reaches the summary only in the bye; without it the rank is "incomplete"
                where = ("the loss is counted in the summary" if told or client.stats().bye_sent else
                         "the aggregator could not be told either, so the summary marks this rank's "
                         "telemetry incomplete")
                log.warning("traceml: rank %d could not deliver %d of %d step records to the "
                            "aggregator; %s", self.rank, r.lost, r.count, where)
        except Exception:
            pass

    def teardown_quietly(self) -> None:
        """After a failed start: no patches, no client."""
        self.active = False
        TRACER.stop()
        try:
            if self.client is not None:
                self.client.close(0.1)
        except Exception:
            pass

    def forked(self) -> None:
        """In a forked child (a DataLoader worker): never record nor send as the parent's rank."""
        self.closed = True
        self.active = False

    # ---- how the process ends (install_exit_hooks) ----------------------------------------------
    def uncaught(self, etype: Any, value: Any, tb: Any) -> None:
        self._record_exception(etype, value, tb, fatal=True)

    def thread_uncaught(self, args: Any) -> None:
        if args.exc_type is not SystemExit:
            self._record_exception(args.exc_type, args.exc_value, args.exc_traceback, fatal=False,
                                   thread=getattr(args.thread, "name", "") or "?")

    def exit_called(self, code: Any = None) -> None:
        self._failing_exit("sys.exit", code)

    def quit_called(self, quitter: Any, code: Any = None) -> None:
        self._failing_exit(getattr(quitter, "name", "exit"), code)

    def _record_exception(self, etype: Any, value: Any, tb: Any, *, fatal: bool, thread: str = "") -> None:
        if not self.active or self.closed:
            return
        text = "".join(traceback.format_exception(etype, value, tb))
        if len(text) > _EVENT_TEXT_MAX:
            text = "...\n" + text[-_EVENT_TEXT_MAX:]
        if fatal:
            self.status = "interrupted" if issubclass(etype, KeyboardInterrupt) else "error"
            self.error = "".join(traceback.format_exception_only(etype, value)).strip()[-2000:]
            if self.fail_step is None and self.recorder is not None:
                # the step whose block it left (not recorded: the next index), or the next step
                self.fail_step = TRACER.produced()
                self.fail_in_step = TRACER.raised_at == self.fail_step
        if thread:
            text = f"in thread {thread}:\n{text}"
        self.client.submit({"t": "event", "rank": self.rank, "kind": "exception" if fatal else "thread_exception",
                            "text": text, "ts": time.time()})

    def _failing_exit(self, how: str, code: Any) -> None:
        """A failing ``sys.exit(n)``/``exit(n)`` (n not 0/None) never reaches the exception hook:
        the rank's ``bye`` says error. Called before SystemExit is raised: an open step is this one."""
        if self.active and not self.closed and code not in (None, 0):
            self.status = "error"
            self.error = f"{how}({code!r})"
            if self.recorder is not None:
                self.fail_step = TRACER.produced()
                self.fail_in_step = TRACER.active > 0


#: this process's session (None before ``init()``)
current: Optional[Session] = None


def _chain(prev: Callable[..., Any], method: str, *, first: bool = False) -> Callable[..., Any]:
    """``prev`` exactly as before, its arguments told (quietly) to the current session's
    ``method`` after it, even when it raises, or ``first``."""
    def tell(*args: Any) -> None:
        try:
            if current is not None:
                getattr(current, method)(*args)
        except Exception:
            pass

    def hook(*args: Any) -> Any:
        if first:
            tell(*args)
        try:
            return prev(*args)
        finally:
            if not first:
                tell(*args)
    return hook


_hooks_installed = False


def install_exit_hooks() -> None:
    """Once per process, the ways it ends (sdk/api.py's contract), told to the current session: an
    uncaught exception or a thread's, a failing ``sys.exit(n)``/``exit(n)``/``quit(n)``, the exit."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    sys.excepthook = _chain(sys.excepthook, "uncaught")
    threading.excepthook = _chain(threading.excepthook, "thread_uncaught")
    sys.exit = _chain(sys.exit, "exit_called", first=True)
    try:
        import _sitebuiltins

        quitter = _sitebuiltins.Quitter
        quitter.__call__ = _chain(quitter.__call__, "quit_called", first=True)  # type: ignore[method-assign]
    except (ImportError, AttributeError):
        pass
    atexit.register(_collect_at_exit)   # atexit runs the last registered first: after shutdown
    atexit.register(lambda: current.shutdown() if current is not None else None)


def _collect_at_exit() -> None:
    """Free unreachable objects while the interpreter is still whole. A DDP model sits in reference
    cycles, so without this it is destroyed during interpreter finalization, where torch's gloo
    backend aborts the process now and then ("terminate called without an active exception")
    after training succeeded: 3 of 30 plain torchrun runs of a 2-rank script, 0 of 30 with a
    gc.collect() before exit."""
    try:
        import gc

        gc.collect()
    except Exception:
        pass


def _after_fork_in_child() -> None:
    if current is not None:
        current.forked()
    TRACER.stop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
