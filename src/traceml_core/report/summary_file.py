"""The ``final_summary.json`` file: how it is written (:func:`dumps`), and reading one a user points
at, with the one-paragraph errors both ``traceml report`` and ``traceml compare`` give (each names
the file and says what to pass instead)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..rundir import SUMMARY_JSON
from ..errors import TraceMLError
from ..safeio import read_file

#: the largest summary read back (tens of MB at thousands of ranks)
MAX_SUMMARY_BYTES = 1 << 30


def read_summary(p: Path, who: str, error: type[TraceMLError]) -> dict[str, Any]:
    """The summary in ``p``; ``error`` (prefixed by ``who``: "Run A (path)", or the path) when the
    file cannot be read (a FIFO, a device: never waited on, never read without bound), is not
    JSON or is not a TraceML summary. A teammate's summary may be read (not ``owned``)."""
    try:
        doc = json.loads(read_file(p, MAX_SUMMARY_BYTES, owned=False, follow=True))
    except OSError as exc:
        raise error(f"{who}: cannot read it ({exc.strerror or exc}).") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{who}: not a TraceML summary: the file is not JSON ({str(exc)[:80]}). Pass the "
                    f"{SUMMARY_JSON} that `traceml run` wrote, or its run directory.") from None
    if not isinstance(doc, dict) or "schema_version" not in doc or "run" not in doc:
        raise error(f"{who}: not a TraceML summary (no schema_version/run fields). Pass the "
                    f"{SUMMARY_JSON} that `traceml run` wrote, or its run directory.")
    return doc


#: a JSON list of numbers/nulls that ``indent`` spread over several lines
_NUMBER_LIST = re.compile(rb"\[(\s*(?:-?[0-9][0-9.eE+-]*|null)(?:,\s*(?:-?[0-9][0-9.eE+-]*|null))*\s*)\]")


def dumps(summary: dict[str, Any]) -> bytes:
    """The summary as indented JSON, with lists of numbers kept on one line each (the series
    would otherwise take a line per number). pydantic-core's encoder writes the bytes: the
    standard library's indents in Python, a string per token (a 65,535-node summary of ~90 MB
    took ~450 MB more to write than to hold, past the aggregator's 1 GiB bound). A value that is
    not a finite number raises ValueError, as the standard library's strict encoder does (the
    caller then writes what is known: report/partial.py)."""
    import pydantic_core  # here: reading a summary (compare, report) does not need it

    json.dumps(summary, allow_nan=False)  # the C encoder (no indent): strict, fast, then dropped
    blob = pydantic_core.to_json(summary, indent=1)
    # a raw newline never occurs inside a JSON string, so a match spanning lines is a list
    blob = _NUMBER_LIST.sub(lambda m: b"[" + b",".join(x.strip() for x in m.group(1).split(b","))
                            + b"]" if b"\n" in m.group(0) else m.group(0), blob)
    return blob + b"\n"
