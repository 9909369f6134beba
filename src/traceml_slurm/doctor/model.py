"""What a check says, per node and merged: the data the agent sends, the renderer draws and --json prints.

A check function returns an :class:`Outcome` for one node (or for the job). Outcomes of the same
check from several nodes are merged into one :class:`CheckResult`, whose status is the worst of its
nodes and whose fix is the fix of the first node that needs one. Everything here is plain data so
it crosses the wire as msgpack maps (``to_wire`` / ``from_wire``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    @property
    def rank(self) -> int:
        """Severity for merging: a failure anywhere fails the check; a skip never hides a pass."""
        return {"skip": 0, "pass": 1, "warn": 2, "fail": 3}[self.value]


#: presentation order of the groups; ids start with the group's prefix
GROUPS: tuple[tuple[str, str], ...] = (
    ("slurm", "Slurm context"),
    ("gpu", "GPUs"),
    ("sw", "Software"),
    ("net", "Network"),
    ("fs", "Filesystem"),
    ("time", "Time"),
    ("ctl", "Controller facts"),
    ("cross", "Across nodes"),
)
GROUP_TITLES = dict(GROUPS)


@dataclass
class Outcome:
    """One check on one node: status, a short observed value, a one-line fix when not ok."""

    status: Status
    observed: str
    fix: Optional[str] = None
    #: machine-readable details (JSON-able): counts, versions, addresses
    data: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"status": self.status.value, "observed": self.observed, "fix": self.fix,
                "data": self.data, "duration_s": round(self.duration_s, 4)}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Outcome":
        return cls(Status(d["status"]), str(d.get("observed", "")), d.get("fix"),
                   dict(d.get("data") or {}), float(d.get("duration_s") or 0.0))


def passed(observed: str, **data: Any) -> Outcome:
    return Outcome(Status.PASS, observed, data=data)


def warned(observed: str, fix: str, **data: Any) -> Outcome:
    return Outcome(Status.WARN, observed, fix, data=data)


def failed(observed: str, fix: str, **data: Any) -> Outcome:
    return Outcome(Status.FAIL, observed, fix, data=data)


def skipped(observed: str, **data: Any) -> Outcome:
    return Outcome(Status.SKIP, observed, data=data)


@dataclass(frozen=True)
class CheckSpec:
    """A check: stable id (``group.name``), title, and the function that runs it on one node."""

    id: str
    title: str
    run: Callable[..., Outcome]
    #: "node": runs on every node; "job": once, on the calling host; "cross": on the coordinator
    scope: str = "node"

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]


@dataclass
class CheckResult:
    """One check merged over the nodes it ran on."""

    id: str
    title: str
    scope: str
    nodes: dict[str, Outcome] = field(default_factory=dict)
    ignored: bool = False

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def status(self) -> Status:
        if not self.nodes:
            return Status.SKIP
        return max((o.status for o in self.nodes.values()), key=lambda s: s.rank)

    @property
    def fix(self) -> Optional[str]:
        worst = self.status
        for outcome in self.nodes.values():
            if outcome.status is worst and outcome.fix:
                return outcome.fix
        for outcome in self.nodes.values():
            if outcome.fix and outcome.status in (Status.FAIL, Status.WARN):
                return outcome.fix
        return None

    @property
    def duration_s(self) -> float:
        return max((o.duration_s for o in self.nodes.values()), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "group": self.group, "title": self.title, "scope": self.scope,
            "status": self.status.value, "ignored": self.ignored, "fix": self.fix,
            "duration_s": round(self.duration_s, 3),
            "nodes": {name: o.to_wire() for name, o in self.nodes.items()},
        }


@dataclass
class JobInfo:
    """Who ran the doctor, where, on which job: the header of the report."""

    job_id: Optional[str]
    job_name: Optional[str]
    nodes: list[str]
    context: str
    calling_host: str
    tier: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.job_id, "name": self.job_name, "nodes": self.nodes, "nnodes": len(self.nodes),
                "context": self.context, "calling_host": self.calling_host, "tier": self.tier}


@dataclass
class Summary:
    passed: int = 0
    failed: int = 0
    warnings: int = 0
    skipped: int = 0
    ignored: int = 0

    @classmethod
    def of(cls, results: list[CheckResult]) -> "Summary":
        s = cls()
        for r in results:
            if r.ignored:
                s.ignored += 1
                continue
            st = r.status
            if st is Status.PASS:
                s.passed += 1
            elif st is Status.FAIL:
                s.failed += 1
            elif st is Status.WARN:
                s.warnings += 1
            else:
                s.skipped += 1
        return s

    def to_json(self) -> dict[str, int]:
        return {"passed": self.passed, "failed": self.failed, "warnings": self.warnings,
                "skipped": self.skipped, "ignored": self.ignored}


@dataclass
class Report:
    job: JobInfo
    results: list[CheckResult]
    duration_s: float
    strict: bool = False
    #: set when the doctor itself could not finish (exit 3)
    error: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    #: the lines for the next job script from the user's node store (doctor/nodehealth.py)
    next_job: Optional[Any] = None

    @property
    def summary(self) -> Summary:
        return Summary.of(self.results)

    @property
    def exit_code(self) -> int:
        if self.error:
            return 3
        s = self.summary
        if s.failed or (self.strict and s.warnings):
            return 1
        return 0

    def sorted_results(self) -> list[CheckResult]:
        order = {g: i for i, (g, _) in enumerate(GROUPS)}
        indexed = list(enumerate(self.results))
        indexed.sort(key=lambda p: (order.get(p[1].group, len(order)), p[0]))
        return [r for _, r in indexed]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "job": self.job.to_json(),
            "summary": self.summary.to_json(),
            "exit_code": self.exit_code,
            "strict": self.strict,
            "duration_s": round(self.duration_s, 3),
            "checks": [r.to_json() for r in self.sorted_results()],
        }
        if self.notes:
            out["notes"] = list(self.notes)
        if self.next_job is not None:
            nj = self.next_job
            out["next_job"] = {"lines": list(nj.lines), "why": list(nj.why), "notes": list(nj.notes),
                               "excluded": list(nj.excluded)}
        if self.error:
            out["error"] = self.error
        return out


SCHEMA_VERSION = 1

#: checks that need torch (in a child process); the child starts early only if one of them runs
TORCH_CHECKS = frozenset({"gpu.count", "gpu.cuda-init", "sw.torch", "sw.nccl"})


def is_ignored(check_id: str, ignore: Iterable[str]) -> bool:
    """``--ignore`` takes exact ids or whole groups (``gpu`` or ``gpu.*``)."""
    group = check_id.split(".", 1)[0]
    return any(i == check_id or i.rstrip(".*") == group for i in ignore)
