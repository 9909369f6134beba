"""``traceml run``: one launcher per node.

Node 0 starts the aggregator (a child process, so training survives its death) before anything
else, so a port clash is reported before training starts. Every node's launcher then starts its
relay, which joins the aggregator (waiting up to ``aggregator_wait`` with backoff: node 0 may still
be in a slow ``module load``), starts torchrun with the run's details (the relay's address) in the
workers' environment, supervises it, and on node 0 asks the aggregator for the final summary,
which it prints.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Mapping, Optional, Sequence

from ..config import TASK_LAYOUT, LaunchConfig
from ..runinfo import ENV_VAR as RUN_INFO_VAR, RunInfo
from ..views import start_view
from .supervise import Supervisor, log
from .telemetry import NodeTelemetry, _flag_source
from .token import resolve_token
from .agent import FD_VAR as AGENT_FD_VAR
from .memcg import OomWatch
from .preflight import (AgentLink, PreflightError, WorkerProbe, check_cpus, check_master_port, check_probe,
                        check_script, probe_failure)
from .torchrun import agent_command, torchrun_command

#: seconds torchrun gets after SIGTERM before its process group is killed; with the aggregator's
#: finalisation budget this stays inside Slurm's default KillWait of 30 s
STOP_GRACE_S = 15.0
#: seconds a worker's init() may spend connecting; the launcher has already waited for the aggregator
WORKER_CONNECT_WAIT_S = 5.0
#: exit status when the hang watchdog (--hang-timeout) stopped the run (timeout(1)'s convention)
HANG_EXIT_CODE = 124


def interrupt_words(config: LaunchConfig, signum: int, at: float) -> str:
    """``interrupted by SIGTERM: the job reached its time limit (...)``: the signal, and who sent it
    when the cluster plugin can tell (never raises)."""
    name = signal.Signals(signum).name
    words = f"interrupted by {name}" + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    if config.cluster in ("none", ""):
        return words
    try:
        from ..plugins import load_cluster_environment

        cls = load_cluster_environment(config.cluster)
        why = cls().explain_interrupt(config, signum, at) if cls is not None else None
    except Exception:  # noqa: BLE001 - an explanation must never cost the summary
        why = None
    return f"{words}: {why}" if why else words


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def launch(config: LaunchConfig, script: str, script_args: Sequence[str],
           environ: Optional[Mapping[str, str]] = None, *, torchrun_args: Sequence[str] = (),
           module: bool = False, no_python: bool = False) -> int:
    """Run one node of the job; returns the launcher's exit status. ``torchrun_args``: torchrun
    flags passed on from the command line (runargs.py); ``module``/``no_python`` are torchrun's
    ``--module``/``--no-python``, already among them."""
    if config.layout == TASK_LAYOUT:   # this process is one rank (one srun task per GPU)
        from .task import launch_task

        return launch_task(config, script, script_args, environ, torchrun_args=torchrun_args,
                           module=module, no_python=no_python)
    environ = os.environ if environ is None else environ
    # pre-flight, step 1 (cheap): the script exists and compiles, node 0's master port is free;
    # nothing has started yet
    check_script(script, module=module, no_python=no_python)
    if config.node_rank == 0:
        check_master_port(config.master_port, _flag_source(config, "master_port"), config.nnodes)
    for warning in config.warnings:
        log(f"warning: {warning}")
    if not no_python:
        crowded = check_cpus(config.nproc_per_node)
        if crowded:
            log(f"warning: {crowded}")
    token = resolve_token(config, environ)
    if token.warning:
        log(f"warning: {token.warning}")

    # the torchrun process starts first: it imports torch (pre-flight, step 2) while we wait, and
    # starts torchrun only when told to
    agent = AgentLink()
    cmd = agent_command(torchrun_command(config, script, script_args, extra=torchrun_args))
    env = dict(environ)
    env[AGENT_FD_VAR] = str(agent.child_fd)
    env.setdefault("PYTHONUNBUFFERED", "1")
    sup = Supervisor(cmd, env, grace=STOP_GRACE_S, pass_fds=(agent.child_fd,))
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
            raise probe_failure(reply, script)
        if reply.get("owns_workers") is False:
            log("warning: this torch does not let TraceML tie the workers' lives to torchrun's; if "
                "torchrun dies, the launcher stops the workers it left behind instead")
        oom = OomWatch().start()  # the OOM killer's count in the workers' memory cgroup, from now
        if not no_python:  # pre-flight, step 3: the worker count against the GPUs torch sees
            check_probe(WorkerProbe(str(reply.get("torch")), int(reply.get("cuda_devices") or 0),
                                    reply.get("module"), str(reply.get("python"))),
                        config.nproc_per_node, _flag_source(config, "nproc_per_node"))
    except BaseException:
        agent.abort()
        sup.signal_now(signal.SIGKILL)
        sup.wait()
        sup.restore()
        raise

    log(f"run {config.run_name}: node {config.node_rank}/{config.nnodes}, {config.nproc_per_node} workers, "
        f"master {config.master_addr}:{config.master_port}, aggregator "
        f"{config.aggregator_host}:{config.aggregator_port}")
    telemetry = NodeTelemetry(config, token)
    started = time.time()
    view = None
    try:
        if config.node_rank == 0:
            # raises TraceMLError (port in use, ...) before training starts
            telemetry.start_aggregator(script, script_args)
        relay = telemetry.start_relay(config.aggregator_wait,
                                      interrupted=lambda: sup.interrupted_by is not None)
        # multi-node: the bandwidth probe between the launchers (node 0 runs it before its workers
        # start; bounded, --link-probe off skips it)
        telemetry.link_probe(interrupted=lambda: sup.interrupted_by is not None)

        info = RunInfo(
            run_name=config.run_name, job_id=config.job_id, nnodes=config.nnodes, node_rank=config.node_rank,
            nproc_per_node=config.nproc_per_node,
            aggregator_host=relay.host if relay is not None else "127.0.0.1",
            aggregator_port=relay.port if relay is not None else 0, token=token.value,
            connect_wait=WORKER_CONNECT_WAIT_S if relay is not None else 0.0, mode=config.mode,
            logs_dir=config.logs_dir, auto_steps=config.auto_steps, stack_dir=telemetry.stacks.path)
        view = start_view(config, telemetry.snapshot)  # --mode cli|dashboard on node 0, else None
        pipes = view.popen_kwargs() if view else {}
        fds = (pipes["stdout"], pipes["stderr"]) if pipes.get("stdout") is not None else ()
        if not agent.go({RUN_INFO_VAR: info.to_env()}, fds):
            log("warning: the torchrun process was gone before training could start")
        if view:
            view.attach()
        telemetry.attach(sup)
        code = sup.wait(on_tick=telemetry.tick)
    except BaseException:
        agent.abort()
        sup.signal_now(signal.SIGKILL)
        sup.wait()
        sup.restore()
        telemetry.stacks.close()
        raise
    finally:
        if view:
            view.stop()  # the final picture stays on screen; the summary prints below it
    # which workers failed how (torchrun's own record) and whether the OOM killer took any
    report = {"workers": agent.collect_failures() if code != 0 else [], "oom": oom.report()}
    agent.close()
    interrupted = sup.interrupted_by is not None
    reason = telemetry.failure_reason() if (code != 0 or interrupted) else None
    if interrupted:
        sig = interrupt_words(config, int(sup.interrupted_by), sup.interrupted_at or time.time())
        reason = f"{reason}; {sig}" if reason else sig
    status = exit_status(code)
    if interrupted:  # the shell's convention, whatever torchrun made of the signal: 130 for Ctrl-C
        status = 128 + int(sup.interrupted_by)
    if telemetry.hung and not interrupted:
        status = HANG_EXIT_CODE
    if reason and status == 0:
        status = 1
    log(f"workers ended with exit code {code} after {time.time() - started:.1f} s"
        + (f" ({reason})" if reason else ""))
    try:  # a second SIGTERM (srun --kill-on-bad-exit, the time limit) must not kill the summary
        text = telemetry.finish(exit_code=status, interrupted=interrupted, reason=reason, report=report)
    finally:
        sup.restore()
        telemetry.stacks.close()
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    if reason and not interrupted:
        log(f"error: {reason}")
    return status
