"""One help formatter for every ``traceml`` command: text fits the terminal (80 columns and up).

argparse wraps option help to the terminal's width, but a description or epilog is either wrapped
as one run-on paragraph (the default) or kept exactly as written (``RawDescriptionHelpFormatter``,
whose long lines then overflow an 80-column terminal). This keeps what the writer meant: blank
lines separate paragraphs, each paragraph is wrapped to the width, and an indented line (an
example command) is kept as written.
"""

from __future__ import annotations

import argparse
import textwrap


class ParagraphFormatter(argparse.RawDescriptionHelpFormatter):
    """Wrap each paragraph of a description or epilog; keep indented lines as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        para: list[str] = []

        def flush() -> None:
            if para:
                out.extend(textwrap.wrap(" ".join(para), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False))
                para.clear()

        for line in text.splitlines():
            if not line.strip():
                flush()
                out.append("")
            elif line[0].isspace():
                flush()
                out.append(indent + line)
            else:
                para.append(line.strip())
        flush()
        return "\n".join(out) + ("\n" if text.endswith("\n") else "")
