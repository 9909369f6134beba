"""HANG (critical, or a warning for a stall that ended): no rank completed a step for long.

How it decides (report/hang.py and launcher/hangwatch.py, which write its sentences): when no
step reached node 0 for ``--hang-report-after`` (auto: the larger of 60 s and 20 median steps),
every rank's stack is collected; the rank that never arrived at the collective the others wait
in is named, with where it is. A run that ended still hung gets it as the headline; a stall that
resolved is a warning after the primary verdict. This module only names the kind for the
registry; the rule lives in report/hang.py.
"""

from __future__ import annotations

KIND = "hang"
THRESHOLDS = ("HANG_REPORT_FLOOR_S", "HANG_REPORT_STEPS")
SOURCE = "report/hang.py"
