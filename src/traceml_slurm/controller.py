"""Job, node and partition facts from the Slurm controller, behind one interface with two backends.

:class:`ScontrolBackend` runs ``scontrol`` (``show job -d -o ID``, ``show node -o LIST``,
``show partition -o NAME``, ``show config``, ``write batch_script ID -``), each bounded by a
timeout. ``squeue --json`` would also work on 22.05 but ignores ``-j`` and returns every job of the
cluster, so it is not used. :class:`PyslurmBackend` reads the same facts through ``pyslurm``'s
object API (an optional extra: each pyslurm release matches one Slurm version, so it is used only
when it imports and answers); what it returns was recorded from the real pyslurm 25.11.2 against a
real Slurm 25.11 (``tests/fixtures/pyslurm/``), and both backends give the same facts for the same
job. Neither is ever needed by ``traceml run``: the doctor's ctl.* and time.* checks degrade to
skip/warn when the controller is not reachable, and the launcher asks it only to name the sender
of a SIGTERM (:mod:`traceml_slurm.interrupts`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from .hostlists import expand_nodelist

#: Slurm writes "no time limit" as 365 days in places: a job the backfill scheduler started without
#: ``--time`` in a ``MaxTime=INFINITE`` partition has ``TimeLimit=365-00:00:00`` (525,600 minutes, in
#: scontrol and pyslurm alike; the main scheduler keeps INFINITE), and ``SLURM_JOB_END_TIME`` of a job
#: without a limit is a year after its start. Nobody asks for a real limit this long.
NO_LIMIT_S = 300 * 86400.0


#: what a job's state reads while it holds its allocation and has not begun to end. Slurm shows a
#: running job's transient flag in place of RUNNING: SIGNALING while a SIGCONT or SIGSTOP is on its
#: way to the nodes (the early warning of ``#SBATCH --signal`` sends SIGCONT first, so a launcher
#: that asks on the warning may see it: seen in CI), CONFIGURING while its nodes boot, RESIZING.
LIVE_STATES = ("RUNNING", "SIGNALING", "CONFIGURING", "RESIZING")


def limit_or_none(seconds: Optional[float]) -> Optional[float]:
    """A time limit in seconds, or None for "no time limit" (None, or Slurm's 365 days)."""
    return None if seconds is None or seconds >= NO_LIMIT_S else seconds


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
    #: seconds; None means unlimited (Slurm's 365-day "no limit" included)
    time_limit_s: Optional[float]
    start_time: Optional[float]
    end_time: Optional[float]
    batch_host: Optional[str] = None
    #: allocated GRES per node in scontrol's words, e.g. {"node1": "gpu:a100:2(IDX:0-1)"}
    gres_per_node: dict[str, str] = field(default_factory=dict)
    #: what the job asked for per node (scontrol's TresPerNode, e.g. "gres/gpu:2"), when the
    #: controller says it (pyslurm 25.11 without slurmdbd does not)
    tres_per_node: Optional[str] = None
    #: how often the job was requeued (scontrol's Restarts; it counts up the moment a requeue
    #: begins, while the attempt being requeued is still being stopped); None: not said
    restarts: Optional[int] = None
    #: why the job is in its state (scontrol's Reason: "TimeLimit" for a job the limit ended, also
    #: while its state reads COMPLETING); None: not said
    reason: Optional[str] = None

    @property
    def live(self) -> bool:
        """The job holds its allocation and has not begun to end (:data:`LIVE_STATES`)."""
        return str(self.state).split(",")[0].strip().upper() in LIVE_STATES

    @property
    def scheduled_end(self) -> Optional[float]:
        """When the controller means to end the job, epoch s: its EndTime while the job is live
        (:data:`LIVE_STATES`). EndTime follows an ``scontrol update`` of EndTime to the second,
        which StartTime + TimeLimit does not (the limit is kept in whole minutes, rounded); once
        the job ends, scancel has rewritten EndTime to the cancel time. None: not live, no limit,
        or not said."""
        return self.end_time if self.live and limit_or_none(self.time_limit_s) is not None else None


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
    #: the controller's Slurm version (not the client library's)
    version: Optional[str]


class ControllerFacts(Protocol):
    name: str

    def job(self, job_id: str) -> JobFacts: ...

    def nodes(self, nodelist: str) -> list[NodeFacts]: ...

    def partition(self, name: str) -> PartitionFacts: ...

    def config(self) -> ControllerConfig: ...

    def batch_script(self, job_id: str) -> Optional[str]: ...


_GRES_COUNT = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gpu_count(gres: Optional[str]) -> int:
    """GPUs in a GRES text such as ``gpu:a100:2(IDX:0-1)`` or ``gpu:2,gpu:v100:1``."""
    if not gres:
        return 0
    return sum(int(m.group(1)) for m in _GRES_COUNT.finditer(gres))


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
            for host in expand_nodelist(m.group(1), "scontrol NodeList"):
                gres[host] = m.group(2)
        return JobFacts(
            job_id=r.get("JobId", str(job_id)), name=_none(r.get("JobName")), state=r.get("JobState", "?"),
            partition=_none(r.get("Partition")), nodes=r.get("NodeList", ""), num_nodes=_int_or_none(r.get("NumNodes")),
            time_limit_s=limit_or_none(parse_duration(r.get("TimeLimit"))), start_time=parse_timestamp(r.get("StartTime")),
            end_time=parse_timestamp(r.get("EndTime")), batch_host=_none(r.get("BatchHost")), gres_per_node=gres,
            tres_per_node=_none(r.get("TresPerNode")), restarts=_int_or_none(r.get("Restarts")),
            reason=_none(r.get("Reason")))

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


# -- pyslurm's values, in scontrol's words ---------------------------------------------------------------

def _pyslurm_minutes(v: Any) -> Optional[float]:
    """pyslurm's minutes (an int, or the string ``UNLIMITED``; None when unset) -> seconds."""
    return float(v) * 60.0 if isinstance(v, int) and not isinstance(v, bool) else None


def _pyslurm_count(v: Any) -> Optional[int]:
    """An int, or None for pyslurm's ``"UNLIMITED"`` (``Partition.max_nodes``)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _pyslurm_time(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def _pyslurm_gres(gres: Any) -> Optional[str]:
    """pyslurm's GRES maps in scontrol's words: allocated ``{"gpu:a100": {"count": 2, "indexes": "0-1"}}``
    -> ``gpu:a100:2(IDX:0-1)`` (``show job -d``); configured ``{"gpu:a100": 4}`` -> ``gpu:a100:4``."""
    if not isinstance(gres, dict):
        return None if gres is None else str(gres)
    parts = []
    for name, v in gres.items():
        if isinstance(v, dict):
            idx = v.get("indexes")
            parts.append(f"{name}:{v.get('count', 0)}" + (f"(IDX:{idx})" if idx not in (None, "") else ""))
        else:
            parts.append(f"{name}:{v}")
    return ",".join(parts)


class PyslurmBackend:
    """The same facts through pyslurm's object API (pyslurm >= 23: Job/Node/Partition.load).

    What the job asked for per node (scontrol's ``TresPerNode=gres/gpu:2``) is not offered: pyslurm
    25.11.2's ``Job.tres_per_node`` reads Slurm's ``gres/gpu:2`` as ``key=value`` pairs and returns
    None, and ``Job.gres_per_node``, which reads it right, is deprecated ("removed in the next major
    release"). The GPUs per node come from the allocation instead (``get_resource_layout_per_node``).
    """

    name = "pyslurm"

    def __init__(self, module: Any) -> None:
        self.m = module

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - pyslurm raises RPCError and friends
            raise ControllerError(f"pyslurm {what} failed: {type(exc).__name__}: {exc}") from None

    def job(self, job_id: str) -> JobFacts:
        j = self._call("Job.load", self.m.Job.load, int(job_id))
        gres: dict[str, str] = {}
        try:
            for host, res in (j.get_resource_layout_per_node() or {}).items():
                gres[host] = _pyslurm_gres((res or {}).get("gres") or {}) or ""
        except Exception:  # noqa: BLE001 - optional detail
            pass
        return JobFacts(job_id=str(j.id), name=j.name, state=str(j.state), partition=j.partition,
                        nodes=j.allocated_nodes or "", num_nodes=j.num_nodes,
                        time_limit_s=limit_or_none(_pyslurm_minutes(j.time_limit)),
                        start_time=_pyslurm_time(j.start_time), end_time=_pyslurm_time(j.end_time),
                        batch_host=j.batch_host, gres_per_node=gres, tres_per_node=None,
                        reason=_none(str(getattr(j, "state_reason", "") or "")))

    def nodes(self, nodelist: str) -> list[NodeFacts]:
        """Every node in one call (``Nodes.load``), as ``scontrol show node LIST`` does: right after a job
        starts, ``Node.load(name)`` can still answer with the node's allocation from before the job
        (no CPU allocated), which pyslurm then calls ALLOCATED where scontrol says MIXED."""
        loaded = self._call("Nodes.load", self.m.Nodes.load)
        out = []
        for host in expand_nodelist(nodelist, "node list"):
            n = loaded.get(host)
            if n is None:
                raise ControllerError(f"pyslurm Nodes.load has no node {host}")
            out.append(NodeFacts(n.name, str(n.state), n.reason, _pyslurm_gres(n.configured_gres)))
        return out

    def partition(self, name: str) -> PartitionFacts:
        p = self._call("Partition.load", self.m.Partition.load, name)
        return PartitionFacts(p.name, str(p.state), _pyslurm_minutes(p.max_time), _pyslurm_count(p.max_nodes))

    def config(self) -> ControllerConfig:
        c = self._call("slurmctld.Config.load", self.m.slurmctld.Config.load)
        kill_wait = c.kill_wait_time
        return ControllerConfig(float(kill_wait) if isinstance(kill_wait, int) else None, c.version)

    def batch_script(self, job_id: str) -> Optional[str]:
        try:
            return self.m.Job(int(job_id)).get_batch_script()
        except Exception:  # noqa: BLE001
            return None


BACKENDS = ("auto", "pyslurm", "scontrol")


def select_backend(timeout: float = 5.0, *, prefer: Optional[str] = None) -> ControllerFacts:
    """pyslurm when it imports (it refuses a Slurm it was not built for), else scontrol; ``prefer``
    ("pyslurm" or "scontrol") asks for one of them only."""
    if prefer != "scontrol":
        try:
            import pyslurm  # type: ignore[import-not-found]

            return PyslurmBackend(pyslurm)
        except Exception as exc:  # noqa: BLE001 - ImportError, or pyslurm's version-mismatch error
            if prefer == "pyslurm":
                raise ControllerError(f"pyslurm does not import here ({type(exc).__name__}: {exc}; each release "
                                      f"matches one Slurm version)", missing=True) from None
    return ScontrolBackend(timeout)
