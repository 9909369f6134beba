"""Check a job against the Slurm cluster it will run on, when one answers.

One ``sinfo`` call, bounded by a timeout (an unreachable controller makes Slurm clients retry for
many seconds; we never wait on it): partitions, their time limits, node counts and GPU GRES. Checked:
the partition exists, the time limit fits the partition's MaxTime, the node count fits, the GPU type
is known and the GPUs per node exist on some node. Without Slurm, the checks are skipped with a note.
``sbatch --test-only`` is offered on top: Slurm's own verdict, with a start estimate.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Optional

from .model import JobSpec
from .slurmtime import parse_time

SINFO_FORMAT = "%P|%l|%D|%G|%a"
SINFO_TIMEOUT_S = 5.0
TEST_ONLY_TIMEOUT_S = 30.0
_GPU = re.compile(r"(?:^|,)gpu:(?:([^:(),]+):)?(\d+)")

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass
class Partition:
    name: str
    default: bool = False
    max_minutes: Optional[int] = None  # None: no limit
    max_time_text: str = "infinite"
    nodes: int = 0
    gpu_types: set[str] = field(default_factory=set)
    max_gpus: int = 0
    max_gpus_by_type: dict[str, int] = field(default_factory=dict)
    avail: str = "up"


@dataclass
class CheckResult:
    ran: bool
    note: str = ""
    partition: Optional[str] = None
    problems: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"checked": self.ran, "note": self.note, "partition": self.partition,
                "problems": self.problems, "passed": self.passed}


def parse_sinfo(text: str) -> dict[str, Partition]:
    """Parse ``sinfo -h -o '%P|%l|%D|%G|%a'``; a partition may span several lines (node groups)."""
    parts: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or not fields[0]:
            continue
        raw_name, limit, count, gres, avail = fields
        name = raw_name.rstrip("*")
        p = parts.setdefault(name, Partition(name))
        p.default = p.default or raw_name.endswith("*")
        p.avail = avail
        try:
            t = parse_time(limit)
            p.max_minutes, p.max_time_text = t.minutes, limit
        except ValueError:
            pass
        p.nodes += int(count) if count.isdigit() else 0
        for gpu_type, n in _GPU.findall(gres):
            p.max_gpus = max(p.max_gpus, int(n))
            if gpu_type:
                p.gpu_types.add(gpu_type)
                p.max_gpus_by_type[gpu_type] = max(p.max_gpus_by_type.get(gpu_type, 0), int(n))
    return parts


def probe(runner: Runner = subprocess.run, timeout: float = SINFO_TIMEOUT_S) -> tuple[Optional[dict[str, Partition]], str]:
    """Ask the controller for its partitions; ``(None, why)`` when there is no Slurm to ask."""
    if shutil.which("sinfo") is None:
        return None, "no Slurm here (sinfo not found): skipped the checks against the cluster."
    try:
        proc = runner(["sinfo", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"Slurm's controller did not answer within {timeout:.0f} s: skipped the checks against the cluster."
    except OSError as exc:
        return None, f"sinfo could not run ({exc}): skipped the checks against the cluster."
    if proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()
        why = err[-1] if err else f"exit status {proc.returncode}"
        return None, f"Slurm's controller did not answer ({why}): skipped the checks against the cluster."
    parts = parse_sinfo(proc.stdout)
    if not parts:
        return None, "sinfo listed no partitions: skipped the checks against the cluster."
    return parts, ""


def check_job(spec: JobSpec, parts: dict[str, Partition]) -> CheckResult:
    """Problems that would keep the job PENDING forever or make sbatch refuse it."""
    result = CheckResult(ran=True)
    known = ", ".join(sorted(parts))
    if spec.partition:
        names = spec.partition.split(",")
        missing = [n for n in names if n not in parts]
        if missing:
            result.problems.append(f"partition {', '.join(missing)} does not exist on this cluster; valid partitions: "
                                   f"{known} (--partition).")
            return result
    else:
        defaults = [p.name for p in parts.values() if p.default]
        if not defaults:
            result.note = "no default partition on this cluster: checked nothing partition-specific (give --partition)."
            return result
        names = defaults[:1]
    result.partition = ",".join(names)
    # With several partitions Slurm uses the first one the job fits: refuse only if none fits.
    per_partition = {n: _fit(spec, parts[n], parts) for n in names}
    fitting = [n for n, why in per_partition.items() if not why]
    if fitting:
        p = parts[fitting[0]]
        result.passed.append(f"partition {p.name} exists" + (" (the default)" if not spec.partition else ""))
        if spec.time is not None:
            result.passed.append(f"--time={spec.time} fits its MaxTime ({p.max_time_text})")
        result.passed.append(f"{spec.nodes} node(s) of its {p.nodes}")
        if spec.gpus_per_node:
            what = f"{spec.gpu_type}:{spec.gpus_per_node}" if spec.gpu_type else str(spec.gpus_per_node)
            result.passed.append(f"GPUs per node {what} exist on its nodes")
        if p.avail != "up":
            result.passed.append(f"note: partition {p.name} is {p.avail}; the job waits until it is up")
        return result
    for why in per_partition.values():
        result.problems.extend(why)
    return result


def _fit(spec: JobSpec, p: Partition, parts: dict[str, Partition]) -> list[str]:
    why: list[str] = []
    limit = spec.time_limit
    if limit is not None and p.max_minutes is not None:
        if limit.unlimited or (limit.minutes or 0) > p.max_minutes:
            why.append(f"--time={spec.time} ({limit.describe()}) exceeds partition {p.name}'s MaxTime "
                       f"{p.max_time_text}: the job would stay PENDING forever. Use at most {p.max_time_text}, or "
                       f"another partition ({_limits(parts)}).")
    if spec.nodes > p.nodes:
        why.append(f"--nodes={spec.nodes} but partition {p.name} has {p.nodes} node(s). Use at most {p.nodes}.")
    if spec.gpu_type:
        all_types = sorted({t for q in parts.values() for t in q.gpu_types})
        if spec.gpu_type not in p.gpu_types:
            here = ", ".join(sorted(p.gpu_types)) or "none (untyped GPUs only: drop --gpu-type)"
            why.append(f"--gpu-type={spec.gpu_type} is not a GPU type of partition {p.name}; valid there: {here}"
                       + (f" (on this cluster: {', '.join(all_types)})" if all_types else "") + ".")
        elif spec.gpus_per_node > p.max_gpus_by_type.get(spec.gpu_type, 0):
            why.append(f"--gpus-per-node={spec.gpus_per_node} but the nodes of partition {p.name} have at most "
                       f"{p.max_gpus_by_type[spec.gpu_type]} {spec.gpu_type} GPU(s). Use at most that.")
    elif spec.gpus_per_node > p.max_gpus:
        have = f"at most {p.max_gpus}" if p.max_gpus else "no"
        why.append(f"--gpus-per-node={spec.gpus_per_node} but the nodes of partition {p.name} have {have} GPU(s).")
    return why


def _limits(parts: dict[str, Partition]) -> str:
    return ", ".join(f"{p.name}: {p.max_time_text}" for p in sorted(parts.values(), key=lambda p: p.name))


@dataclass
class SbatchTestOnly:
    ran: bool
    returncode: int = 0
    output: str = ""
    note: str = ""

    def to_json(self) -> dict:
        return {"ran": self.ran, "returncode": self.returncode, "output": self.output, "note": self.note}


def sbatch_test_only(path: str, runner: Runner = subprocess.run, timeout: float = TEST_ONLY_TIMEOUT_S) -> SbatchTestOnly:
    """``sbatch --test-only PATH``: Slurm validates the job and estimates its start, without submitting."""
    if shutil.which("sbatch") is None:
        return SbatchTestOnly(False, note="no Slurm here (sbatch not found): skipped --test-only.")
    try:
        proc = runner(["sbatch", "--test-only", path], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return SbatchTestOnly(False, note=f"sbatch --test-only got no answer within {timeout:.0f} s: skipped.")
    out = "\n".join(x for x in ((proc.stdout or "").strip(), (proc.stderr or "").strip()) if x)
    return SbatchTestOnly(True, proc.returncode, out)
