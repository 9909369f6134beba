"""Rendering a report: text for people (grouped, one line per check, a fix under each problem) and
JSON for programs (only JSON on stdout; schema in model.Report.to_json).

Marks are ✓ ! ✗ - with colour on a terminal; plain ASCII ``[ok] [!!] [XX] [--]`` when stdout is not
a TTY, when ``NO_COLOR`` is set, or when the terminal cannot encode the symbols.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any, Mapping

from .model import GROUP_TITLES, CheckResult, Outcome, Report, Status

UNICODE = {Status.PASS: "✓", Status.WARN: "!", Status.FAIL: "✗", Status.SKIP: "-"}
ASCII = {Status.PASS: "[ok]", Status.WARN: "[!!]", Status.FAIL: "[XX]", Status.SKIP: "[--]"}
COLOURS = {Status.PASS: "\033[32m", Status.WARN: "\033[33m", Status.FAIL: "\033[31m", Status.SKIP: "\033[2m"}
DIM, BOLD, RESET = "\033[2m", "\033[1m", "\033[0m"
#: a passing check whose nodes observed different values shows this many inline (-v shows all)
INLINE_NODES = 3


class Style:
    def __init__(self, fancy: bool) -> None:
        self.fancy = fancy

    @classmethod
    def for_stream(cls, stream: IO[str], no_color: bool = False) -> "Style":
        if no_color or not getattr(stream, "isatty", lambda: False)():
            return cls(False)
        try:
            "✓✗".encode(getattr(stream, "encoding", None) or "ascii")
        except (UnicodeEncodeError, LookupError):
            return cls(False)
        return cls(True)

    def mark(self, status: Status) -> str:
        if not self.fancy:
            return ASCII[status]
        return f"{COLOURS[status]}{UNICODE[status]}{RESET}"

    def dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.fancy else text

    def bold(self, text: str) -> str:
        return f"{BOLD}{text}{RESET}" if self.fancy else text


def _hosts(names: list[str]) -> str:
    try:
        import hostlist

        return str(hostlist.collect_hostlist(names))
    except Exception:  # noqa: BLE001 - odd names: list them
        return ",".join(names)


def _groups(nodes: Mapping[str, Outcome]) -> list[tuple[Status, str, list[str]]]:
    groups: dict[tuple[Status, str], list[str]] = {}
    for name, o in nodes.items():
        groups.setdefault((o.status, o.observed), []).append(name)
    return [(st, obs, names) for (st, obs), names in groups.items()]


def check_lines(r: CheckResult, style: Style, verbose: bool) -> list[str]:
    tag = style.dim(f"[{r.id} {r.duration_s:.2f}s]")
    if r.ignored:
        return [f"  {style.mark(Status.SKIP)} {r.title}: ignored (--ignore)  {style.dim(f'[{r.id}]')}"]
    status = r.status
    if not r.nodes:
        return [f"  {style.mark(Status.SKIP)} {r.title}: not run  {tag}"]
    groups = _groups(r.nodes)
    many = len(r.nodes) > 1
    lines: list[str] = []
    if len(groups) == 1:
        st, obs, names = groups[0]
        where = f" {style.dim('(' + _hosts(names) + ')')}" if many else ""
        lines.append(f"  {style.mark(status)} {r.title}: {obs}{where}  {tag}")
    elif status is Status.PASS and not verbose:
        shown = list(r.nodes.items())[:INLINE_NODES]
        more = len(r.nodes) - len(shown)
        text = "; ".join(f"{name}: {o.observed}" for name, o in shown)
        if more:
            text += " " + style.dim(f"(and {more} more nodes, all ok; -v shows each)")
        lines.append(f"  {style.mark(status)} {r.title}: {text}  {tag}")
    else:
        lines.append(f"  {style.mark(status)} {r.title}  {tag}")
        ok_names: list[str] = []
        for st, obs, names in sorted(groups, key=lambda g: -g[0].rank):
            if st is Status.PASS and not verbose and status is not Status.PASS:
                ok_names += names
                continue
            lines.append(f"      {_hosts(names)}: {style.mark(st)} {obs}")
        if ok_names:
            lines.append(f"      {_hosts(ok_names)}: {style.mark(Status.PASS)} ok")
    if verbose:
        for name, o in r.nodes.items():
            cfg = o.data.get("config") if isinstance(o.data, dict) else None
            if isinstance(cfg, dict):
                lines.append(style.dim(f"      {name} sources: " + ", ".join(
                    f"{k}={v.get('value')} ({v.get('source')})" for k, v in cfg.items() if isinstance(v, dict))))
    fix = r.fix
    if fix and status in (Status.FAIL, Status.WARN):
        lines.append(f"      {style.bold('fix:')} {fix}")
    return lines


def summary_line(report: Report) -> str:
    s = report.summary
    parts = [f"{s.passed} passed", f"{s.failed} failed",
             f"{s.warnings} warning{'s' if s.warnings != 1 else ''}", f"{s.skipped} skipped"]
    if s.ignored:
        parts.append(f"{s.ignored} ignored")
    tail = f" in {report.duration_s:.1f} s"
    if report.strict and s.warnings:
        tail += " (--strict: warnings fail)"
    return ", ".join(parts) + tail


def header(report: Report) -> str:
    j = report.job
    if not j.job_id:
        return f"traceml slurm doctor on {j.calling_host}, outside a Slurm allocation ({j.tier} tier)"
    nodes = _hosts(j.nodes) if j.nodes else "?"
    name = f" ({j.job_name})" if j.job_name else ""
    return (f"traceml slurm doctor: job {j.job_id}{name}, {len(j.nodes)} node{'s' if len(j.nodes) != 1 else ''} "
            f"{nodes}, from the {j.context} on {j.calling_host} ({j.tier} tier)")


def render_text(report: Report, stream: IO[str], *, no_color: bool = False, verbose: bool = False) -> None:
    """``no_color``: NO_COLOR is set (https://no-color.org); plain marks then, as when not a terminal."""
    style = Style.for_stream(stream, no_color)
    out = [style.bold(header(report)), ""]
    current = None
    for r in report.sorted_results():
        if r.group != current:
            if current is not None:
                out.append("")
            current = r.group
            out.append(style.bold(GROUP_TITLES.get(r.group, r.group)))
        out.extend(check_lines(r, style, verbose))
    out.append("")
    for note in report.notes:
        out.append(style.dim(f"note: {note}"))
    if report.error:
        out.append(f"{style.mark(Status.FAIL)} the doctor could not finish: {report.error}")
    out.append(summary_line(report))
    nj = report.next_job
    if nj is not None:
        out += [style.dim(f"note: {n}") for n in nj.notes]
        if nj.lines:
            out.append("Next job script (paste into your sbatch script; traceml slurm nodes says why):")
            out += [f"  {line}    # {why}" for line, why in zip(nj.lines, nj.why)]
    stream.write("\n".join(out) + "\n")
    stream.flush()


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def render_json(report: Report, stream: IO[str]) -> None:
    stream.write(json.dumps(report.to_json(), indent=2, default=_default) + "\n")
    stream.flush()


def is_tty(stream: IO[str]) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
