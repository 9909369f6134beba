"""Job and node facts from the Slurm controller, behind one interface with two backends.

:class:`ScontrolBackend` runs ``scontrol`` (``show job -d -o ID``, ``show node -o LIST``,
``show partition -o NAME``, ``show config``, ``write batch_script ID -``), each bounded by a
timeout. ``squeue --json`` would also work on 22.05 but ignores ``-j`` and returns every job of the
cluster, so it is not used. :class:`PyslurmBackend` reads the same facts through ``pyslurm``
(an optional extra: each pyslurm release matches one Slurm version, so it is used only when it
imports and answers). Neither is ever needed by ``traceml run``; the ctl.* and time.* checks
degrade to skip/warn when the controller is not reachable.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext


class ControllerError(Exception):
    """The controller could not be asked. ``missing`` is True when no client exists at all."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass
class JobFacts:
    job_id: str
    name: Optional[str]
    state: str
    partition: Optional[str]
    nodes: str
    num_nodes: Optional[int]
    #: seconds; None means unlimited
    time_limit_s: Optional[float]
    start_time: Optional[float]
    end_time: Optional[float]
    batch_host: Optional[str] = None
    #: allocated GRES per node, e.g. {"node1": "gpu:a100:2(IDX:0-1)"}
    gres_per_node: dict[str, str] = field(default_factory=dict)
    tres_per_node: Optional[str] = None


@dataclass
class NodeFacts:
    name: str
    state: str
    reason: Optional[str] = None
    gres: Optional[str] = None


@dataclass
class PartitionFacts:
    name: str
    state: str
    max_time_s: Optional[float]
    max_nodes: Optional[int]


@dataclass
class ControllerConfig:
    kill_wait_s: Optional[float]
    version: Optional[str]


class ControllerFacts(Protocol):
    name: str

    def job(self, job_id: str) -> JobFacts: ...

    def nodes(self, nodelist: str) -> list[NodeFacts]: ...

    def partition(self, name: str) -> PartitionFacts: ...

    def config(self) -> ControllerConfig: ...

    def batch_script(self, job_id: str) -> Optional[str]: ...


# -- parsing scontrol's one-line records --------------------------------------------------------------

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")
_GRES_DETAIL = re.compile(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
UNLIMITED = {"UNLIMITED", "INFINITE", "Partition_Limit", "NONE"}


def parse_record(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value with spaces`` -> dict; values run until the next `` Key=``."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        key = m.group(1)
        if key not in out:  # the first occurrence wins (job -d repeats Nodes= per node group)
            out[key] = line[m.end():end].strip()
    return out


def parse_duration(text: Optional[str]) -> Optional[float]:
    """Slurm time ``[days-]hh:mm:ss`` / ``mm:ss`` / minutes -> seconds; None for unlimited/unknown."""
    if not text or text in UNLIMITED or text in ("N/A", "(null)", "Unknown"):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        secs = parts[0] * 60  # bare minutes
    elif len(parts) == 2:
        secs = parts[0] * 60 + parts[1]
    else:
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return float(days * 86400 + secs)


def parse_timestamp(text: Optional[str]) -> Optional[float]:
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _int_or_none(text: Optional[str]) -> Optional[int]:
    if not text or text in UNLIMITED:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _none(text: Optional[str]) -> Optional[str]:
    return None if text in (None, "", "(null)", "N/A", "none") else text


class ScontrolBackend:
    name = "scontrol"

    def __init__(self, timeout: float = 5.0, exe: Optional[str] = None) -> None:
        self.timeout = timeout
        found = exe or shutil.which("scontrol")
        if not found:
            raise ControllerError("scontrol is not installed here (a container image without Slurm clients?)", missing=True)
        self.exe = found
        #: after one timeout the controller counts as unreachable: later questions fail at once
        self.dead: Optional[ControllerError] = None

    def _run(self, *args: str) -> str:
        if self.dead is not None:
            raise self.dead
        try:
            p = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=self.timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.dead = ControllerError(f"`scontrol {' '.join(args)}` did not answer within {self.timeout:.0f} s "
                                        f"(slurmctld busy or unreachable)")
            raise self.dead from None
        except OSError as exc:
            raise ControllerError(f"cannot run scontrol: {exc}") from None
        if p.returncode != 0:
            msg = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()[-1]
            raise ControllerError(f"`scontrol {' '.join(args)}` failed: {msg}")
        return p.stdout

    def job(self, job_id: str) -> JobFacts:
        text = self._run("show", "job", "-d", "-o", str(job_id))
        line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), "")
        r = parse_record(line)
        if not r:
            raise ControllerError(f"scontrol shows no job {job_id}")
        gres: dict[str, str] = {}
        for m in _GRES_DETAIL.finditer(line):
            from ..hostlists import expand_nodelist

            for host in expand_nodelist(m.group(1), "scontrol NodeList"):
                gres[host] = m.group(2)
        return JobFacts(
            job_id=r.get("JobId", str(job_id)), name=_none(r.get("JobName")), state=r.get("JobState", "?"),
            partition=_none(r.get("Partition")), nodes=r.get("NodeList", ""), num_nodes=_int_or_none(r.get("NumNodes")),
            time_limit_s=parse_duration(r.get("TimeLimit")), start_time=parse_timestamp(r.get("StartTime")),
            end_time=parse_timestamp(r.get("EndTime")), batch_host=_none(r.get("BatchHost")), gres_per_node=gres,
            tres_per_node=_none(r.get("TresPerNode")))

    def nodes(self, nodelist: str) -> list[NodeFacts]:
        out = []
        for line in self._run("show", "node", "-o", nodelist).splitlines():
            if not line.startswith("NodeName="):
                continue
            r = parse_record(line)
            out.append(NodeFacts(r["NodeName"], r.get("State", "?"), _none(r.get("Reason")), _none(r.get("Gres"))))
        return out

    def partition(self, name: str) -> PartitionFacts:
        line = next((ln for ln in self._run("show", "partition", "-o", name).splitlines()
                     if ln.startswith("PartitionName=")), "")
        r = parse_record(line)
        if not r:
            raise ControllerError(f"scontrol shows no partition {name}")
        return PartitionFacts(r["PartitionName"], r.get("State", "?"), parse_duration(r.get("MaxTime")),
                              _int_or_none(r.get("MaxNodes")))

    def config(self) -> ControllerConfig:
        kill_wait = version = None
        for line in self._run("show", "config").splitlines():
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if key == "KillWait":
                kill_wait = float(value.split()[0]) if value.split() and value.split()[0].isdigit() else None
            elif key == "SLURM_VERSION":
                version = value
        return ControllerConfig(kill_wait, version)

    def batch_script(self, job_id: str) -> Optional[str]:
        try:
            return self._run("write", "batch_script", str(job_id), "-")
        except ControllerError:
            return None  # not a batch job (salloc), or not ours to read


class PyslurmBackend:
    """The same facts through pyslurm's object API (pyslurm >= 23: Job/Node/Partition.load)."""

    name = "pyslurm"

    def __init__(self, module: Any) -> None:
        self.m = module

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - pyslurm raises RPCError and friends
            raise ControllerError(f"pyslurm {what} failed: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _minutes(v: Any) -> Optional[float]:
        if v is None or isinstance(v, str):
            return None  # "UNLIMITED"
        return float(v) * 60.0

    def job(self, job_id: str) -> JobFacts:
        j = self._call("Job.load", self.m.Job.load, int(job_id))
        gres: dict[str, str] = {}
        try:
            layout = j.get_resource_layout_per_node() or {}
            for host, res in layout.items():
                g = res.get("gres") or {}
                gres[host] = ",".join(f"{k}:{v}" for k, v in g.items()) if isinstance(g, dict) else str(g)
        except Exception:  # noqa: BLE001 - optional detail
            pass
        tres = j.gres_per_node
        return JobFacts(job_id=str(j.id), name=j.name, state=str(j.state), partition=j.partition,
                        nodes=j.allocated_nodes or "", num_nodes=j.num_nodes, time_limit_s=self._minutes(j.time_limit),
                        start_time=j.start_time, end_time=j.end_time, batch_host=j.batch_host, gres_per_node=gres,
                        tres_per_node=",".join(f"{k}:{v}" for k, v in tres.items()) if isinstance(tres, dict) else tres)

    def nodes(self, nodelist: str) -> list[NodeFacts]:
        from ..hostlists import expand_nodelist

        out = []
        for host in expand_nodelist(nodelist, "node list"):
            n = self._call("Node.load", self.m.Node.load, host)
            g = n.configured_gres
            out.append(NodeFacts(n.name, str(n.state), n.reason,
                                 ",".join(f"{k}:{v}" for k, v in g.items()) if isinstance(g, dict) else g))
        return out

    def partition(self, name: str) -> PartitionFacts:
        p = self._call("Partition.load", self.m.Partition.load, name)
        return PartitionFacts(p.name, str(p.state), self._minutes(p.max_time), p.max_nodes)

    def config(self) -> ControllerConfig:
        c = self._call("slurmctld.Config.load", self.m.slurmctld.Config.load)
        return ControllerConfig(getattr(c, "kill_wait", None), getattr(self.m, "__version__", None))

    def batch_script(self, job_id: str) -> Optional[str]:
        try:
            return self.m.Job(int(job_id)).get_batch_script()
        except Exception:  # noqa: BLE001
            return None


def select_backend(timeout: float = 5.0, *, prefer: Optional[str] = None) -> ControllerFacts:
    """pyslurm when it imports (it refuses a Slurm it was not built for), else scontrol."""
    if prefer != "scontrol":
        try:
            import pyslurm  # type: ignore[import-not-found]

            return PyslurmBackend(pyslurm)
        except Exception:  # noqa: BLE001 - ImportError, or pyslurm's version-mismatch error
            if prefer == "pyslurm":
                raise ControllerError("pyslurm does not import here (each release matches one Slurm version)", missing=True)
    return ScontrolBackend(timeout)


# -- the checks ---------------------------------------------------------------------------------------

def _facts(ctx: NodeContext, what: str) -> Any:
    """Cached controller answer for this run: the job facts are read once for four checks."""
    cache = ctx.__dict__.setdefault("_ctl_cache", {})
    if what not in cache:
        try:
            backend = ctx.controller()
            if what == "job":
                cache[what] = backend.job(str(ctx.job_id))
            elif what == "config":
                cache[what] = backend.config()
            elif what == "script":
                cache[what] = backend.batch_script(str(ctx.job_id))
        except ControllerError as exc:
            cache[what] = exc
    return cache[what]


def unavailable(err: ControllerError) -> Outcome:
    if err.missing:
        return skipped(f"{err} (`traceml run` does not need the controller)")
    return warned(f"the controller did not answer: {err}", "Check `scontrol ping`; `traceml run` itself does not need "
                  "the controller, only these checks do.")


def _backend_name(ctx: NodeContext) -> str:
    try:
        return ctx.controller().name
    except ControllerError:
        return "?"


def check_job(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    limit = "no time limit" if j.time_limit_s is None else f"time limit {j.time_limit_s / 60:.0f} min"
    data = {"backend": _backend_name(ctx), "state": j.state, "partition": j.partition, "nodes": j.nodes,
            "time_limit_s": j.time_limit_s, "end_time": j.end_time, "batch_host": j.batch_host}
    line = f"job {j.job_id} {j.state} in partition {j.partition}, {j.num_nodes} nodes {j.nodes}, {limit} (via {data['backend']})"
    if j.state not in ("RUNNING", "CONFIGURING"):
        return warned(line, "The job is not running normally; check `scontrol show job`.", **data)
    return passed(line, **data)


BAD_NODE_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "NO_RESPOND", "POWERED_DOWN", "POWER_DOWN", "*")
DRAIN_STATES = ("DRAIN", "REBOOT", "MAINT")


def check_nodes(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    try:
        nodes = ctx.controller().nodes(j.nodes)
    except ControllerError as exc:
        return unavailable(exc)
    data = {"nodes": {n.name: {"state": n.state, "reason": n.reason} for n in nodes}}
    line = ", ".join(f"{n.name} {n.state}" for n in nodes)
    bad = [n for n in nodes if any(s in n.state.upper() for s in BAD_NODE_STATES)]
    if bad:
        return failed(f"{line}: " + "; ".join(f"{n.name} is {n.state}" + (f" ({n.reason})" if n.reason else "") for n in bad),
                      f"Resubmit excluding them (--exclude={','.join(n.name for n in bad)}) and tell the admins.", **data)
    draining = [n for n in nodes if any(s in n.state.upper() for s in DRAIN_STATES)]
    if draining:
        return warned(f"{line}: " + "; ".join(f"{n.name} is {n.state}" + (f" ({n.reason})" if n.reason else "") for n in draining),
                      "An admin marked them for maintenance: this job runs, but a requeue will not land there.", **data)
    return passed(line, **data)


_GRES_COUNT = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gpu_count(gres: Optional[str]) -> int:
    if not gres:
        return 0
    return sum(int(m.group(1)) for m in _GRES_COUNT.finditer(gres))


def check_gres(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    if not j.gres_per_node:
        return passed(f"no GRES allocated (job TresPerNode={j.tres_per_node or 'none'})", gres={})
    counts = {host: gpu_count(g) for host, g in j.gres_per_node.items()}
    line = ", ".join(f"{h}: {g}" for h, g in j.gres_per_node.items())
    data = {"gres": j.gres_per_node, "gpus": counts}
    if len(set(counts.values())) > 1:
        return failed(f"GPUs differ between nodes ({line}): torchrun needs the same number of workers on every node",
                      "Ask for GPUs per node (`--gpus-per-node=N` or `--gres=gpu:N`), not in total (`--gpus=N`).", **data)
    return passed(line, **data)


def check_partition(ctx: NodeContext) -> Outcome:
    if not ctx.job_id:
        return skipped("not inside a Slurm allocation")
    j = _facts(ctx, "job")
    if isinstance(j, ControllerError):
        return unavailable(j)
    if not j.partition:
        return skipped("the job names no partition")
    try:
        p = ctx.controller().partition(j.partition.split(",")[0])
    except ControllerError as exc:
        return unavailable(exc)
    mt = "UNLIMITED" if p.max_time_s is None else f"{p.max_time_s / 60:.0f} min"
    mn = "UNLIMITED" if p.max_nodes is None else str(p.max_nodes)
    line = f"{p.name}: {p.state}, MaxTime {mt}, MaxNodes {mn}"
    data = {"name": p.name, "state": p.state, "max_time_s": p.max_time_s, "max_nodes": p.max_nodes}
    if p.state != "UP":
        return warned(line, "This job runs, but a requeue or the next submission will wait: pick a partition that is UP.", **data)
    return passed(line, **data)


CHECKS = (
    CheckSpec("ctl.job", "Job state", check_job, scope="job"),
    CheckSpec("ctl.nodes", "Node states", check_nodes, scope="job"),
    CheckSpec("ctl.gres", "GRES per node", check_gres, scope="job"),
    CheckSpec("ctl.partition", "Partition limits", check_partition, scope="job"),
)
