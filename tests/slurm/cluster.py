"""Helpers for tests that use the real local Slurm cluster of ``scripts/dev-cluster``.

The test process itself runs inside the cluster's login/controller network namespace (through the
``sl`` wrapper: ``scripts/test`` or ``scripts/dev-cluster exec python -m pytest``), so ``sbatch``,
``srun``, ``squeue`` and ``scontrol`` are called directly. The filesystem is shared, so scripts,
venvs and job output files are the same paths on every node.

Deliberately small and dependency-free (standard library only): ``capture.py`` of the environment
fixtures imports it as well.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence, Union

#: States after which a job no longer changes (``scontrol show job`` keeps them for MinJobAge=300 s).
FINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
})


class ClusterError(RuntimeError):
    """A Slurm command failed or a job did not finish in time; the message carries the details."""


class CpuLimitUnavailable(ClusterError):
    """This machine cannot limit a node's CPU (no writable cgroup v1 ``cpu`` hierarchy)."""


#: the cgroup v1 ``cpu`` hierarchy (a hybrid layout keeps the controller there)
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def cpu_cgroup_of(pid: int) -> str:
    """The cgroup v1 ``cpu`` path of a process (``/`` at the root)."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise ClusterError(f"pid {pid} is in no cgroup v1 cpu hierarchy: {text}")


def _login_namespace_mismatch(prefix: str) -> Optional[str]:
    """Why this process is not in the login namespace of cluster ``prefix`` (None when it is)."""
    netns = Path("/run/netns") / f"{prefix}c"
    try:
        ours = os.stat("/proc/self/ns/net")
        theirs = os.stat(netns)
    except OSError as exc:
        return f"cannot compare network namespaces ({exc}); is cluster '{prefix}' up?"
    if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
        return f"this process is not in the network namespace {netns}"
    return None


@dataclass
class Cluster:
    """One running dev cluster, seen from its login namespace."""

    prefix: str
    net: str
    dir: Path
    nodes: list[str] = field(default_factory=list)

    # ---- discovery -------------------------------------------------------------------------------

    @classmethod
    def detect(cls, environ: Mapping[str, str] = os.environ) -> tuple[Optional["Cluster"], str]:
        """The cluster this process runs inside, or None and the reason (used as the skip reason)."""
        how = "run the tests with scripts/test, or: scripts/dev-cluster up && scripts/dev-cluster exec python -m pytest"
        if "TRACEML_CLUSTER_DIR" not in environ or "SLURM_CONF" not in environ:
            return None, f"not inside the dev Slurm cluster's login namespace ({how})"
        prefix = environ.get("TRACEML_CLUSTER_PREFIX", "tml")
        why = _login_namespace_mismatch(prefix)
        if why:
            return None, f"{why} ({how})"
        n = int(environ.get("TRACEML_CLUSTER_NODES", "3"))
        return cls(prefix=prefix, net=environ.get("TRACEML_CLUSTER_NET", "10.77.0"),
                   dir=Path(environ["TRACEML_CLUSTER_DIR"]),
                   nodes=[f"node{i}" for i in range(1, n + 1)]), ""

    @property
    def jobs_dir(self) -> Path:
        """Shared directory for generated job scripts and default output files."""
        path = self.dir / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def node_ip(self, node: str) -> str:
        return f"{self.net}.{10 + self._index(node)}"

    def node_netns(self, node: str) -> str:
        return f"{self.prefix}{self._index(node)}"

    def _index(self, node: str) -> int:
        if node not in self.nodes:
            raise ValueError(f"{node!r} is not a node of this cluster ({', '.join(self.nodes)})")
        return int(node[len("node"):])

    # ---- running commands ------------------------------------------------------------------------

    def run(self, *cmd: str, timeout: float = 60, check: bool = True,
            env: Optional[Mapping[str, str]] = None, cwd: Union[str, Path, None] = None,
            input: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a command here (the login namespace) and capture its text output."""
        try:
            proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                                  env=None if env is None else dict(env), cwd=cwd, input=input)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{' '.join(cmd)!r} did not finish within {timeout} s "
                               f"(output so far: {exc.stdout!r} {exc.stderr!r})") from None
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)!r} exited with {proc.returncode}: "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def srun(self, *args: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """``srun ARGS...`` (a new allocation, or a step when called inside one)."""
        return self.run("srun", *args, timeout=timeout, check=check, **kw)

    def on_node(self, node: str, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run CMD in a compute node's namespaces (its hostname and IP), outside any Slurm job.

        For what a test does *to* a node: a firewall rule in its network namespace, a look at its
        processes. The command runs as root, like the node's slurmd.
        """
        return self.run(str(self.dir / "bin" / "in-ns"), self.node_netns(node), node, *cmd,
                        timeout=timeout, check=check)

    def slurmd_pid(self, node: str) -> int:
        """The pid of a node's slurmd (its pid file), checked to be in the node's network
        namespace: a stale pid file must not make a test act on someone else's process."""
        pid = int((self.dir / node / "slurmd.pid").read_text().strip())
        netns = Path("/run/netns") / self.node_netns(node)
        a, b = os.stat(f"/proc/{pid}/ns/net"), os.stat(netns)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            raise ClusterError(f"pid {pid} of {node}'s slurmd.pid is not in {netns}")
        return pid

    @contextmanager
    def slurmd_stopped(self, node: str) -> Iterator[int]:
        """A node's slurmd stopped (SIGSTOP) for the block, continued after it: the controller's
        messages to the node wait unanswered (its MessageTimeout), as with a node under heavy
        load. Keep the block well under SlurmdTimeout, or the controller sets the node DOWN."""
        pid = self.slurmd_pid(node)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid
        finally:
            os.kill(pid, signal.SIGCONT)

    @contextmanager
    def cpu_limited(self, node: str, quota_us: int, period_us: int = 100_000,
                    shares: int = 10 * 1024) -> Iterator[Path]:
        """A node's slurmd (its pid only: the job steps it starts inherit the cgroup, since
        proctrack/cgroup moves them only in the freezer hierarchy) in a cgroup v1 ``cpu`` group of
        our own with a CPU quota of ``quota_us`` per ``period_us`` (write ``cpu.cfs_quota_us`` of
        the yielded directory to change it). ``shares``: the group's weight (1024 is one process):
        a group's tasks together weigh as one task of the root's, which alone would hold them back
        on a machine busy with other processes; raised, only the quota does. Afterwards the slurmd
        goes back where it was and the group is removed (after the steps it holds end: at most
        30 s, else its quota is lifted and ClusterError says which pids stayed)."""
        if not (CPU_CGROUP_ROOT / "cpu.cfs_quota_us").is_file() or not os.access(CPU_CGROUP_ROOT, os.W_OK):
            raise CpuLimitUnavailable(f"no writable cgroup v1 cpu hierarchy at {CPU_CGROUP_ROOT} (cgroup v2 only, "
                                      "or not root): a node's CPU limit cannot be made here")
        pid = self.slurmd_pid(node)
        home = cpu_cgroup_of(pid)
        cg = CPU_CGROUP_ROOT / f"traceml_{self.prefix}_{node}_{os.getpid()}"
        try:
            cg.mkdir()
        except OSError as exc:
            raise CpuLimitUnavailable(f"cannot make a cgroup under {CPU_CGROUP_ROOT} ({exc}): a node's CPU "
                                      "limit cannot be made here") from None
        try:
            (cg / "cpu.cfs_period_us").write_text(str(period_us))
            (cg / "cpu.cfs_quota_us").write_text(str(quota_us))
            (cg / "cpu.shares").write_text(str(shares))
            (cg / "cgroup.procs").write_text(str(pid))
            if cpu_cgroup_of(pid) != "/" + cg.name:
                raise ClusterError(f"{node}'s slurmd (pid {pid}) did not move into {cg}")
            yield cg
        finally:
            if Path(f"/proc/{pid}").exists():
                (CPU_CGROUP_ROOT / home.lstrip("/") / "cgroup.procs").write_text(str(pid))
            deadline = time.monotonic() + 30
            while (cg / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
                time.sleep(0.2)
            left = (cg / "cgroup.procs").read_text().split()
            if left:
                (cg / "cpu.cfs_quota_us").write_text("-1")   # not ours to move: at least no longer limited
                raise ClusterError(f"processes {left} of {node}'s jobs still in {cg} after 30 s (its quota lifted)")
            cg.rmdir()

    def node_pids(self, node: str) -> list[int]:
        """Pids of every process in a node's network namespace (slurmd, job steps, leftovers)."""
        out = self.run("ip", "netns", "pids", self.node_netns(node)).stdout
        return [int(p) for p in out.split()]

    # ---- batch jobs ------------------------------------------------------------------------------

    def submit(self, script: Union[str, Path], *sbatch_args: str,
               env: Optional[Mapping[str, str]] = None, cwd: Union[str, Path, None] = None) -> str:
        """Submit a batch job and return its id.

        ``script`` is a path to a job script, or the script text itself (anything with a newline or
        starting with ``#!``), which is written to a file under :attr:`jobs_dir`. Unless the
        arguments name an output file, output goes to ``jobs_dir/<jobid>.out``
        (read it with :meth:`output`).
        """
        text = str(script)
        if "\n" in text or text.startswith("#!"):
            if not text.startswith("#!"):
                text = "#!/bin/bash\n" + text
            fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(name, 0o755)
            path = name
        else:
            path = text
        args = list(sbatch_args)
        if not any(a in ("-o", "--output") or a.startswith("--output=") for a in args):
            # first, so it applies to the whole job also when ':' separates het components
            args.insert(0, f"--output={self.jobs_dir}/%j.out")
        out = self.run("sbatch", "--parsable", *args, path, env=env, cwd=cwd).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise ClusterError(f"sbatch printed {out!r}, not a job id")
        return job_id

    def job_info(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job -o ID`` as one dict per record (array tasks and het components)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return [parse_scontrol_record(line) for line in out.splitlines() if line.strip()]

    def state(self, job_id: str) -> str:
        """Current JobState of a job (of its first record)."""
        return self.job_info(job_id)[0]["JobState"]

    def wait(self, job_id: str, timeout: float = 60, poll: float = 0.2) -> str:
        """Wait until the job has left the queue and return its final state (e.g. ``COMPLETED``).

        Polls ``squeue`` (``sbatch --wait`` backs off to tens of seconds). On timeout the job is
        cancelled, so a hung test does not leave the cluster busy, and ClusterError is raised.
        """
        deadline = time.monotonic() + timeout
        while True:
            queued = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False)
            if queued.returncode != 0 or not queued.stdout.strip():
                break
            if time.monotonic() > deadline:
                self.run("scancel", str(job_id), check=False)
                raise ClusterError(f"job {job_id} still {queued.stdout.split()} after {timeout} s; cancelled it")
            time.sleep(poll)
        states = [rec.get("JobState", "?") for rec in self.job_info(job_id)]
        # A record can lag a moment behind squeue (e.g. COMPLETING); settle briefly.
        for _ in range(25):
            if all(s in FINAL_STATES for s in states):
                break
            time.sleep(poll)
            states = [rec.get("JobState", "?") for rec in self.job_info(job_id)]
        bad = [s for s in states if s != "COMPLETED"]
        return bad[0] if bad else states[0]

    def output(self, job_id: str) -> str:
        """Text of the job's output file (its StdOut path, from scontrol)."""
        return Path(self.job_info(job_id)[0]["StdOut"]).read_text()

    def run_job(self, script: Union[str, Path], *sbatch_args: str, timeout: float = 60,
                **kw) -> tuple[str, str, str]:
        """Submit, wait, and return (job id, final state, output text)."""
        job_id = self.submit(script, *sbatch_args, **kw)
        state = self.wait(job_id, timeout=timeout)
        return job_id, state, self.output(job_id)


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line of ``Key=value`` pairs (values may contain spaces)."""
    marks = list(_FIELD.finditer(line))
    record: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        record[m.group(1)] = line[m.end():end].strip()
    return record


def quote(args: Sequence[str]) -> str:
    """A shell-readable command line, for messages and fixture metadata."""
    return " ".join(shlex.quote(a) for a in args)
