"""The CI subset's accuracy figure: every scenario run of tests/verdicts/test_matrix_ci.py records
its score (benchmarks/scenarios/catalog.score: every verdict of the run against the scenario's
truth), and the end of the session prints the share of verdicts and of runs right, the way
benchmarks/verdict_matrix.py figures them for the whole matrix, so each CI log keeps the figure
beside the tests' results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class MatrixTally:
    """(scenario, mode, score) of each run, in the order they ran."""

    runs: list[tuple[str, str, Any]] = field(default_factory=list)

    def line(self) -> str:
        right = sum(1 for _, _, sc in self.runs if sc.right)
        v_right = sum(sc.verdicts_right for _, _, sc in self.runs)
        v_all = sum(sc.verdicts_scored for _, _, sc in self.runs)
        out = (f"verdict matrix, CI subset: {v_right}/{v_all} verdicts right "
               f"({100.0 * v_right / max(1, v_all):.0f}%: causes, consequences, secondaries), "
               f"{right}/{len(self.runs)} runs right")
        wrong = [f"{name} [{mode}]: {'; '.join(sc.errors)}" for name, mode, sc in self.runs if sc.errors]
        return out + "".join(f"\n  wrong: {w}" for w in wrong)


TALLY = MatrixTally()


@pytest.fixture
def matrix_tally() -> MatrixTally:
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if TALLY.runs:
        terminalreporter.write_line(TALLY.line())
