"""One set of Slurm facts: what TraceML knows of the Slurm job from one process's environment, read once.

:class:`Facts` is the only reader of the environment mapping in ``traceml_slurm``: the resolver
(:mod:`.environment`) turns facts into launch-config contributions, and every doctor check reads
facts, never the mapping. It is a pure function of the mapping (no ``scontrol``, no files), and
``Facts.of(environ)`` returns the same object for the same mapping, so the resolver's contribute and
validate, the doctor's checks and its launch config share one reading.

What it holds, each computed on first use:

- :attr:`Facts.vars`: the ``SLURM_*`` variables, typed and bounded, each with its source
  (:class:`~.settings.SlurmVars`; a malformed one is a :class:`ConfigError` naming it);
- :attr:`Facts.context`: where in the job this process runs (:mod:`.context`);
- :attr:`Facts.job_hosts`, :attr:`Facts.step_hosts`: the node lists, expanded;
- :attr:`Facts.gpus`: the GPUs Slurm gave this node (one rule for every reader);
- :attr:`Facts.layout`: the srun step's layout decision (one launcher per node, or one task per
  GPU) with its refusals and warnings; :attr:`Facts.job_layout`: what a bare ``srun traceml run``
  of the job would decide, seen from its batch or salloc shell;
- :meth:`Facts.node0_step`: the facts of the srun step ``srun --ntasks-per-node=1 traceml run``
  would start on node 0 (what the doctor shows from a shell);
- :attr:`Facts.env`: the rest of the process environment that TraceML judges (launcher variables
  left from a login shell, ``TRACEML_*``, NCCL/gloo/CUDA variables, ``SBATCH_SIGNAL``, ``PATH``).

A new fact (CPU binding, node health) is a new cached property here, with the variables it reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, Optional

from traceml_core.errors import ConfigError
from traceml_core.plugins import Refusal

from .context import Context, classify
from .hostlists import expand_nodelist, tasks_per_node

if TYPE_CHECKING:  # pydantic costs ~0.1 s to import: paid only when a SLURM_* value is read
    from pathlib import Path

    from .settings import SlurmVars

#: what a launch contradicting the layout gets refused for (the resolver's refusal keys)
LAUNCH_KEYS = frozenset({"nnodes", "node_rank", "master_addr"})
#: variables torchrun sets for each worker; inherited from a login shell they mislead scripts and us
LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "NODE_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")
#: prefixes of the communication variables the doctor judges (NCCL, gloo, torch's NCCL and CUDA switches)
COMM_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "CUDA_")
#: TRACEML_* variables that are not launch settings (secrets, the doctor's own protocol, the test cluster)
_NOT_SETTINGS = ("TRACEML_TOKEN", "TRACEML_DOCTOR_", "TRACEML_CLUSTER_", "TRACEML_NODE_STORE")


def launcher_srun_line(nnodes: Optional[int]) -> str:
    n = f"--nodes={nnodes} " if nnodes else ""
    return f"srun {n}--ntasks-per-node=1 traceml run train.py"


@dataclass(frozen=True)
class Refused:
    """A refusal with its fix apart: ``traceml run`` prints them as one message (:meth:`refusal`),
    the doctor as an observation and a ``fix:`` line."""

    what: str
    fix: str
    keys: frozenset[str]
    variable: Optional[str] = None

    @property
    def message(self) -> str:
        return f"{self.what}. {self.fix}"

    def refusal(self) -> Refusal:
        return Refusal(self.message, self.keys, self.variable)


@dataclass(frozen=True)
class Gpus:
    """The GPUs Slurm gave this node: ``SLURM_GPUS_ON_NODE``, or in a step of a Slurm older than 21.08
    (which has no such variable) the count of ``SLURM_STEP_GPUS``. ``count`` None: Slurm says nothing."""

    count: Optional[int]
    source: Optional[str]

    @property
    def allocated(self) -> int:
        return self.count or 0


@dataclass(frozen=True)
class Layout:
    """How an srun step's tasks become ranks: one launcher per node (``"node"``: its ``traceml run``
    starts a worker per GPU with torchrun) or one task per GPU (``"task"``: each task one rank, no
    torchrun), decided from the step's tasks per node; ``kind`` None when the nodes run different
    numbers of tasks (then refused). The refusals and warnings are what ``traceml run`` says."""

    kind: Optional[str]
    per_node: int
    text: str
    variable: str
    reason: str = ""
    refusals: tuple[Refused, ...] = ()
    warnings: tuple[str, ...] = ()
    #: the task layout's rank and local rank (SLURM_PROCID, SLURM_LOCALID)
    task_rank: Optional[int] = None
    local_rank: Optional[int] = None


def decide_layout(text: str, variable: str, where: str, nnodes: Optional[int]) -> Layout:
    """The layout rule, once: 1 task per node is one launcher per node; N>1 tasks on every node is one
    task per GPU; different numbers on different nodes is neither (refused)."""
    runs = tasks_per_node(text, variable)
    counts = sorted({count for count, _ in runs})
    most = counts[-1]
    if most <= 1:
        return Layout("node", most, text, variable, "one task per node: this node's `traceml run` starts one "
                      "worker per GPU with torchrun")
    if len(counts) > 1:
        return Layout(None, most, text, variable, refusals=(Refused(
            f"{where} runs a different number of tasks on different nodes ({variable}={text})",
            f"One task per GPU needs the same number on every node: `srun --ntasks-per-node=G traceml run "
            f"train.py` with G GPUs per node; or start one launcher per node: `{launcher_srun_line(nnodes)}`.",
            LAUNCH_KEYS | {"layout"}, variable),))
    return Layout("task", most, text, variable)


@dataclass(frozen=True)
class ProcessEnv:
    """The process environment TraceML judges besides Slurm's variables (read once, with the facts)."""

    path: str = ""
    #: torchrun's per-worker variables set in this environment (stale from a login shell?)
    launcher_vars: Mapping[str, str] = field(default_factory=dict)
    #: TRACEML_* launch settings set here (not the token, the doctor's or the test cluster's own)
    traceml_vars: Mapping[str, str] = field(default_factory=dict)
    #: NCCL_*, TORCH_NCCL_*, GLOO_*, CUDA_* variables set here
    comm_vars: Mapping[str, str] = field(default_factory=dict)
    #: the device list Slurm exports (None: unset; () for "", "NoDevFiles" and "-1")
    cuda_visible_devices: Optional[tuple[str, ...]] = None
    #: `sbatch --signal` as the submitting shell exported it
    sbatch_signal: Optional[str] = None
    #: https://no-color.org: set (to anything) means no colour
    no_color: bool = False


@dataclass(frozen=True)
class CpuGrant:
    """The CPU variables of a Slurm task (:attr:`Facts.cpus`); None: unset or malformed."""

    cpus_per_task: Optional[int]
    srun_cpus_per_task: Optional[int]
    cpus_on_node: Optional[int]


def _count(raw: Optional[str]) -> Optional[int]:
    from traceml_core.limits import CPUS_PER_TASK

    text = (raw or "").strip()
    if not text.isdigit():
        return None
    n = int(text)
    return n if 1 <= n <= CPUS_PER_TASK.hi * 64 else None


def _visible(raw: Optional[str]) -> Optional[tuple[str, ...]]:
    if raw is None:
        return None
    raw = raw.strip()
    if raw in ("", "NoDevFiles", "-1"):
        return ()
    return tuple(p.strip() for p in raw.split(",") if p.strip())


class Facts:
    """What TraceML knows of the Slurm job from one environment mapping (see the module doc)."""

    _last: Optional[tuple[dict[str, str], "Facts"]] = None
    _lock = threading.Lock()

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._env = dict(environ)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> "Facts":
        """The facts of ``environ``: the same object for an equal mapping as the last call (the
        resolver's contribute and validate, and the doctor, read one environment many times)."""
        snapshot = dict(environ)
        with cls._lock:
            last = cls._last
            if last is not None and last[0] == snapshot:
                return last[1]
            facts = cls(snapshot)
            cls._last = (snapshot, facts)
            return facts

    @property
    def environ(self) -> Mapping[str, str]:
        """The mapping the facts were read from, read-only: to hand to core's resolver and to child
        processes, never to read a value from (a value read belongs in a fact here)."""
        return MappingProxyType(self._env)

    @property
    def omp_num_threads(self) -> Optional[str]:
        """``OMP_NUM_THREADS`` as the step has it (unset: torchrun sets 1 per worker); the doctor
        shows it beside the CPU request."""
        return self._env.get("OMP_NUM_THREADS")

    # -- the job ---------------------------------------------------------------------------------

    @property
    def in_job(self) -> bool:
        """``SLURM_JOB_ID`` is set (cheap: decides whether Slurm is detected at all)."""
        return bool(self._env.get("SLURM_JOB_ID", "").strip())

    @cached_property
    def vars(self) -> "SlurmVars":
        """Raises ConfigError for a malformed ``SLURM_*`` value (naming it, its value and the fix)."""
        from .settings import SlurmVars

        return SlurmVars.from_environ(self._env)

    @cached_property
    def context(self) -> Context:
        """Raises ConfigError for a malformed ``SLURM_*`` value."""
        return classify(self.vars)

    @property
    def context_or_guess(self) -> Context:
        """The context, or with a malformed variable the best guess (a job id: a step), for reports."""
        try:
            return self.context
        except ConfigError:
            return Context.STEP if self.in_job else Context.NONE

    @property
    def in_step(self) -> bool:
        return self.context in (Context.STEP, Context.INTERACTIVE_STEP)

    @property
    def job_id(self) -> Optional[str]:
        """The job id as Slurm wrote it (no parsing: for reports even when other values are malformed)."""
        return self._env.get("SLURM_JOB_ID", "").strip() or None

    @property
    def job_name(self) -> Optional[str]:
        return self._env.get("SLURM_JOB_NAME", "").strip() or None

    @property
    def node_name(self) -> Optional[str]:
        """This node's Slurm name (as in the node lists); None outside a compute node."""
        return self._env.get("SLURMD_NODENAME", "").strip() or None

    @property
    def job_nodes(self) -> Optional[int]:
        v = self.vars
        return v.job_num_nodes or v.nnodes

    @property
    def step_nodes(self) -> Optional[int]:
        v = self.vars
        return v.step_num_nodes if v.step_num_nodes is not None else v.nnodes

    # -- node lists ------------------------------------------------------------------------------

    @cached_property
    def job_hosts(self) -> tuple[str, ...]:
        """``SLURM_JOB_NODELIST`` expanded (empty when unset); ConfigError when malformed."""
        text = self.vars.job_nodelist
        return tuple(expand_nodelist(text, "SLURM_JOB_NODELIST")) if text is not None else ()

    @property
    def step_list_field(self) -> str:
        """Where this step's node list comes from: ``step_nodelist``, else the job's."""
        return "step_nodelist" if self.vars.step_nodelist is not None else "job_nodelist"

    @cached_property
    def step_hosts(self) -> tuple[str, ...]:
        """This step's node list expanded (the job's when the step has none); ConfigError when malformed
        or empty."""
        f = self.step_list_field
        return tuple(expand_nodelist(getattr(self.vars, f) or "", type(self.vars).variable(f)))

    @cached_property
    def het_components_touched(self) -> int:
        """How many heterogeneous job components this step's nodes come from (0 outside a het job)."""
        v = self.vars
        step = set(expand_nodelist(v.step_nodelist or v.job_nodelist or "", "SLURM_STEP_NODELIST"))
        touched = 0
        for i in range(v.het_size or 0):
            group = self._env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{i}", "")
            if group.strip() and step & set(expand_nodelist(group, f"SLURM_JOB_NODELIST_HET_GROUP_{i}")):
                touched += 1
        return touched

    # -- GPUs ------------------------------------------------------------------------------------

    @cached_property
    def gpus(self) -> Gpus:
        v = self.vars
        if v.gpus_on_node is not None:
            return Gpus(v.gpus_on_node, v.source("gpus_on_node"))
        if v.step_gpus and self.in_step:
            n = len([g for g in v.step_gpus.split(",") if g.strip()])
            if n:
                return Gpus(n, v.source("step_gpus") + "(count)")
        return Gpus(None, None)

    # -- layout ----------------------------------------------------------------------------------

    @cached_property
    def layout(self) -> Optional[Layout]:
        """The srun step's layout decision (None outside a step, or when Slurm gives no tasks per
        node). Raises ConfigError when the task layout's rank variables are missing or out of range."""
        v = self.vars
        if not self.in_step or not v.step_tasks_per_node:
            return None
        nnodes = self.step_nodes or 1
        base = decide_layout(v.step_tasks_per_node, "SLURM_STEP_TASKS_PER_NODE", "this srun step", nnodes)
        tpn = v.step_tasks_per_node
        if base.kind == "node":
            return Layout("node", base.per_node, tpn, base.variable, base.reason)
        if base.kind is None:
            return base
        most = base.per_node
        per_task = f"this srun step runs {most} tasks on each node (SLURM_STEP_TASKS_PER_NODE={tpn})"
        missing = [name for name, val in (("SLURM_PROCID", v.procid), ("SLURM_LOCALID", v.localid)) if val is None]
        if missing:
            raise ConfigError(
                f"{per_task}, so each task is one rank, but {' and '.join(missing)} is not set, so this "
                f"task's rank is unknown. srun sets it in every task; if a wrapper script clears the "
                f"environment, keep the SLURM_* variables.", variable=missing[0])
        refusals: list[Refused] = []
        warnings: list[str] = []
        world = nnodes * most
        if v.step_num_tasks is not None and v.step_num_tasks != world:
            refusals.append(Refused(
                f"{per_task} on {nnodes} node(s), which makes {world} ranks, but the step has "
                f"{v.step_num_tasks} tasks (SLURM_STEP_NUM_TASKS)",
                f"Give srun whole nodes: `srun --nodes={nnodes} --ntasks-per-node={most} traceml run train.py`.",
                LAUNCH_KEYS | {"layout"}, "SLURM_STEP_NUM_TASKS"))
        if v.procid is not None and v.procid >= world or v.localid is not None and v.localid >= most:
            raise ConfigError(
                f"SLURM_PROCID={v.procid} / SLURM_LOCALID={v.localid} are out of range for {world} ranks, "
                f"{most} per node. These come from Slurm; if your script sets them, remove that.",
                variable="SLURM_PROCID")
        gpus = self.gpus.count
        if not gpus:
            warnings.append(
                f"no GPU is allocated to this job: each of the {most} tasks per node is one CPU rank. "
                f"Request GPUs with --gres=gpu:{most} (one per task).")
        elif gpus != most:
            refusals.append(Refused(
                f"this srun step runs {most} tasks per node (SLURM_STEP_TASKS_PER_NODE) but the node has "
                f"{gpus} GPU(s) (SLURM_GPUS_ON_NODE): with one task per GPU they must match",
                f"Either `srun --ntasks-per-node={gpus} traceml run train.py` (one task per GPU) or "
                f"`srun --ntasks-per-node=1 traceml run train.py` (one launcher per node, which starts "
                f"a worker per GPU).", frozenset({"layout"}), "SLURM_GPUS_ON_NODE"))
        reason = (f"{per_task}: each task is one rank (rank SLURM_PROCID={v.procid}, local rank "
                  f"SLURM_LOCALID={v.localid} of {most}); no torchrun. Local rank 0 of each node runs the "
                  f"node's relay, rank 0 the aggregator.")
        return Layout("task", most, tpn, base.variable, reason, tuple(refusals), tuple(warnings), v.procid, v.localid)

    @cached_property
    def job_layout(self) -> Optional[Layout]:
        """From a batch or salloc shell: what a bare ``srun traceml run`` of the job would decide, from
        the job's tasks per node (``SLURM_TASKS_PER_NODE``); None when Slurm gives none."""
        text = self._env.get("SLURM_TASKS_PER_NODE", "").strip()
        if not text:
            return None
        return decide_layout(text, "SLURM_TASKS_PER_NODE", "the job", self.job_nodes)

    # -- the emulated step of node 0 ---------------------------------------------------------------

    def node0_step(self) -> Optional["Facts"]:
        """From a batch or salloc shell: the facts of the task ``srun --ntasks-per-node=1 traceml run``
        would start on node 0 (Slurm's step variables for it: a one-task-per-node step over the job's
        nodes, node id 0 on the first host). None when the job's nodes are unknown."""
        try:
            hosts = self.job_hosts
        except ConfigError:
            return None
        if not hosts:
            return None
        n = len(hosts)
        env = dict(self._env)
        env.update({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": str(n),
                    "SLURM_STEP_NODELIST": self._env.get("SLURM_JOB_NODELIST", ",".join(hosts)),
                    "SLURM_STEP_TASKS_PER_NODE": f"1(x{n})" if n > 1 else "1", "SLURM_NODEID": "0",
                    "SLURM_STEP_NUM_TASKS": str(n), "SLURMD_NODENAME": hosts[0]})
        return Facts.of(env)

    # -- node health ---------------------------------------------------------------------------------

    @property
    def cluster_name(self) -> str:
        """``SLURM_CLUSTER_NAME`` (node names are per cluster: the node store keys hosts by it)."""
        return self._env.get("SLURM_CLUSTER_NAME", "").strip()

    @cached_property
    def node_store(self) -> "Path":
        """The user's node evidence store (``TRACEML_NODE_STORE``, else under ``XDG_CACHE_HOME`` or
        ``~/.cache``: nodes/store.py)."""
        from .nodes.store import default_path

        return default_path(self._env.get)

    # -- CPU binding ---------------------------------------------------------------------------------

    @cached_property
    def cpus(self) -> "CpuGrant":
        """What Slurm gave this task in CPUs: ``SLURM_CPUS_PER_TASK`` (the job's ``--cpus-per-task``;
        unset: Slurm's default of one per task), ``SRUN_CPUS_PER_TASK`` (what srun passes on),
        ``SLURM_CPUS_ON_NODE``. Read leniently: a malformed value is unknown (None), never a
        refusal of the launch (this is telemetry, not the launch's)."""
        return CpuGrant(_count(self._env.get("SLURM_CPUS_PER_TASK")),
                        _count(self._env.get("SRUN_CPUS_PER_TASK")),
                        _count(self._env.get("SLURM_CPUS_ON_NODE")))

    # -- the rest of the process environment --------------------------------------------------------

    @cached_property
    def env(self) -> ProcessEnv:
        e = self._env
        return ProcessEnv(
            path=e.get("PATH", ""),
            launcher_vars={k: e[k] for k in LAUNCHER_VARS if e.get(k, "").strip()},
            traceml_vars={k: v for k, v in e.items() if k.startswith("TRACEML_") and not k.startswith(_NOT_SETTINGS)},
            comm_vars={k: v for k, v in e.items() if k.startswith(COMM_PREFIXES)},
            cuda_visible_devices=_visible(e.get("CUDA_VISIBLE_DEVICES")),
            sbatch_signal=e.get("SBATCH_SIGNAL", "").strip() or None,
            no_color=e.get("NO_COLOR") is not None,
        )
