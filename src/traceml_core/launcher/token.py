"""The run's auth token: how every process of a run proves it belongs to the run.

Sources, in order:

1. ``TRACEML_TOKEN`` in the environment. The sbatch templates export a fresh random value before
   ``srun``; Slurm copies the batch shell's environment to every task on every node, and a
   process's environment is readable only by its owner and root. This is the recommended way for
   multi-node runs and needs no shared filesystem.
2. One node: a fresh random token made by the launcher, handed to its workers (environment).
3. Several nodes (or several tasks of one node, each a rank: the task layout, whose launchers
   cannot hand each other a random value) and no ``TRACEML_TOKEN``: a token derived from the job's identity (job id, user,
   node list, run name), the same on every node. Anyone who can read those values (other users of
   the cluster can, with ``squeue``) could compute it, so the launcher warns and names the fix.
   It still keeps out processes of other jobs and stray connections, and never weakens a run
   that exports a token.

The token itself never crosses the network: hellos carry an HMAC over a fresh nonce.
"""

from __future__ import annotations

import getpass
import hashlib
import secrets
from dataclasses import dataclass
from typing import Mapping

from ..config import LaunchConfig

ENV_VAR = "TRACEML_TOKEN"
MIN_LENGTH = 16


@dataclass(frozen=True)
class Token:
    value: str
    source: str
    warning: str | None = None


def resolve_token(config: LaunchConfig, environ: Mapping[str, str]) -> Token:
    given = environ.get(ENV_VAR, "").strip()
    if given:
        if len(given) < MIN_LENGTH:
            return Token(given, f"env:{ENV_VAR}",
                         f"{ENV_VAR} is only {len(given)} characters; use at least {MIN_LENGTH} random characters "
                         f"(for example `export {ENV_VAR}=$(python3 -c 'import secrets;print(secrets.token_hex(16))')`).")
        return Token(given, f"env:{ENV_VAR}")
    if not config.is_multinode and config.layout != "task":
        return Token(secrets.token_hex(16), "generated")
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "?"
    material = "\0".join(["traceml-v1", str(config.job_id), user, config.master_addr, config.run_name,
                          str(config.nnodes), str(config.aggregator_port)])
    derived = hashlib.sha256(material.encode()).hexdigest()[:32]
    what = f"{config.nnodes}-node run" if config.is_multinode else f"{config.nproc_per_node}-task run"
    return Token(derived, "derived:job", (
        f"{ENV_VAR} is not set, so this {what} uses a token derived from the job's "
        f"identity, which other users of the cluster could compute. Export a random one in the sbatch "
        f"script before srun: `export {ENV_VAR}=$(python3 -c 'import secrets;print(secrets.token_hex(16))')`."))
