"""RUN-FAILED (critical): the run failed; always the headline when it applies.

How it decides (report/failure.py, which writes its sentences): for every rank that did not end
cleanly, its cause, strongest evidence first (an uncaught exception with its traceback; torchrun's
record of the worker: its exit code or signal, an OOM kill where the node's memory cgroup counted
one; otherwise it only disappeared), and whether it is only a *consequence* of another rank's
failure (a collective backend reporting a lost peer, a timeout, the process group aborting,
SIGTERM from torchrun stopping the others). The first rank to fail is the earliest failure that is
not a consequence; its node, host, step and error are the headline, the others follow as
consequences. This module only names the kind for the registry; the rule lives in
report/failure.py.
"""

from __future__ import annotations

KIND = "run_failed"
THRESHOLDS: tuple[str, ...] = ()
#: where the rule and its sentences live
SOURCE = "report/failure.py"
