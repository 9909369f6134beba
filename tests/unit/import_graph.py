"""The import graph of our packages, read from the source (nothing is imported), and its cycles.

Two graphs: ``top`` holds the imports a module runs when it is imported (module level, outside
``if TYPE_CHECKING:``); ``all`` adds the imports inside functions, which close a cycle as surely
at run time (only later). Used by the layout tests and, as a script, to count::

    python tests/unit/import_graph.py src/traceml_core traceml_core.sdk
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Graph:
    modules: list[str]
    top: dict[str, set[str]]
    all: dict[str, set[str]]


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _targets(mod: str, node: ast.AST, is_pkg: bool, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            parts = mod.split(".")[: None if is_pkg else -1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for n in names:
        while n and n not in known:
            n = n.rpartition(".")[0]
        if n and n != mod:
            out.append(n)
    return out


def graph(root: Path) -> Graph:
    """``root``: a package's directory (``src/traceml_core``)."""
    known = _modules(root)
    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    for mod, path in known.items():
        t, a = top.setdefault(mod, set()), every.setdefault(mod, set())
        is_pkg = path.name == "__init__.py"

        def walk(node: ast.AST, at_import: bool) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.Import, ast.ImportFrom)):
                    for target in _targets(mod, ch, is_pkg, known):
                        a.add(target)
                        if at_import:
                            t.add(target)
                elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    walk(ch, False)
                elif isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                    walk(ch, False)
                else:
                    walk(ch, at_import)

        walk(ast.parse(path.read_text()), True)
    return Graph(sorted(known), top, every)


def cycles(edges: dict[str, set[str]], within: str = "") -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), among the modules
    whose name starts with ``within``."""
    g = {m: {x for x in ts if x.startswith(within)} for m, ts in edges.items() if m.startswith(within)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    root, within = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
    sys.setrecursionlimit(10_000)
    g = graph(root)
    for kind in ("top", "all"):
        edges = getattr(g, kind)
        mods = [m for m in g.modules if m.startswith(within)]
        n = sum(len({x for x in edges[m] if x.startswith(within)}) for m in mods)
        found = cycles(edges, within)
        print(f"{kind}: {len(mods)} modules, {n} edges, {len(found)} cycles"
              f" ({sum(map(len, found))} modules in them)")
        for c in found:
            print("   " + " ".join(c))
