"""A skip CI did not expect fails the run (issue 35: ~20 environment-dependent skips could pass
silently). With ``TRACEML_STRICT_SKIPS=1`` (``.ci/run`` sets it) every skipped test must match an
entry of :data:`expected_skips.EXPECTED` (its test id pattern and a piece of its reason, with why
that skip is right in CI); any other skip is listed at the end and the session fails. Without the
variable (a developer's machine, which may lack chromium, tmux or a second user), skips stay skips.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from expected_skips import EXPECTED  # noqa: E402

_skipped: list[tuple[str, str]] = []


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def unexpected(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(node, why) for node, why in skipped
            if not any(fnmatch.fnmatch(node, pattern) and piece in why for pattern, piece, _ in EXPECTED)]


def pytest_sessionfinish(session, exitstatus) -> None:
    if os.environ.get("TRACEML_STRICT_SKIPS") != "1":
        return
    bad = unexpected(_skipped)
    if bad:
        lines = [f"  {node}: {why}" for node, why in bad]
        sys.stderr.write("\nunexpected skips (TRACEML_STRICT_SKIPS=1; tests/expected_skips.py lists the "
                         "expected ones with why):\n" + "\n".join(lines) + "\n")
        session.exitstatus = 1
