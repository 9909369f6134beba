"""What Slurm gave each task in CPUs, for the input-bound verdict's CPU cause (``cpu_request``).

The launcher asks once per node (``ClusterEnvironment.cpu_request``) and each rank sends the
answer with its own CPU facts (core: sdk/threads.py, report/cpubinding.py). Core compares it with
what the rank measured (the CPUs its affinity mask allows, what its DataLoader workers used) and,
when the CPU request is the limit, prints these lines for the next job script:

* ``fix``: ``#SBATCH --cpus-per-task={n}`` (core puts in N) and, where srun does not pass the job's
  request on to its tasks, ``export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK``;
* ``pass_on``: that export alone (the job asked for enough CPUs, the tasks did not get them).

srun read ``SLURM_CPUS_PER_TASK`` (and so inherited ``--cpus-per-task`` from sbatch/salloc)
before 22.05 and again from 23.11; from 22.05 to 23.10 only ``SRUN_CPUS_PER_TASK`` or srun's own
``--cpus-per-task`` does. The version is the client's (``srun --version``, once, bounded).
"""

from __future__ import annotations

import re
import subprocess
from typing import Any, Optional

from .facts import Facts

#: Slurm releases whose srun does not take --cpus-per-task from the job (SLURM_CPUS_PER_TASK)
NOT_INHERITED = ((22, 5), (23, 11))
PASS_ON = "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"
VERSION_TIMEOUT_S = 2.0


def slurm_version(environ: Any) -> Optional[str]:
    """``22.05.8`` from ``srun --version`` (``slurm 22.05.8``), or None."""
    try:
        out = subprocess.run(["srun", "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                             env=dict(environ)).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out or "")
    return m.group(0) if m else None


def passes_on(version: Optional[str]) -> Optional[bool]:
    """Whether srun of ``version`` gives its tasks the job's --cpus-per-task (None: unknown)."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if not m:
        return None
    v = (int(m.group(1)), int(m.group(2)))
    return not NOT_INHERITED[0] <= v < NOT_INHERITED[1]


def cpu_request(environ: Any, version: Optional[str] = None) -> Optional[dict[str, Any]]:
    facts = Facts.of(environ)
    if not facts.in_job:
        return None
    grant = facts.cpus
    version = version if version is not None else slurm_version(facts.environ)
    inherits = passes_on(version)
    export = [] if inherits else [PASS_ON]
    if grant.cpus_per_task is not None:
        n, source = grant.cpus_per_task, "--cpus-per-task, SLURM_CPUS_PER_TASK"
    else:
        n, source = 1, "Slurm's default: no --cpus-per-task"
    return {"scheduler": "Slurm", "version": version, "cpus_per_task": n, "cpus_per_task_source": source,
            "srun_cpus_per_task": grant.srun_cpus_per_task, "cpus_on_node": grant.cpus_on_node,
            "fix": ["#SBATCH --cpus-per-task={n}", *export],
            "pass_on": [PASS_ON] if grant.srun_cpus_per_task is None and inherits is not True else []}
