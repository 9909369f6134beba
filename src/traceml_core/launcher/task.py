"""``traceml run`` in the task layout: this process is ONE rank, started by the cluster.

Lightning's, submitit's and many sites' Slurm layout is one srun task per GPU
(``srun --ntasks-per-node=G traceml run train.py``). There is no torchrun: the cluster plugin gave
this task its rank (:attr:`LaunchConfig.task_rank`), its local rank and the world, and this
launcher runs the script once, through the worker bootstrap, with the environment torchrun would
have given it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``). The node's telemetry duties fall to its tasks by local rank:

* rank 0 starts the aggregator (before its worker, as node 0's launcher does) and, once its own
  worker has ended, waits (bounded) for every rank to end before it asks for the summary;
* local rank 0 of each node joins the aggregator as the node (presence, system samples, the
  node's exit) and runs the node's relay, on a port every task of the node knows without talking:
  :func:`relay_port` (the job's block of ports under Slurm). It keeps the relay open until the
  node's other ranks have ended (bounded), so their last steps reach node 0;
* every task's worker sends its steps to that relay on loopback; a worker that starts before the
  relay listens keeps retrying in the background (steps are buffered meanwhile);
* the hang autopsy's stack dumps: every rank's faulthandler writes into the node's stack directory
  (:func:`~.stacks.node_dir`, the same path in every task), which the relay reads after
  signalling the rank (same user, same node), as a node launcher does for its workers.

What it cannot know: another task's exit code. A rank that dies without a word (SIGKILL) is seen
by node 0 as a connection closed without ``bye`` ("crashed" or "vanished"), not with its signal.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Mapping, Optional, Sequence

from ..config import LaunchConfig
from ..runinfo import ENV_VAR as RUN_INFO_VAR, RunInfo
from .memcg import OomWatch
from .preflight import check_master_port, check_script
from .run import HANG_EXIT_CODE
from .stacks import StackCollector, node_dir
from .supervise import Supervisor, log
from .telemetry import NodeTelemetry, _flag_source
from .token import resolve_token
from .torchrun import BOOTSTRAP_MODULE

#: the relay's port is the aggregator's + this: under Slurm the last port of the job's block of
#: four (master, aggregator, the dashboard's default, spare), so no other job uses it. (The node
#: layout's link probe serves on that spare port; here it takes the dashboard's default:
#: telemetry.probe_port.)
RELAY_PORT_OFFSET = 2
#: seconds rank 0 (and each node's local rank 0) waits, after its own worker ended, for the other
#: ranks to end; srun's --kill-on-bad-exit or DDP itself normally ends them together
OTHERS_GRACE_S = 60.0
#: seconds a worker's init() may wait for its node's relay before training goes on (it keeps
#: retrying in the background)
WORKER_CONNECT_WAIT_S = 5.0
STOP_GRACE_S = 15.0


def relay_port(config: LaunchConfig) -> int:
    return config.aggregator_port + RELAY_PORT_OFFSET


def worker_env(config: LaunchConfig, environ: Mapping[str, str], info: RunInfo) -> dict[str, str]:
    """The task's environment plus what torchrun would give its worker."""
    assert config.task_rank is not None and config.local_rank is not None
    env = dict(environ)
    env.update({
        "RANK": str(config.task_rank), "LOCAL_RANK": str(config.local_rank),
        "WORLD_SIZE": str(config.world_size), "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "GROUP_RANK": str(config.node_rank), "NODE_RANK": str(config.node_rank),
        "MASTER_ADDR": config.master_addr, "MASTER_PORT": str(config.master_port),
        RUN_INFO_VAR: info.to_env(),
    })
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def worker_command(script: str, script_args: Sequence[str], *, module: bool = False,
                   no_python: bool = False, python: Optional[str] = None) -> list[str]:
    """This task's worker: the script through the bootstrap (a ``--no-python`` program as is)."""
    if no_python:
        return [script, *script_args]
    target = ["-m", script] if module else [script]
    return [python or sys.executable, "-u", "-m", BOOTSTRAP_MODULE, *target, *script_args]


def launch_task(config: LaunchConfig, script: str, script_args: Sequence[str],
                environ: Optional[Mapping[str, str]] = None, *, torchrun_args: Sequence[str] = (),
                module: bool = False, no_python: bool = False) -> int:
    environ = os.environ if environ is None else environ
    check_script(script, module=module, no_python=no_python)
    if config.task_rank == 0:  # rank 0's process group hosts the rendezvous store
        check_master_port(config.master_port, _flag_source(config, "master_port"), config.nnodes)
    for warning in config.warnings:
        log(f"warning: {warning}")
    ignored = [a for a in torchrun_args if a not in ("--module", "--no-python")]
    if ignored:
        log(f"note: torchrun flags {' '.join(ignored)} do not apply in the task layout (no torchrun: "
            f"each task is one rank) and are ignored")
    token = resolve_token(config, environ)
    if token.warning and config.task_rank == 0:
        log(f"warning: {token.warning}")
    rank, local = int(config.task_rank or 0), int(config.local_rank or 0)
    if local == 0:
        log(f"run {config.run_name}: node {config.node_rank}/{config.nnodes}, one task per GPU "
            f"({config.nproc_per_node} per node, {config.world_size} ranks), master "
            f"{config.master_addr}:{config.master_port}, aggregator {config.aggregator_host}:"
            f"{config.aggregator_port}")

    telemetry = NodeTelemetry(config, token)
    # the hang autopsy's stack dumps: the node's relay (local rank 0) signals every rank of the
    # node and reads the file each rank's faulthandler writes, in a directory all tasks agree on
    telemetry.stacks.close()
    telemetry.stacks = StackCollector(node_dir(config.run_name, config.node_rank))
    port = relay_port(config)
    started = time.time()
    sup: Optional[Supervisor] = None
    try:
        if rank == 0:
            telemetry.start_aggregator(script, script_args)   # raises before training on a clash
        relay = None
        if local == 0:
            relay = telemetry.start_relay(config.aggregator_wait, port=port)
            if relay is None:
                log(f"warning: this node's relay could not listen on 127.0.0.1:{port}; its ranks "
                    "send no telemetry")
            # multi-node: the link probe between the nodes, as in the node layout (bounded; never
            # fails the run; --link-probe off skips it): each node's local rank 0 serves it, rank 0
            # measures now, before its worker starts (the other ranks wait in DDP's rendezvous)
            telemetry.link_probe()
        info = RunInfo(
            run_name=config.run_name, job_id=config.job_id, nnodes=config.nnodes,
            node_rank=config.node_rank, nproc_per_node=config.nproc_per_node,
            aggregator_host="127.0.0.1", aggregator_port=port, token=token.value,
            connect_wait=WORKER_CONNECT_WAIT_S, mode=config.mode, logs_dir=config.logs_dir,
            auto_steps=config.auto_steps, stack_dir=telemetry.stacks.path)
        oom = OomWatch().start()
        sup = Supervisor(worker_command(script, script_args, module=module, no_python=no_python),
                         worker_env(config, environ, info), grace=STOP_GRACE_S)
        sup.start()
        if rank == 0:
            telemetry.attach(sup)
        code = sup.wait(on_tick=telemetry.tick if rank == 0 else None)
    except BaseException:
        if sup is not None:
            sup.signal_now(signal.SIGKILL)
            sup.wait()
            sup.restore()
        if local == 0:
            telemetry.stacks.close()
        raise
    interrupted = sup.interrupted_by is not None
    status = 128 - code if code < 0 else code
    if interrupted and status == 0:
        status = 128 + int(sup.interrupted_by)
    if telemetry.hung and not interrupted:   # rank 0's hang watchdog stopped its worker
        status = HANG_EXIT_CODE
    if local == 0 or rank == 0:
        log(f"rank {rank}: worker ended with exit code {code} after {time.time() - started:.1f} s"
            + ("; waiting for the other ranks" if not interrupted else ""))
    report = {"workers": [_worker_row(config, sup, code)] if code != 0 else [], "oom": oom.report()}
    try:
        if not interrupted and not telemetry.hung:   # hung ranks never end by themselves:
            _wait_for_others(telemetry, config, rank)  # srun ends them once this task exits
        reason = telemetry.failure_reason() if (status != 0 or interrupted) else None
        if interrupted:
            sig = f"interrupted by {signal.Signals(sup.interrupted_by).name}"
            reason = f"{reason}; {sig}" if reason else sig
        text = None
        if local == 0:
            # rank 0 knows its own worker's exit, not the other tasks': when its own is clean the
            # run's exit code is not known here (null), and the summary judges the run by how
            # every rank ended
            run_code: Optional[int] = status if (status != 0 or rank != 0) else None
            text = telemetry.finish(exit_code=run_code, interrupted=interrupted, reason=reason,
                                    report=report)
    finally:
        sup.restore()
        if local == 0:      # the node's other ranks have ended (or the wait ran out)
            telemetry.stacks.close()
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    return status


def _worker_row(config: LaunchConfig, sup: Supervisor, code: int) -> dict:
    proc = sup.proc
    return {"rank": int(config.task_rank or 0), "local_rank": int(config.local_rank or 0),
            "pid": proc.pid if proc is not None else 0, "exitcode": code,
            "signal": signal.Signals(-code).name if code < 0 else None, "ts": time.time(), "message": ""}


def _wait_for_others(telemetry: NodeTelemetry, config: LaunchConfig, rank: int) -> None:
    """Rank 0: until every rank has ended (as the aggregator sees it); a node's local rank 0:
    until the node's other ranks have left its relay. Bounded by :data:`OTHERS_GRACE_S`."""
    deadline = time.monotonic() + OTHERS_GRACE_S
    if rank == 0:
        while time.monotonic() < deadline and not telemetry.all_ranks_ended():
            time.sleep(0.2)
    elif config.local_rank == 0:
        while time.monotonic() < deadline and telemetry.relay_ranks_connected() > 0:
            time.sleep(0.2)
