"""docs/headline.md's generated parts, from the rules themselves: how each verdict decides (its
module's docstring), the thresholds it reads with their values and the reasons given for them in
report/thresholds.py, and the graph of causes and consequences. scripts/gen_docs.py writes them
into the page (``verdict-rules``, ``verdict-graph``), and its check fails when they drift.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from .. import pauses, thresholds
from . import RULES, graph, slowest

_ASSIGN = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.+)$")


def threshold_reasons() -> dict[str, tuple[str, str]]:
    """Every threshold of report/thresholds.py: ``NAME -> (its value as written, the reason)``.
    A name right after another one with no comment of its own shares that one's reason."""
    out: dict[str, tuple[str, str]] = {}
    comment: list[str] = []
    last = ""
    for line in Path(thresholds.__file__).read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if s.startswith("#:"):
            if last:  # a new block
                comment, last = [], ""
            comment.append(s[2:].strip())
            continue
        m = _ASSIGN.match(s)
        if m:
            text = " ".join(comment)
            out[m.group(1)] = (m.group(2).split("  #")[0].strip(), text)
            last = m.group(1)
        elif not s:
            continue
        else:
            comment, last = [], ""
    out.setdefault("WARMUP_STEPS", (str(thresholds.WARMUP_STEPS), "the first steps of every rank (warm-up: "
                                    "allocation, compilation, caches) are left out of the steady means"))
    return out


def _title(doc: str) -> tuple[str, str]:
    first, _, body = doc.partition("\n\n")
    return " ".join(first.split()), body.strip()


def _table(names: tuple[str, ...], reasons: dict[str, tuple[str, str]]) -> list[str]:
    rows = ["| threshold | value | why this value |", "| --- | --- | --- |"]
    prev = None
    for n in names:
        value, why = reasons.get(n, ("?", ""))
        same = why and why == prev
        cell = why.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{n}` | `{value}` | {'(with the row above)' if same else cell} |")
        prev = why
    return rows


def rules_markdown() -> str:
    """One section per verdict kind, in the registry's order."""
    reasons = threshold_reasons()
    out: list[str] = []
    for m in RULES:
        title, body = _title(inspect.getdoc(m) or m.KIND)
        kind, _, lead = title.partition(":")
        out.append(f"### {kind.strip()}\n")
        out.append(f"{lead.strip()}\n")
        out.append(body + "\n")
        if getattr(m, "SOURCE", None):
            out.append(f"Decided in `{m.SOURCE}` (its sentences too); `{m.KIND}` in the summary.\n")
        else:
            out.append(f"`{m.KIND}` in the summary; `report/rules/{m.__name__.rsplit('.', 1)[-1]}.py`.\n")
        if m.THRESHOLDS:
            out.extend(_table(m.THRESHOLDS, reasons))
            out.append("")
    for mod, name in ((slowest, "The slowest rank and its excess (report/rules/slowest.py)"),
                      (pauses, "Gaps between steps and their pauses (report/pauses.py)")):
        out.append(f"### {name}\n")
        out.append((inspect.getdoc(mod) or "").strip() + "\n")
    return "\n".join(out).rstrip() + "\n"


def graph_markdown() -> str:
    """The links (a cause explains an effect found where it is) and the contradictions."""
    out = [(inspect.getdoc(graph) or "").split("\n\n", 1)[1].strip(), "",
           "| cause | effect | why the cause explains it | the effect then |", "| --- | --- | --- | --- |"]
    for lk in graph.LINKS:
        then = "is information, saying so" if lk.becomes == graph.INFO else "follows the cause, saying so"
        out.append(f"| `{lk.cause}` | `{lk.effect}` | {lk.because} | {then} |")
    out.append("")
    for kind, by in graph.CONTRADICTS.items():
        out.append(f"`{kind}` is dropped beside any of: " + ", ".join(f"`{k}`" for k in by) + ".")
    out.append("")
    out.append("Beside a failure or a hang (the headline), the performance verdicts of the steps before it "
               "are information, except " + ", ".join(f"`{k}`" for k in graph.MAY_FAIL_A_RUN)
               + " (a cause that can make a run fail): the failure is what to fix, and a short run cut by a "
               "failing rank makes a straggler or a slow all-reduce out of noise.")
    return "\n".join(out) + "\n"
