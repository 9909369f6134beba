"""``--export jsonl``: ``<run-dir>/steps.jsonl``, the run's series as JSON lines, at the end.

One JSON object per line: ``{"kind": "rank", ...}`` per rank and step bucket (the run's global
steps), ``{"kind": "all_ranks", ...}`` per bucket over all ranks (large runs), ``{"kind": "node",
...}`` per node and time bucket; ``null`` = not measured. The rows are
:func:`traceml_core.report.export.rank_rows` and ``node_rows``: the same points every export sends.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..optionrow import Option

if TYPE_CHECKING:
    from ..report.document import Summary
    from .hub import Exporter

JSONL_NAME = "steps.jsonl"


class JsonlOutput:
    """The output (exporters/output.py): plain class attributes, no dataclass: the registry
    is read by every `traceml` command, and each dataclass costs its generated methods."""

    kind: str = "jsonl"
    live: bool = False
    where: str = "`<run-dir>/steps.jsonl`"
    extra: str = ""
    leaves: tuple[str, ...] = (JSONL_NAME,)
    options: tuple[Option, ...] = ()

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        raise NotImplementedError("jsonl is written at the end")

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        return write_jsonl(summary, run_dir)


OUTPUT = JsonlOutput()


def write_jsonl(doc: "Summary", run_dir: Path) -> str:
    import json

    from ..report.export import node_rows, rank_rows
    from ..rundir import atomic_write

    lines = [json.dumps(row, allow_nan=False, separators=(",", ":"))
             for gen in (rank_rows(doc), node_rows(doc)) for row in gen]
    target = Path(run_dir) / JSONL_NAME
    atomic_write(target, ("\n".join(lines) + ("\n" if lines else "")).encode())
    return f"jsonl export: {len(lines)} lines in {target}"
