"""The CI subset's accuracy figure: every scenario run of tests/verdicts/test_matrix_ci.py records
whether its primary verdict was right (benchmarks/scenarios/catalog.problems), and the end of the
session prints the share right, the way benchmarks/verdict_matrix.py figures it for the whole
matrix, so each CI log keeps the figure beside the tests' results."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass
class MatrixTally:
    """(scenario, mode, problems) of each run, in the order they ran."""

    runs: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def line(self) -> str:
        right = sum(1 for _, _, bad in self.runs if not bad)
        out = (f"verdict matrix, CI subset: {right}/{len(self.runs)} primaries right "
               f"({100.0 * right / len(self.runs):.0f}%; kind, culprit rank, phase, `also`)")
        wrong = [f"{name} [{mode}]: {'; '.join(bad)}" for name, mode, bad in self.runs if bad]
        return out + "".join(f"\n  wrong: {w}" for w in wrong)


TALLY = MatrixTally()


@pytest.fixture
def matrix_tally() -> MatrixTally:
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if TALLY.runs:
        terminalreporter.write_line(TALLY.line())
