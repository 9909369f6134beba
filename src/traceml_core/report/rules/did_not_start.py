"""DID-NOT-START (critical): no rank reached its first step.

How it decides (report/failure.py, which writes its sentences): a failed run in which no rank
completed a single step gets this one headline and nothing else, naming the first failure's
cause, Python's own error with file and line where there is one (from TraceML's exception hook,
or from torchrun's record of a worker that failed before TraceML started in it). This module only
names the kind for the registry; the rule lives in report/failure.py.
"""

from __future__ import annotations

KIND = "did_not_start"
THRESHOLDS: tuple[str, ...] = ()
SOURCE = "report/failure.py"
