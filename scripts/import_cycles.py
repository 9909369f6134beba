"""Import cycles in our packages, at module and at package level (issue 23's count).

A cycle is a strongly connected component of more than one node in the import graph (networkx,
which the pinned torch brings). Edges come from ``import`` statements read with ``ast``:

* **module level** (the count the issue gives): imports that run when the module is imported,
  i.e. outside functions and outside ``if TYPE_CHECKING:``; ``from .m import x`` is an edge to
  ``m`` (and to ``m.x`` when that is a module);
* **all**: imports inside functions too (deferred imports still tie the modules' code together).

The package level collapses each module to its first-level package under the distribution
(``traceml_core.aggregator.state`` -> ``traceml_core.aggregator``; a top-level module stays
itself) and drops self-edges.

    .venv/bin/python scripts/import_cycles.py            # counts, and each cycle's members
    .venv/bin/python scripts/import_cycles.py --quiet    # counts only
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import networkx as nx

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("traceml_core", "traceml_slurm", "traceml")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((SRC / pkg).rglob("*.py")):
            parts = list(p.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: dict[str, Path], deferred: bool) -> set[str]:
    """The modules of ours that ``name`` imports (at module level, or anywhere with ``deferred``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if deferred:
                    visit(child, False)
                continue
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    visit(c, top)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name in known:
                        out.add(a.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod in known:
                    out.add(mod)
                for a in child.names:
                    if f"{mod}.{a.name}" in known:
                        out.add(f"{mod}.{a.name}")
            visit(child, top)

    visit(tree, True)
    out.discard(name)
    return out


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2])


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted((sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1),
                  key=lambda c: (-len(c), c))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quiet", action="store_true", help="counts only")
    args = ap.parse_args(argv)
    known = modules()
    for label, deferred in (("module level", False), ("all imports", True)):
        g = nx.DiGraph()
        g.add_nodes_from(known)
        for name, path in known.items():
            g.add_edges_from((name, m) for m in imports(name, path, known, deferred))
        pg = nx.DiGraph()
        pg.add_edges_from((package_of(a), package_of(b)) for a, b in g.edges if package_of(a) != package_of(b))
        mc, pc = cycles(g), cycles(pg)
        print(f"{label}: {len(mc)} module cycles ({sum(map(len, mc))} modules, {g.number_of_edges()} edges "
              f"among {g.number_of_nodes()} modules); {len(pc)} package cycles ({sum(map(len, pc))} packages)")
        if not args.quiet:
            for c in mc:
                print("  modules:", " ".join(c))
            for c in pc:
                print("  packages:", " ".join(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
