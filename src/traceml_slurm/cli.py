"""``traceml slurm {env,doctor,template,nodes}``: entry point registered under ``traceml.commands``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traceml slurm", description="Slurm helpers for TraceML.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    e = sub.add_parser("env", help="show how this Slurm context resolves (same as traceml run --print-config)")
    e.add_argument("--json", action="store_true")
    sub.add_parser("doctor", help="preflight checks of this allocation, on every node (traceml slurm doctor -h)",
                   add_help=False)
    from .nodes.cli import add_nodes_parser
    from .template.cli import add_template_parser

    add_template_parser(sub)
    add_nodes_parser(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:  # its own parser: doctor/cli.py
        from .doctor.cli import main as doctor_main

        return doctor_main(argv[1:])
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(ns, "command", None) == "template":
            from .template.cli import unknown_option

            sys.stderr.write(unknown_option(extra) + "\n")
            return 2
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if ns.command == "env":
        from traceml_core.cli import main as core_main

        return core_main(["run", "--print-config", "--cluster=slurm"] + (["--json"] if ns.json else []))
    if ns.command == "nodes":
        from .nodes.cli import run_nodes

        return run_nodes(ns)
    if ns.command == "template":
        from .template.cli import run_template

        return run_template(ns, argv[argv.index("template") + 1:])
    parser.print_help()
    return 0
