"""A record's hosts must be nodes of its job: checked against the allocation Slurm gave the job.

What a run says of its nodes comes from its own processes: each node's launcher names its host,
and a rank's hello names one where its node said none. A rank is the user's script, and the
script may say anything; a host name it invents ("node3" in a job on node1 and node2) would put a
node the job never used into the store and, slow twice, into ``#SBATCH --exclude``. So before a
record is stored (or judged with the user's history), every host it names must be a node of the
job's allocation as Slurm gave it (``SLURM_JOB_NODELIST``, which slurmd sets for the job and no
rank can change in node 0's environment), and the record's job id must be the job's
(``SLURM_JOB_ID``). A host outside the allocation is not recorded, nor its observations, and the
claim is reported in a note (who named it, and the allocation). Without a node list to check
against, nothing is recorded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from traceml_core.plugins import RunEvidence

from ..hostlists import compress_hosts, shown


def within_allocation(evidence: RunEvidence, job_id: Optional[str],
                      job_hosts: Sequence[str]) -> tuple[Optional[RunEvidence], list[str]]:
    """``evidence`` with only the hosts of the allocation ``job_hosts`` (and their observations),
    or None when none can be kept; the notes that report each refused claim."""
    what = f"this {evidence.source}'s node evidence"
    if not job_hosts:
        return None, [f"{what} is not recorded: the job's node list (SLURM_JOB_NODELIST) is not known, so the "
                      "hosts it names cannot be checked"]
    if job_id and evidence.job_id and str(evidence.job_id) != str(job_id):
        return None, [f"{what} is not recorded: it is of job {shown(evidence.job_id, 40)}, not of this job "
                      f"({job_id})"]
    allowed = set(job_hosts)
    named = set(evidence.hosts) | {o.host for o in evidence.observations}
    outside = sorted(named - allowed, key=str)
    if not outside:
        return evidence, []
    by = dict(evidence.origins)
    claims = ", ".join(f"{shown(h, 40)}" + (f" (named by {by[h]})" if h in by else "") for h in outside[:4])
    more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
    note = (f"{claims}{more} {'is' if len(outside) == 1 else 'are'} not a node of job {job_id or '?'} "
            f"({compress_hosts(list(allowed))}), so {'its' if len(outside) == 1 else 'their'} evidence is not "
            "recorded: a host name a process of the run claims counts only when Slurm gave the job that node")
    kept = replace(evidence, hosts=tuple(h for h in evidence.hosts if h in allowed),
                   observations=tuple(o for o in evidence.observations if o.host in allowed))
    return (kept if kept.hosts or kept.observations else None), [note]
