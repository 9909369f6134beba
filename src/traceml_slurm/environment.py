"""The Slurm cluster environment: detect a Slurm job and contribute launch values, with sources.

A pure function of the environment mapping (no ``scontrol``: container images often lack it): the
mapping is read once into :class:`~.facts.Facts` (the variables, the node lists, the GPUs, the layout
decision with its refusals), and the launch values are made from the facts. Ports not set by the user
are derived from ``SLURM_JOB_ID`` (:func:`job_ports`). Inside an srun step the step's values win over
the job's: a ``srun -N1 -w node02`` step inside a 2-node job is a one-node launch whose master is node02.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

from traceml_core.errors import ConfigError
from traceml_core.limits import JOB_ID
from traceml_core.plugins import Advice, ClusterEnvironment, Contribution, NextJob, Refusal, RunEvidence, Setting

from .context import Context
from .facts import LAUNCH_KEYS, Facts, launcher_srun_line

if TYPE_CHECKING:
    from .settings import SlurmVars


_RUN_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")

#: Job-derived ports: under Slurm, when neither flag nor TRACEML_* variable sets them, the
#: rendezvous and aggregator ports come from SLURM_JOB_ID, so two jobs sharing a node do not clash
#: and every node of a job computes the same pair without talking. Each job owns a block of 4
#: ports (master, aggregator, then the dashboard's default "aggregator + 1" and one spare), so
#: nothing a job derives from its ports lands in another job's block. The range lies above Linux's
#: default ephemeral range (32768-60999), so outgoing connections never hold these ports.
PORT_BASE = 61440
PORT_BLOCK = 4
PORT_SLOTS = (65536 - PORT_BASE) // PORT_BLOCK  # 1024 jobs before a block is reused


def job_ports(job_id: str) -> tuple[int, int]:
    """``(master_port, aggregator_port)`` for a Slurm job id; ids 1024 apart share a block."""
    first = PORT_BASE + PORT_BLOCK * (int(job_id) % PORT_SLOTS)
    return first, first + 1


def sanitise_run_name(name: str) -> str:
    cleaned = _RUN_NAME_BAD.sub("_", name).strip("._-")
    return cleaned[:80] or "job"


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SlurmEnvironment(ClusterEnvironment):
    name: ClassVar[str] = "slurm"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return Facts.of(environ).in_job

    def contribute(self, environ: Mapping[str, str]) -> Contribution:
        facts = Facts.of(environ)
        v = facts.vars
        ctx = facts.context
        out = Contribution()
        values = out.values
        if ctx is Context.NONE:
            return out

        values["job_id"] = Setting(v.job_id, v.source("job_id"))
        job_id = str(v.job_id)
        if not (job_id.isascii() and job_id.isdigit()) or len(job_id) > 10 or int(job_id) > JOB_ID.hi:
            raise ConfigError(
                f"SLURM_JOB_ID={v.job_id!r} is not a Slurm job id (a whole number {JOB_ID.text()}). Slurm "
                f"sets this variable; if your script or shell sets it, remove that (or pass "
                f"--cluster=none to ignore Slurm).", variable="SLURM_JOB_ID")
        master_port, aggregator_port = job_ports(v.job_id)
        values["master_port"] = Setting(master_port, v.source("job_id"))
        values["aggregator_port"] = Setting(aggregator_port, v.source("job_id"))
        if v.nodename:
            values["node_name"] = Setting(v.nodename, v.source("nodename"))
        if v.job_start_time:  # Slurm >= 23.02; 0 or absent: not known
            values["job_start_time"] = Setting(float(v.job_start_time), v.source("job_start_time"))
        if v.job_end_time:  # Slurm >= 23.02; 0 or absent: not known
            values["job_end_time"] = Setting(float(v.job_end_time), v.source("job_end_time"))
        # Slurm sets it once the job was requeued; unset: it never was
        values["restart_count"] = (Setting(v.restart_count, v.source("restart_count")) if v.restart_count
                                   is not None else Setting(0, "slurm:unset SLURM_RESTART_COUNT"))
        if v.submit_dir:
            values["logs_dir"] = Setting(v.submit_dir.rstrip("/") + "/logs", v.source("submit_dir"))
        values["run_name"] = self._run_name(v)

        job_nodes = v.job_num_nodes or v.nnodes
        if ctx is Context.SALLOC_SHELL and v.job_nodelist is None and job_nodes is None:
            out.refusals.append(Refusal(
                f"SLURM_JOB_ID={v.job_id} is set, but nothing else of a Slurm job is (no SLURM_JOB_NODELIST, "
                f"SLURM_NNODES or SLURM_NODEID): probably a leftover in this shell, not a job. Pass "
                f"--cluster=none (or unset SLURM_JOB_ID) to launch outside Slurm; inside a real allocation, "
                f"start one launcher per node with `{launcher_srun_line(None)}`.",
                LAUNCH_KEYS | {"nproc_per_node"}, "SLURM_JOB_ID"))
        elif ctx is Context.SALLOC_SHELL:
            out.refusals.append(Refusal(
                f"this is an salloc shell on the login host (SLURM_JOB_ID={v.job_id}, no SLURM_NODEID), not "
                f"a compute node of the allocation. Start one launcher per node with: "
                f"`{launcher_srun_line(job_nodes)}` (or pass --cluster=none to launch on this host "
                f"outside Slurm).",
                LAUNCH_KEYS | {"nproc_per_node"}, "SLURM_STEP_ID"))
        if ctx is Context.INTERACTIVE_STEP and (job_nodes or 1) > 1:
            out.refusals.append(Refusal(
                f"this is an interactive step (SLURM_STEP_ID={v.step_id}) of a {job_nodes}-node allocation: "
                f"a launch from here would use one node only. Start one launcher per node from this shell "
                f"with: `srun --overlap --nodes={job_nodes} --ntasks-per-node=1 traceml run train.py`.",
                LAUNCH_KEYS, "SLURM_STEP_ID"))

        in_step = facts.in_step
        if in_step:
            self._step_values(facts, out)
        else:
            self._shell_values(facts, out)

        self._gpu_values(facts, out)
        self._cpu_values(facts, out)
        self._master_addr_env(facts, out)
        self._master_port_env(facts, out)
        if v.het_size and v.het_size > 1 and in_step and facts.het_components_touched > 1:
            out.refusals.append(Refusal(
                f"this srun step spans {v.het_size} heterogeneous job components (SLURM_HET_SIZE="
                f"{v.het_size}); TraceML needs one homogeneous set of nodes. Launch in one component: "
                f"`srun --het-group=0 --ntasks-per-node=1 traceml run train.py`.",
                LAUNCH_KEYS | {"nproc_per_node"}, "SLURM_HET_SIZE"))
        return out

    # -- pieces -------------------------------------------------------------------------------

    def _run_name(self, v: SlurmVars) -> Setting:
        name = sanitise_run_name(v.job_name or "job")
        if v.array_job_id and v.array_task_id:
            ident, src = f"{v.array_job_id}_{v.array_task_id}", "slurm:SLURM_ARRAY_JOB_ID+SLURM_ARRAY_TASK_ID"
        else:
            ident, src = str(v.job_id), "slurm:SLURM_JOB_NAME+SLURM_JOB_ID"
        # the same for every requeue of the job (SLURM_RESTART_COUNT is the attempt, not the run):
        # the attempts share one run directory and one goodput ledger (traceml_core/attempts.py)
        return Setting(f"{name}-{sanitise_run_name(ident)}", src)

    def _step_values(self, facts: Facts, out: Contribution) -> None:
        v = facts.vars
        values = out.values
        nnodes_src = "step_num_nodes" if v.step_num_nodes is not None else "nnodes"
        nnodes = v.step_num_nodes if v.step_num_nodes is not None else v.nnodes
        if nnodes is None:
            raise ConfigError(
                "SLURM_STEP_NUM_NODES is not set inside this srun step, so the node count is unknown. "
                "Pass --nnodes explicitly.", variable="SLURM_STEP_NUM_NODES")
        values["nnodes"] = Setting(nnodes, v.source(nnodes_src))
        if v.nodeid is None:
            raise ConfigError(
                "SLURM_NODEID is not set inside this srun step, so this node's rank is unknown. Pass "
                "--node-rank explicitly.", variable="SLURM_NODEID")
        if v.nodeid >= nnodes:
            raise ConfigError(
                f"SLURM_NODEID={v.nodeid} is not below the step's node count {nnodes} "
                f"({v.source(nnodes_src)[6:]}). These come from Slurm; if your script sets either, remove that.",
                variable="SLURM_NODEID")
        values["node_rank"] = Setting(v.nodeid, v.source("nodeid"))
        list_field = facts.step_list_field
        nodelist = getattr(v, list_field)
        list_var = type(v).variable(list_field)
        hosts = facts.step_hosts
        if len(hosts) != nnodes:
            # a list that does not match the step cannot say which host is node 0 (or which rank
            # this node is): refuse rather than guess, unless the user gives the values themselves
            shown = nodelist if len(nodelist or "") <= 120 else (nodelist or "")[:117] + "..."
            out.refusals.append(Refusal(
                f"{list_var}={shown!r} names {len(hosts):,} host(s) but this step has {nnodes:,} node(s) "
                f"({v.source(nnodes_src)[6:]}), so which host is node 0 (the master) is unknown. These come "
                f"from Slurm; if your script sets either, remove that. To launch anyway, pass --nnodes, "
                f"--node-rank and --master-addr (or --cluster=none).",
                LAUNCH_KEYS, list_var))
        values["master_addr"] = Setting(hosts[0], v.source(list_field) + "[0]")
        if len(hosts) == nnodes:
            values["hostnames"] = Setting(tuple(hosts), v.source(list_field))
        self._layout_values(facts, out)

    def _layout_values(self, facts: Facts, out: Contribution) -> None:
        """The step's layout decision (:attr:`Facts.layout`): one launcher per node (one task per node;
        the default) or one task per GPU (several tasks per node: Lightning's and submitit's layout,
        each task one rank, no torchrun), with its refusals and warnings."""
        layout = facts.layout
        if layout is None:
            return
        v = facts.vars
        values = out.values
        out.refusals.extend(r.refusal() for r in layout.refusals)
        out.warnings.extend(layout.warnings)
        if layout.kind is None:
            return
        values["layout"] = Setting(layout.kind, f"slurm:SLURM_STEP_TASKS_PER_NODE={layout.text}")
        values["layout_reason"] = Setting(layout.reason, "slurm:SLURM_STEP_TASKS_PER_NODE")
        if layout.kind == "task":
            values["nproc_per_node"] = Setting(layout.per_node, "slurm:SLURM_STEP_TASKS_PER_NODE")
            values["task_rank"] = Setting(layout.task_rank, v.source("procid"))
            values["local_rank"] = Setting(layout.local_rank, v.source("localid"))

    def _shell_values(self, facts: Facts, out: Contribution) -> None:
        v, ctx = facts.vars, facts.context
        values = out.values
        nnodes = v.job_num_nodes if v.job_num_nodes is not None else v.nnodes
        field = "job_num_nodes" if v.job_num_nodes is not None else "nnodes"
        if nnodes is None:
            return
        values["nnodes"] = Setting(nnodes, v.source(field))
        if v.job_nodelist is not None:
            hosts = facts.job_hosts
            values["master_addr"] = Setting(hosts[0], v.source("job_nodelist") + "[0]")
        if ctx is Context.BATCH_SHELL:
            values["node_rank"] = Setting(0, "slurm:batch-shell")
            if nnodes > 1:
                out.refusals.append(Refusal(
                    f"this is the batch shell of a {nnodes}-node job (no SLURM_STEP_ID): it runs on the first "
                    f"node only, and SLURM_NODEID=0 here would be the rank of every node. Start one launcher "
                    f"per node from the sbatch script with `{launcher_srun_line(nnodes)}` (or "
                    f"`srun launch.sh`); each node then reads its own rank.",
                    LAUNCH_KEYS, "SLURM_STEP_ID"))

    def _gpu_values(self, facts: Facts, out: Contribution) -> None:
        values = out.values
        layout = values.get("layout")
        if layout is not None and layout.value == "task":
            return  # one task per GPU: the layout decision judged the GPUs (Facts.layout)
        v, gpus = facts.vars, facts.gpus
        if gpus.count:
            values["nproc_per_node"] = Setting(gpus.count, gpus.source)
            return
        if not facts.in_step and v.ntasks_per_node is not None and v.ntasks_per_node > 1:
            # Only the batch shell still has the job's value: inside the launcher step
            # (`srun --ntasks-per-node=1`) Slurm replaces SLURM_NTASKS_PER_NODE with the step's 1.
            values["nproc_per_node"] = Setting(v.ntasks_per_node, v.source("ntasks_per_node"))
            out.advice.append(Advice(
                f"no GPU is allocated to this job; starting {v.ntasks_per_node} CPU workers per node "
                f"(SLURM_NTASKS_PER_NODE). Request GPUs with --gres=gpu:N or --gpus-per-node=N.",
                frozenset({"nproc_per_node"})))
            return
        values["nproc_per_node"] = Setting(1, "slurm:no-gpu")
        out.advice.append(Advice(
            "no GPU is allocated to this job (no SLURM_GPUS_ON_NODE); starting 1 worker per node. For a "
            "CPU job with N workers per node, pass --nproc-per-node=N (or export TRACEML_NPROC_PER_NODE=N "
            "in the sbatch script before srun), or request GPUs with --gres=gpu:N.",
            frozenset({"nproc_per_node"})))

    def _cpu_values(self, facts: Facts, out: Contribution) -> None:
        """``task_cpus``: the CPUs of this launcher's task, from which core derives the workers'
        ``OMP_NUM_THREADS`` (config.omp_threads): ``SLURM_CPUS_PER_TASK`` when the job asked for
        them, else the job's CPUs on this node (``SLURM_CPUS_ON_NODE``) shared by the node's tasks
        (one in the node layout; one per rank in the task layout)."""
        grant = facts.cpus
        if grant.cpus_per_task is not None:
            out.values["task_cpus"] = Setting(grant.cpus_per_task, "slurm:SLURM_CPUS_PER_TASK")
        elif grant.cpus_on_node is not None:
            layout = out.values.get("layout")
            tasks = facts.layout.per_node if layout is not None and layout.value == "task" and facts.layout else 1
            src = "slurm:SLURM_CPUS_ON_NODE" + (f"/{tasks} tasks" if tasks > 1 else "")
            out.values["task_cpus"] = Setting(max(1, grant.cpus_on_node // max(1, tasks)), src)

    def _master_addr_env(self, facts: Facts, out: Contribution) -> None:
        stale = facts.env.launcher_vars.get("MASTER_ADDR", "").strip()
        master = out.values.get("master_addr")
        if not stale or master is None or stale == master.value:
            return
        why = "a loopback address" if _is_loopback(stale) else "not the first node of this step"
        out.warnings.append(
            f"MASTER_ADDR={stale} in the environment is ignored ({why}; perhaps left over from the login "
            f"shell): the master is {master.value} ({master.source}). To override, pass --master-addr or "
            f"set TRACEML_MASTER_ADDR.")

    def _master_port_env(self, facts: Facts, out: Contribution) -> None:
        stale = facts.env.launcher_vars.get("MASTER_PORT", "").strip()
        port = out.values.get("master_port")
        if not stale or port is None or stale == str(port.value) or facts.env.traceml_vars.get("TRACEML_MASTER_PORT"):
            return
        out.warnings.append(
            f"MASTER_PORT={stale} in the environment is ignored: under Slurm the rendezvous port is "
            f"derived from the job id ({port.value}, {port.source}) so jobs sharing a node do not "
            f"clash. To pin it, pass --master-port or set TRACEML_MASTER_PORT.")

    def allocation_start(self, config: Any) -> Optional[float]:
        """SLURM_JOB_START_TIME where Slurm gives it (23.02 and later, already in the config), else
        the controller's StartTime of the job (2 s at most; the current attempt's, after a requeue)."""
        if config.job_start_time:
            return float(config.job_start_time)
        from .interrupts import controller_state

        facts = controller_state(config.job_id)
        return facts.get("start") if facts else None

    def scheduled_end(self, config: Any) -> Optional[float]:
        from .interrupts import scheduled_end

        return scheduled_end(config)

    def explain_interrupt(self, config: Any, signum: int, at: float) -> Optional[str]:
        from .interrupts import explain

        return explain(config, signum, at)

    def run_ended(self, evidence: RunEvidence, environ: Mapping[str, str]) -> Optional[NextJob]:
        """The exclude line when a host of this cluster is bad enough, judged from the user's node
        store and this run's evidence (checked against the job's allocation); reads the store only
        (traceml_slurm/nodes: the record is kept after the summary, :meth:`keep_evidence`)."""
        from .nodes import checked, judge_with, next_job

        facts = Facts.of(environ)
        kept, notes = checked(evidence, facts.job_id, _job_hosts(facts))
        health, more = judge_with(facts.node_store, facts.cluster_name, kept)
        return next_job(health, notes + more)

    def keep_evidence(self, evidence: RunEvidence, environ: Mapping[str, str]) -> list[str]:
        """The run's node evidence (checked as in :meth:`run_ended`) into the user's node store,
        after the summary is written: a bounded wait, skipped with a note when busy."""
        from .nodes import checked, keep

        facts = Facts.of(environ)
        kept, _ = checked(evidence, facts.job_id, _job_hosts(facts))
        return keep(facts.node_store, facts.cluster_name, kept)

    def cpu_request(self, environ: Mapping[str, str]) -> Optional[dict[str, Any]]:
        """What Slurm gave each task in CPUs, and the lines that ask for more (cpus.py)."""
        from .cpus import cpu_request

        return cpu_request(environ)

    # -- checks on the merged config -------------------------------------------------------------

    def validate(self, config: Any, environ: Mapping[str, str]) -> list[Refusal]:
        facts = Facts.of(environ)
        if not facts.in_step:
            return []
        v = facts.vars
        out: list[Refusal] = []
        step_nodes = v.step_num_nodes or v.nnodes
        if config.source("node_rank") != "slurm:SLURM_NODEID" and v.nodeid is not None \
                and config.node_rank != v.nodeid and (step_nodes or 1) > 1:
            out.append(Refusal(
                f"--node-rank={config.node_rank} (from {config.source('node_rank')}) contradicts this node's "
                f"SLURM_NODEID={v.nodeid} ({v.nodename or 'this node'}). This is the per-node expansion "
                f"gotcha: `srun traceml run ... --node-rank=$SLURM_NODEID` expands the variable ONCE in the "
                f"batch shell, so every node claims rank 0 and the rendezvous never completes. Drop "
                f"--node-rank (TraceML reads SLURM_NODEID on each node), or put the command in a wrapper "
                f"script that srun runs on each node. To override Slurm anyway, pass --cluster=none.",
                frozenset(), "node_rank"))
        if getattr(config, "layout", "node") == "node" and facts.layout is not None:
            most = facts.layout.per_node
            if most > 1:
                out.append(Refusal(
                    f"--layout=node (from {config.source('layout')}) but this srun step runs {most} tasks on "
                    f"a node (SLURM_STEP_TASKS_PER_NODE={v.step_tasks_per_node}): each of them would start "
                    f"its own torchrun with a worker per GPU. Either drop --layout (each task is then one "
                    f"rank: one task per GPU) or start one launcher per node: "
                    f"`{launcher_srun_line(step_nodes)}`.", frozenset(), "layout"))
        if config.source("nnodes").startswith(("cli", "env:")) and step_nodes and config.nnodes != step_nodes:
            out.append(Refusal(
                f"--nnodes={config.nnodes} (from {config.source('nnodes')}) but this srun step spans "
                f"{step_nodes} nodes (SLURM_STEP_NUM_NODES). Drop --nnodes, or run the step on "
                f"{config.nnodes} nodes (`srun --nodes={config.nnodes} --ntasks-per-node=1 ...`). "
                f"To override Slurm anyway, pass --cluster=none.", frozenset(), "nnodes"))
        return out


def _job_hosts(facts: Facts) -> tuple[str, ...]:
    """The job's nodes as Slurm gave them (``SLURM_JOB_NODELIST``); () when unknown or malformed."""
    try:
        return facts.job_hosts
    except ConfigError:
        return ()
