"""LaunchConfig: the one seam between resolvers and the launcher.

Every value carries its source. Precedence, highest first:

1. a command-line flag (``cli``)
2. a ``TRACEML_<KEY>`` environment variable (``env:TRACEML_<KEY>``)
3. the detected cluster plugin (for example ``slurm:SLURM_NNODES``)
4. the default (``default``), or a value derived from others (``derived:<key>``)

``--print-config``, the doctor and the launcher all read the same :class:`LaunchConfig`; nothing
re-reads scheduler variables after resolution. This module must not import torch.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

from .errors import ConfigError
from .limits import WORLD_SIZE
from .options import OPTIONS, OUTPUT_KEYS, read_given
from .plugins import ClusterEnvironment, Contribution, Refusal, Setting

SCHEMA_VERSION = 1
#: keys that are not options but context a cluster may provide (job identity)
CONTEXT_KEYS = ("job_id", "node_name", "job_start_time", "job_end_time", "restart_count", "task_rank",
                "local_rank", "task_cpus", "omp_threads")
#: the launch layouts (the ``layout`` option's resolved values); see LaunchConfig.layout
NODE_LAYOUT, TASK_LAYOUT = "node", "task"


@dataclass(frozen=True)
class LaunchConfig:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    run_name: str
    logs_dir: str
    mode: str
    aggregator_port: int
    aggregator_host: str
    aggregator_bind_host: str
    aggregator_wait: float
    cluster: str
    auto_steps: bool = True
    #: "node": this process is a node's launcher (torchrun starts nproc_per_node workers);
    #: "task": this process is one rank's task (rank ``task_rank``, ``local_rank`` on its node of
    #: ``nproc_per_node``), started by the cluster (one srun task per GPU)
    layout: str = NODE_LAYOUT
    task_rank: Optional[int] = None
    local_rank: Optional[int] = None
    #: why this layout, in words (from the cluster plugin; printed by --print-config)
    layout_reason: str = ""
    hang_timeout: float = 0.0
    hang_report_after: str = "auto"
    link_probe: str = "32"
    relay_fan_in: str = "auto"
    status_interval: float = 10.0
    live_refresh: float = 0.5
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 0
    export: str = "none"
    export_interval: float = 10.0
    job_id: Optional[str] = None
    node_name: Optional[str] = None
    #: when the cluster started the job (its allocation), epoch seconds, if the cluster says
    job_start_time: Optional[float] = None
    #: when the cluster will stop the job (its time limit), epoch seconds, if the cluster says
    job_end_time: Optional[float] = None
    #: how often the cluster requeued the job before this run (0: never), if the cluster says
    restart_count: Optional[int] = None
    #: the CPUs the cluster gave this launcher's task (Slurm: SLURM_CPUS_PER_TASK, else the job's
    #: CPUs on the node), None when it does not say
    task_cpus: Optional[int] = None
    #: OMP_NUM_THREADS for the workers (:func:`omp_threads`): the user's own value, else the task's
    #: CPUs over the workers it starts; None: neither is known (torchrun then sets 1)
    omp_threads: Optional[str] = None
    #: every node's hostname by node rank, when the cluster plugin knows them (Slurm: the step's
    #: node list); lets node 0 name a node that never joined. Not printed with the other values.
    hostnames: tuple[str, ...] = ()
    #: the outputs' settings by option key (exporters/output.py: ``wandb_project``, ...)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    warnings: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def run_dir(self) -> Path:
        return Path(self.logs_dir) / self.run_name

    @property
    def hosts_by_node(self) -> tuple[str, ...]:
        """``hostnames`` when they match the node count (a --nnodes flag may disagree), else ()."""
        return self.hostnames if len(self.hostnames) == self.nnodes else ()

    @property
    def is_multinode(self) -> bool:
        return self.nnodes > 1

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    def flag_source(self, key: str) -> str:
        """Where ``key`` came from as the user wrote it: the flag (``--hang-timeout``) for a
        command-line value, else the source (``env:TRACEML_HANG_TIMEOUT``, ``slurm:...``)."""
        src = self.source(key)
        return "--" + key.replace("_", "-") if src == "cli" else src

    def items(self) -> list[tuple[str, Any, str]]:
        keys = [o.key for o in OPTIONS] + list(CONTEXT_KEYS)
        return [(k, self.outputs.get(k) if k in OUTPUT_KEYS else getattr(self, k), self.source(k)) for k in keys]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "config": {k: {"value": v, "source": s} for k, v, s in self.items()},
            "warnings": list(self.warnings),
        }


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def select_cluster(
    name: str, environ: Mapping[str, str], available: Sequence[type[ClusterEnvironment]]
) -> Optional[ClusterEnvironment]:
    if name == "none":
        return None
    if name == "auto":
        for cls in available:
            if cls.detect(environ):
                return cls()
        return None
    for cls in available:
        if cls.name == name:
            return cls()
    names = ", ".join(["auto", "none"] + [c.name for c in available])
    raise ConfigError(
        f"--cluster/TRACEML_CLUSTER={name!r} names no installed cluster environment. "
        f"Use one of: {names}.",
        variable="TRACEML_CLUSTER",
    )


def resolve(
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    clusters: Optional[Sequence[type[ClusterEnvironment]]] = None,
    *,
    script: Optional[str] = None,
    free_port: Optional[Callable[[Collection[int]], int]] = None,
) -> LaunchConfig:
    """Merge flags, ``TRACEML_*`` variables, the cluster plugin and defaults into a LaunchConfig.

    ``cli`` maps option keys to the raw strings given on the command line (absent = not given).
    ``clusters`` defaults to the installed plugins. ``free_port`` (``ports.free_port`` when
    launching): a run on one node outside any cluster takes free ports instead of the fixed
    defaults for the ports nobody gave (source ``free``). Pure apart from plugin discovery and
    ``free_port``.
    """
    if clusters is None:
        from .plugins import cluster_environments

        clusters = cluster_environments()

    chosen: dict[str, Setting] = {}

    # flags and TRACEML_* variables, each checked by its option's type; a variable whose flag was
    # given is not read at all (the flag wins, even over a bad value)
    for key, (value, source) in read_given(cli, environ).items():
        chosen[key] = Setting(value, source)

    cluster_name = chosen["cluster"].value if "cluster" in chosen else "auto"
    plugin = select_cluster(cluster_name, environ, clusters)
    contribution = plugin.contribute(environ) if plugin is not None else Contribution()
    warnings: list[str] = list(contribution.warnings)

    for key, setting in contribution.values.items():
        if key not in chosen:
            chosen[key] = setting

    # "auto" (given or default) is the cluster's layout, else one launcher per node
    if "layout" not in chosen or chosen["layout"].value == "auto":
        chosen["layout"] = contribution.values.get("layout") or Setting(NODE_LAYOUT, "default")
    if chosen["layout"].value == NODE_LAYOUT and contribution.values.get("layout") is not None \
            and contribution.values["layout"].value != NODE_LAYOUT:
        # an explicit --layout=node overrides the cluster: its task identity does not apply
        for key in ("task_rank", "local_rank", "layout_reason"):
            chosen.pop(key, None)
        if chosen.get("nproc_per_node") is contribution.values.get("nproc_per_node"):
            chosen.pop("nproc_per_node")

    # Defaults and derived values.
    for option in OPTIONS:
        if option.key in chosen or option.default is None:
            continue
        chosen[option.key] = Setting(option.default, "default")
    if free_port is not None and plugin is None and chosen["nnodes"].value == 1:
        from .ports import FREE_SOURCE

        for key in ("master_port", "aggregator_port"):
            if chosen[key].source == "default":
                taken = {s.value for k, s in chosen.items() if k.endswith("_port") and k != key}
                chosen[key] = Setting(free_port(taken), FREE_SOURCE)
    cluster_source = chosen["cluster"].source
    if cluster_name == "auto":
        cluster_source = f"detected:{plugin.name}" if plugin else "default"
    chosen["cluster"] = Setting(plugin.name if plugin else "none", cluster_source)
    if "run_name" not in chosen:
        stem = Path(script).stem if script else "run"
        stem = "".join(c if (c.isalnum() or c in "_.-") else "_" for c in stem) or "run"
        chosen["run_name"] = Setting(f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}", "default")
    if "aggregator_host" not in chosen:
        chosen["aggregator_host"] = Setting(chosen["master_addr"].value, "derived:master_addr")
    if "aggregator_bind_host" not in chosen:
        multi = chosen["nnodes"].value > 1
        chosen["aggregator_bind_host"] = Setting("0.0.0.0" if multi else "127.0.0.1", "derived:nnodes")

    omp = omp_threads(chosen, environ)
    if omp is not None:
        chosen["omp_threads"] = omp

    values = {k: s.value for k, s in chosen.items() if k not in OUTPUT_KEYS}
    values["outputs"] = {k: s.value for k, s in chosen.items() if k in OUTPUT_KEYS}
    sources = {k: s.source for k, s in chosen.items()}
    config = LaunchConfig(**values, sources=sources)

    explicit = {k for k, src in sources.items() if src == "cli" or src.startswith("env:TRACEML_")}
    warnings += [a.message for a in contribution.advice if not a.keys <= explicit]

    refusals = list(contribution.refusals)
    if plugin is not None:
        refusals += plugin.validate(config, environ)
    refusals += _core_checks(config)
    for refusal in refusals:
        from_plugin = [k for k in refusal.keys if not (sources.get(k, "default") == "cli" or sources.get(k, "").startswith("env:TRACEML_"))]
        if from_plugin or not refusal.keys:
            raise ConfigError(refusal.message, variable=refusal.variable)
        warnings.append(refusal.message + " (continuing: every value it concerns was set explicitly)")

    gpus = _task_gpu_warning(config, environ)
    if gpus:
        warnings.append(gpus)
    return LaunchConfig(**values, sources=sources, warnings=tuple(warnings))


def omp_threads(chosen: Mapping[str, Setting], environ: Mapping[str, str]) -> Optional[Setting]:
    """The workers' ``OMP_NUM_THREADS``: the user's own value always wins; else, where the cluster
    says how many CPUs this task has, those CPUs over the workers this process starts (the node
    layout's ``nproc_per_node``; one in the task layout, where each task is one rank), at least 1.
    Set, it also silences torchrun's four-line "Setting OMP_NUM_THREADS ... to 1" banner, which
    picks 1 whatever the task has."""
    own = (environ.get("OMP_NUM_THREADS") or "").strip()
    if own:
        return Setting(own, "env:OMP_NUM_THREADS")
    cpus = chosen.get("task_cpus")
    if cpus is None or not isinstance(cpus.value, int):
        return None
    task = chosen["layout"].value == TASK_LAYOUT
    workers = 1 if task else max(1, int(chosen["nproc_per_node"].value))
    return Setting(str(max(1, cpus.value // workers)),
                   "derived:task_cpus" if task else "derived:task_cpus/nproc_per_node")


def _task_gpu_warning(c: LaunchConfig, environ: Mapping[str, str]) -> Optional[str]:
    """Task layout: this task sees fewer GPUs than its local rank needs.

    With ``srun --gpus-per-task=1`` (or ``--gpu-bind``) each task sees only its own GPU, so
    ``CUDA_VISIBLE_DEVICES`` holds one device and a script's ``torch.cuda.set_device(LOCAL_RANK)``
    fails with "invalid device ordinal" on every local rank but 0. Said once per node: by the
    first local rank that cannot select its GPU by number (torchrun's layout never has this: its
    workers share the node's devices)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if c.layout != TASK_LAYOUT or c.local_rank is None or visible is None:
        return None
    devices = [d for d in visible.split(",") if d.strip()]
    if not devices or c.local_rank != len(devices):  # none: a CPU run; fewer: this rank is fine
        return None
    n = len(devices)
    return (f"local rank {c.local_rank} (rank {c.task_rank}, node {c.node_rank}) sees {n} GPU"
            f"{'s' if n > 1 else ''} (CUDA_VISIBLE_DEVICES={visible}): this step gives each task only its own "
            f"GPUs (srun --gpus-per-task or --gpu-bind), so a script that selects its GPU by local rank "
            f"(torch.cuda.set_device(LOCAL_RANK), cuda:LOCAL_RANK) fails with 'invalid device ordinal' on "
            f"local ranks {n} and up. Either select cuda:0 .. cuda:{n - 1} in the script "
            f"(LOCAL_RANK % torch.cuda.device_count()), or request the node's GPUs for the step "
            f"(--gpus-per-node or --gres=gpu:N, without --gpus-per-task) so every task sees all of them.")


def _core_checks(c: LaunchConfig) -> list[Refusal]:
    """Checks that hold for every cluster; an empty ``keys`` makes the refusal unconditional."""
    out: list[Refusal] = []
    if c.world_size > WORLD_SIZE.hi:
        out.append(Refusal(
            f"{c.nnodes:,} nodes (from {c.source('nnodes')}) x {c.nproc_per_node:,} workers per node (from "
            f"{c.source('nproc_per_node')}) make {c.world_size:,} ranks, more than TraceML supports "
            f"({WORLD_SIZE.hi:,}: {WORLD_SIZE.why}). Check both values.", frozenset(), "nnodes"))
    if c.node_rank >= c.nnodes:
        out.append(Refusal(
            f"node rank {c.node_rank} (from {c.source('node_rank')}) is not below the node count "
            f"{c.nnodes} (from {c.source('nnodes')}). Node ranks run 0..{c.nnodes - 1}: fix --node-rank "
            f"or --nnodes.", frozenset(), "node_rank"))
    if c.nnodes > 1 and c.mode != "summary":
        out.append(Refusal(
            f"--mode={c.mode} (from {c.source('mode')}) is for a single node, but this run has "
            f"{c.nnodes} nodes. Use --mode=summary (the default) for multi-node runs; watch a single-node "
            f"run live instead.", frozenset(), "mode"))
    if c.nnodes > 1 and _is_loopback(c.master_addr):
        out.append(Refusal(
            f"the master address {c.master_addr!r} (from {c.source('master_addr')}) is a loopback address, "
            f"but this run has {c.nnodes} nodes: the other nodes cannot reach it. Pass node 0's hostname "
            f"or IP with --master-addr.", frozenset(), "master_addr"))
    if c.nnodes > 1 and _is_loopback(c.aggregator_host):
        out.append(Refusal(
            f"the aggregator host {c.aggregator_host!r} (from {c.source('aggregator_host')}) is a loopback "
            f"address, but this run has {c.nnodes} nodes. Pass node 0's address with --aggregator-host.",
            frozenset(), "aggregator_host"))
    if c.layout == TASK_LAYOUT and c.mode != "summary":
        out.append(Refusal(
            f"--mode={c.mode} (from {c.source('mode')}) needs one launcher per node, but this launch is one "
            f"task per GPU (layout task, from {c.source('layout')}). Use --mode=summary, or launch one "
            f"`traceml run` per node (srun --ntasks-per-node=1) to watch live.", frozenset(), "mode"))
    if c.layout == TASK_LAYOUT and (c.task_rank is None or c.local_rank is None):
        out.append(Refusal(
            f"--layout=task (from {c.source('layout')}) needs each task's rank from the cluster (under "
            f"Slurm, SLURM_PROCID and SLURM_LOCALID inside an srun step with several tasks per node), and "
            f"none is known here. Launch with `srun --ntasks-per-node=G traceml run train.py`, or use "
            f"--layout=node (one launcher per node starts the workers).", frozenset(), "layout"))
    if c.master_port == c.aggregator_port:
        out.append(Refusal(
            f"--master-port and --aggregator-port are both {c.master_port}; node 0 needs two different "
            f"ports. Change one of them.", frozenset(), "aggregator_port"))
    return out


def from_environ(cli: Mapping[str, Any], script: Optional[str] = None) -> LaunchConfig:
    return resolve(cli, os.environ, script=script)
