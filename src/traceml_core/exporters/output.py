"""The one registry of outputs: every ``--export KIND``, found through the ``traceml.outputs``
entry-point group, so a third party adds one with a module and an entry point:

.. code-block:: toml

    [project.entry-points."traceml.outputs"]
    mydest = "mypkg.traceml_out:OUTPUT"

An output (:class:`Output`) says its ``kind``, whether it goes out ``live`` (during the run, from
node 0's aggregator, through :class:`~.hub.ExportHub`) or at the end (from the summary, also
``traceml report --export KIND``), what it leaves at the top of the run directory (``leaves``:
moved with the attempt when the next one begins, attempts.py), the extra that installs its
library, and the option rows of its settings (:class:`~traceml_core.optionrow.Option`: a flag, a
``TRACEML_*`` variable and, where the library has one, its own variable): the destination reads
its settings from what it is handed, never from the environment. Everything else is made from
this registry: the kinds ``--export`` accepts (options.py), the option table, the live and
at-the-end lists, the files of an attempt, and docs/exports.md's table (scripts/gen_docs.py).

An output module must import nothing heavy at its top: the registry is read by ``traceml
--help``. Its library is imported in :meth:`Output.start` or :meth:`Output.write`, in the thread
that uses it.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, runtime_checkable

from ..optionrow import Option

if TYPE_CHECKING:
    from ..report.document import Summary
    from .hub import Exporter


@runtime_checkable
class Output(Protocol):
    """One destination of ``--export``."""

    #: the word of ``--export`` (lower case, no comma)
    kind: str
    #: True: during the run (``start``); False: once, from the final summary (``write``)
    live: bool
    #: where it goes, in a few words (docs/exports.md's table)
    where: str
    #: the pip extra that brings its library (``wandb``), or "" when it needs none
    extra: str
    #: what it leaves at the top of the run directory (names), moved with the attempt
    leaves: tuple[str, ...]
    #: its settings, as option rows
    options: tuple[Option, ...]

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        """A live output: the exporter of one run (called in its own thread; may import its
        library). ``settings``: the value of each of its options, by key."""

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        """An at-the-end output: write it from the final summary; returns the line to log."""


@dataclass(frozen=True)
class Registry:
    """The installed outputs, by kind, and the entry points that failed to load (said once)."""

    outputs: dict[str, Output]
    broken: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.outputs)

    def live_kinds(self) -> tuple[str, ...]:
        return tuple(k for k, o in self.outputs.items() if o.live)

    def end_kinds(self) -> tuple[str, ...]:
        return tuple(k for k, o in self.outputs.items() if not o.live)

    def options(self) -> tuple[Option, ...]:
        return tuple(o for out in self.outputs.values() for o in out.options)

    def leaves(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for out in self.outputs.values() for f in out.leaves))

    def settings(self, kind: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """``kind``'s settings: each of its options' value from ``given`` (the launch's), else its
        default."""
        return {o.key: given.get(o.key, o.default) for o in self.outputs[kind].options}


#: the order of the built-in kinds in lists and docs (others follow by name)
_ORDER = ("wandb", "mlflow", "prometheus", "tensorboard", "jsonl")


@functools.lru_cache(maxsize=1)
def registry() -> Registry:
    """Every output installed, read once (entry-point metadata, then each output's module)."""
    from ..plugins import output_entry_points

    found: dict[str, Output] = {}
    broken: list[str] = []
    for ep in output_entry_points():
        try:
            out = ep.load()
            if not isinstance(out, Output) or out.kind != ep.name:
                raise TypeError(f"{ep.value} is not an Output of kind {ep.name!r}")
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop a launch
            broken.append(f"{ep.name} ({ep.value}): {type(exc).__name__}: {exc}")
            continue
        found.setdefault(ep.name, out)
    ordered = sorted(found, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k))
    reg = Registry({k: found[k] for k in ordered}, tuple(broken))
    for line in reg.broken:
        sys.stderr.write(f"traceml: warning: output {line}; --export cannot use it\n")
    return reg


def option_rows() -> tuple[Option, ...]:
    """The option rows of every output (options.py appends them to core's)."""
    return registry().options()


def docs_table() -> str:
    """docs/exports.md's table of kinds (scripts/gen_docs.py)."""
    rows = ["| kind | when | where | settings | extra to install |", "| --- | --- | --- | --- | --- |"]
    for kind, out in registry().outputs.items():
        settings = ", ".join(f"`{o.flag}`" for o in out.options) or "none"
        extra = f'`pip install "./traceml-slurm[{out.extra}]"`' if out.extra else "none"
        rows.append(f"| `{kind}` | {'during the run' if out.live else 'at the end'} | {out.where} | "
                    f"{settings} | {extra} |")
    return "\n".join(rows) + "\n"


def missing_note() -> Optional[str]:
    """Why no output is known, when none is (the install's metadata is missing or stale)."""
    if registry().outputs:
        return None
    return ("no output is registered (the traceml.outputs entry points of traceml-slurm were not "
            "found: its install is missing or older than this code; reinstall it, or run scripts/setup)")
