"""Run torchrun as a child, forward termination signals, and never die of Slurm's USR1/USR2.

Slurm's time limit sends SIGTERM to every process of the step and SIGKILL ``KillWait`` seconds
later (30 s by default). The launcher forwards SIGTERM to torchrun (which stops its workers),
waits at most ``grace`` seconds, then kills the process group, leaving the rest of the budget for
the summary. ``--signal=USR1@N`` without ``B:`` signals the step's tasks: under
``ProctrackType=proctrack/cgroup`` (the usual one) only the tasks themselves, the launchers, not
their children (measured on Slurm 22.05: the workers' handler never ran). So the launcher passes
USR1/USR2 on to torchrun's process group, and logs them: torchrun and the workers are started
with USR1/USR2 ignored (an inherited disposition), so a training script that installs its own
handler gets the early warning and the others are not killed by it. Where Slurm signals every
process of the step (proctrack/linuxproc, pgid) a handler may run twice: set a flag in it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from . import ownership

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
LOGGED = (signal.SIGUSR1, signal.SIGUSR2)


def log(msg: str) -> None:
    sys.stderr.write(f"[traceml] {msg}\n")
    sys.stderr.flush()


def _ignore_user_signals() -> None:
    for sig in LOGGED:
        signal.signal(sig, signal.SIG_IGN)


@dataclass
class Supervisor:
    """Owns one child (the torchrun process, or the task layout's one worker) and its process
    group; ``wait()`` returns its exit code."""

    cmd: Sequence[str]
    env: Mapping[str, str]
    grace: float = 15.0
    on_signal: Optional[Callable[[int], None]] = None
    #: where torchrun's output goes (None: our own stdout/stderr); the live terminal view passes
    #: a pipe it prints above its display (views/output.py)
    stdout: Any = None
    stderr: Any = None
    #: file descriptors the child inherits (the torchrun process's socket to the launcher)
    pass_fds: Sequence[int] = ()
    #: the environment variable only workers (and their children) start with: how wait() tells
    #: orphaned workers from the launcher's other children (see ownership.py)
    worker_marker: str = "TRACEML_RUN_INFO"
    #: seconds an orphaned worker gets between SIGTERM and SIGKILL
    orphan_grace: float = 5.0
    interrupted_by: Optional[int] = None
    #: why the launcher stopped the workers on its own initiative (terminate()), if it did
    terminated: Optional[str] = None
    #: when the first forwarded signal arrived (epoch seconds)
    interrupted_at: Optional[float] = None
    #: every signal this launcher received, the first arrival of each (epoch seconds): the
    #: goodput ledger tells the early warning of ``--signal`` from the SIGTERM at the limit
    received: dict[int, float] = field(default_factory=dict)
    #: called (in the signal handler: it must not block) on the first USR1/USR2
    on_user_signal: Optional[Callable[[int, float], None]] = None
    proc: Optional[subprocess.Popen] = None
    _old: dict = field(default_factory=dict)
    _kill_timer: Optional[threading.Timer] = None
    _reaped: bool = False

    def start(self) -> None:
        for sig in FORWARDED + LOGGED:
            self._old[sig] = signal.signal(sig, self._handle)
        # workers orphaned by torchrun's death become our children, so wait() can stop them
        ownership.become_subreaper()
        die_with_us = ownership.parent_death_signal(signal.SIGTERM, os.getpid())

        def preexec() -> None:
            _ignore_user_signals()
            die_with_us()  # torchrun gets SIGTERM (and stops its workers) if we die, even by SIGKILL

        # own process group: we decide when the workers get signals, and can kill them all at once
        self.proc = subprocess.Popen(list(self.cmd), env=dict(self.env), preexec_fn=preexec,
                                     start_new_session=True, stdout=self.stdout, stderr=self.stderr,
                                     pass_fds=tuple(self.pass_fds))

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        first = signum not in self.received
        if first:
            self.received[signum] = time.time()
        if signum in LOGGED:
            log(f"received {name} (Slurm --signal?): passed on to the workers (a script with a handler for it "
                "gets it, the others ignore it); training goes on")
            self._pass_on(signum)
            if first and self.on_user_signal is not None:
                self.on_user_signal(signum, self.received[signum])
            return
        if self.interrupted_by is None:
            self.interrupted_by = signum
            self.interrupted_at = time.time()
            log(f"received {name}: stopping the workers (up to {self.grace:.0f} s), then writing the summary")
            if self.on_signal:
                self.on_signal(signum)
            self._signal_group(signal.SIGTERM)
            self._kill_timer = threading.Timer(self.grace, self._signal_group, (signal.SIGKILL,))
            self._kill_timer.daemon = True
            self._kill_timer.start()
        else:
            log(f"received {name} again: killing the workers now")
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _pass_on(self, sig: int) -> None:
        """``sig`` to torchrun's process group (torchrun ignores USR1/USR2; in the task layout the
        worker is the child itself) and to the workers torchrun started in sessions of their own."""
        self._signal_group(sig)
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in ownership.session_children(self.proc.pid):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def signal_now(self, sig: int) -> None:
        """Send ``sig`` to torchrun's whole process group (a launch abandoned before training)."""
        self._signal_group(sig)

    def terminate(self, reason: str) -> None:
        """Stop the workers on our own initiative (a node vanished, a rank hung)."""
        if self.proc is not None and self.proc.poll() is None:
            self.terminated = reason
            log(f"stopping the workers: {reason}")
            self._signal_group(signal.SIGTERM)
            self._kill_timer = threading.Timer(self.grace, self._signal_group, (signal.SIGKILL,))
            self._kill_timer.daemon = True
            self._kill_timer.start()

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """torchrun's exit code once it has ended (None: still running after ``timeout`` seconds;
        ``timeout=None`` waits until it ends). When it has ended, whatever it left behind is
        stopped: its process group, and workers orphaned by its death (adopted by us)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if not self._reaped:
            self._reaped = True
            if self._kill_timer:
                self._kill_timer.cancel()
            # the group may still hold orphaned workers if torchrun itself died hard
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            # workers run in their own sessions: those torchrun left behind are ours now (subreaper)
            ownership.stop_adopted(self.worker_marker, grace=self.orphan_grace, log=log)
        return code

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
