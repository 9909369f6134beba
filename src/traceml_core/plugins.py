"""Cluster environments and CLI subcommands contributed by plugins.

Core knows nothing of any particular scheduler. A cluster plugin registers a subclass of
:class:`ClusterEnvironment` under the ``traceml.clusters`` entry-point group; a plugin that adds
``traceml <name> ...`` subcommands registers a ``register(subparsers)`` callable under
``traceml.commands``. Discovery reads entry-point metadata only: a plugin module is imported when
it is used, so ``traceml --help`` stays fast.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

CLUSTER_GROUP = "traceml.clusters"
COMMAND_GROUP = "traceml.commands"
#: outputs (``--export KIND``): exporters/output.py
OUTPUT_GROUP = "traceml.outputs"


@dataclass(frozen=True)
class Setting:
    """A value together with where it came from (``cli``, ``env:VAR``, ``slurm:VAR``, ``default``)."""

    value: Any
    source: str


@dataclass(frozen=True)
class Refusal:
    """A reason the plugin cannot vouch for some keys.

    It becomes an error only if one of ``keys`` ends up taken from the plugin; when the user sets
    all of them explicitly (flags or ``TRACEML_*``), it is shown as a warning instead. This is how a
    site that launches one ``traceml run`` per node by other means can still pass every flag.
    """

    message: str
    keys: frozenset[str]
    variable: str | None = None


@dataclass(frozen=True)
class Advice:
    """A warning about values the plugin guessed: shown only when one of ``keys`` ends up taken
    from the plugin. "No GPU here, so 1 worker per node" is noise in a job that passes
    ``--nproc-per-node`` itself (every node of a generated CPU job printed it)."""

    message: str
    keys: frozenset[str]


@dataclass
class Contribution:
    """What a cluster environment says about this process's launch."""

    values: dict[str, Setting] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)


@dataclass(frozen=True)
class NodeObservation:
    """What one run (or one ``doctor``) measured of one node, judged against the other nodes of
    the same job: core builds these from its summary (report/nodeevidence.py); a cluster plugin
    may keep them across the user's jobs (``run_ended``). ``bad``: this node was worse than its
    peers by the rule of its kind, in this job; ``strong``: a hardware fault (an XID error, an
    uncorrectable ECC error) that needs no repetition to believe."""

    host: str
    #: ``link_send``, ``link_recv`` (GB/s), ``compute`` (own time per step, ms), ``failure``,
    #: ``oom``, ``missing`` (its ranks never arrived), ``bench_cpu`` (GFLOP/s), ``bench_gpu``,
    #: ``h2d`` (GB/s), ``gpu_health``
    kind: str
    #: this node's figure, and the median of the other nodes' in the same job (None: not measured)
    value: Optional[float] = None
    peers: Optional[float] = None
    unit: str = ""
    bad: bool = False
    strong: bool = False
    #: a few words for the reason line ("sends at 0.012 GB/s against 1.5 GB/s")
    note: str = ""
    #: the global ranks whose slowness this observation is (kinds that follow where ranks are
    #: placed: report/nodeevidence.PLACED_KINDS); () for a figure of the node itself (a link, a
    #: benchmark)
    ranks: tuple[int, ...] = ()
    #: ``equal``: the run measured the ranks' work per step and found it equal, so the slowness
    #: is not the rank's work; "" where not measured
    work: str = ""


@dataclass(frozen=True)
class RunEvidence:
    """Everything one run or doctor says about its nodes (``source``: ``run`` or ``doctor``)."""

    job_id: Optional[str]
    run_name: str
    at: float
    source: str
    hosts: tuple[str, ...]
    observations: tuple[NodeObservation, ...] = ()
    #: who named each host (``(host, "node 1's launcher")``, ``(host, "rank 3")``): a plugin that
    #: refuses a host says whose claim it was
    origins: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NextJob:
    """What the cluster plugin says the user's next job script should change: ``lines`` to paste
    (``#SBATCH --exclude=node3``), ``why`` for each, and ``notes`` (the store could not be read,
    say), shown with the summary."""

    lines: tuple[str, ...] = ()
    why: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: hosts the lines exclude (a verdict naming one of them ends in the line)
    excluded: tuple[str, ...] = ()


class ClusterEnvironment(ABC):
    """One cluster type: ``detect()`` whether we run inside it, ``contribute()`` launch values.

    Both are pure functions of an environment mapping, so they are testable with a dict.
    ``contribute`` raises :class:`~traceml_core.errors.ConfigError` for malformed values.
    ``validate`` sees the final, merged config and may object to explicit values that contradict
    what the cluster knows (for example a node rank expanded once in a batch shell).
    """

    name: ClassVar[str] = "cluster"

    @classmethod
    @abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool: ...

    @abstractmethod
    def contribute(self, environ: Mapping[str, str]) -> Contribution: ...

    def validate(self, config: Any, environ: Mapping[str, str]) -> list[Refusal]:
        return []

    def allocation_start(self, config: Any) -> float | None:
        """When the scheduler started this job's allocation (epoch seconds), for the goodput
        ledger's start-up, when the launch config does not carry it already
        (``config.job_start_time``); None when it cannot tell. Called once, in the background, by
        node 0's launcher; may ask the scheduler (a few seconds at most)."""
        return None

    def scheduled_end(self, config: Any) -> float | None:
        """When the scheduler means to end this job (its time limit; epoch seconds), asked when
        the early warning of the job's ``--signal`` arrives, for the goodput ledger; None when it
        cannot tell (no limit, no answer). Called in the background; a few seconds at most."""
        return None

    def explain_interrupt(self, config: Any, signum: int, at: float) -> str | None:
        """Who sent ``signum`` (received at ``at``, epoch seconds), in words, when the scheduler can
        tell: "the job reached its time limit", "the job was cancelled". None when it cannot.
        Called once, after the workers stopped; must answer within a few seconds."""
        return None

    def run_ended(self, evidence: RunEvidence, environ: Mapping[str, str]) -> NextJob | None:
        """Node 0's aggregator hands over what the run measured of each node, once, before the
        final summary is written; the plugin answers with lines for the next job script, judged
        from this run and the user's earlier jobs. It is on the summary's path: it must only read
        (a fraction of a second at most) and keep nothing yet (:meth:`keep_evidence` does, after
        the summary is written). An exception is noted in the summary, never raised into it."""
        return None

    def keep_evidence(self, evidence: RunEvidence, environ: Mapping[str, str]) -> list[str]:
        """After the final summary is written: keep the run's node evidence across the user's
        jobs (a bounded wait of a few seconds at most); notes for the log (skipped, refused)."""
        return []

    def cpu_request(self, environ: Mapping[str, str]) -> dict[str, Any] | None:
        """What the scheduler gave this task in CPUs, for the input-bound verdict (sent by each
        rank with its own CPU facts): ``{"cpus_per_task", "cpus_per_task_source",
        "srun_cpus_per_task", "cpus_on_node", "version", "fix"}``, where ``fix`` is the lines that
        request N CPUs per task in the next job, with ``{n}`` for N. None: not known."""
        return None


@functools.lru_cache(maxsize=1)
def _all_entry_points() -> tuple[metadata.EntryPoint, ...]:
    """Every installed entry point, read once per process (one scan of the installed
    distributions' metadata: tens of ms, paid once however many groups are asked for)."""
    seen: set[str] = set()
    out: list[metadata.EntryPoint] = []
    for dist in metadata.distributions():  # the first of each name on sys.path, as entry_points() does
        # the name from the distribution's directory where the Python gives it (as its own
        # entry_points() does): reading every METADATA file would cost tens of ms per command
        name = getattr(dist, "_normalized_name", None) or (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        out.extend(dist.entry_points)
    return tuple(out)


def _entry_points(group: str) -> Sequence[metadata.EntryPoint]:
    return [ep for ep in _all_entry_points() if ep.group == group]


def output_entry_points() -> Sequence[metadata.EntryPoint]:
    """The installed outputs, in name order (loaded by exporters/output.py)."""
    return sorted(_entry_points(OUTPUT_GROUP), key=lambda e: e.name)


def cluster_environments() -> list[type[ClusterEnvironment]]:
    """All installed cluster environments, in entry-point name order."""
    found = []
    for ep in sorted(_entry_points(CLUSTER_GROUP), key=lambda e: e.name):
        cls = ep.load()
        found.append(cls)
    return found


def cluster_environment_names() -> list[str]:
    return sorted(ep.name for ep in _entry_points(CLUSTER_GROUP))


def load_cluster_environment(name: str) -> type[ClusterEnvironment] | None:
    for ep in _entry_points(CLUSTER_GROUP):
        if ep.name == name:
            return ep.load()
    return None


def command_registrars() -> list[tuple[str, Callable[..., Any]]]:
    """``(name, lazy loader)`` for each plugin subcommand; loading is deferred until used."""
    return [(ep.name, ep.load) for ep in sorted(_entry_points(COMMAND_GROUP), key=lambda e: e.name)]
