"""``traceml``: run | summarize | compare, plus subcommands contributed by plugins (``traceml slurm``).

Start-up must stay light: nothing here imports torch, and heavy modules are imported inside the
command that needs them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

from . import __version__
from .errors import TraceMLError
from .helpformat import ParagraphFormatter
from .exporters import end_kinds
from .options import OPTIONS

RUN_EPILOG = """\
The grammar is torchrun's: flags, then SCRIPT, then the script's arguments.
Flags may be written with - or _ (--nproc_per_node), as torchrun allows. An
unknown flag before SCRIPT is refused (with "did you mean").

After SCRIPT, TraceML's own flags still count as TraceML's, and each one read
there is announced on stderr. Put `--` before the script's arguments to pass
everything after it to the script:

  traceml run --nproc-per-node=4 train.py -- --run-name myexp --epochs 3

torchrun's own flags are honoured: --nproc_per_node, --node_rank,
--master_addr/--master_port are these flags; --standalone picks free local
ports; -m/--module runs a module; --no-python, --run-path, --log-dir,
-r/--redirects, -t/--tee, --local-ranks-filter, --start-method,
--monitor-interval, --role and the other torchrun options are passed on to
torchrun; --rdzv-endpoint gives the master, --rdzv-backend=static|c10d and
--rdzv-id are accepted. Refused, with the reason: elastic ranges
(--nnodes=1:4), --max-restarts other than 0, --rdzv-conf, other rendezvous
backends, symbolic worker counts other than cpu.

Every flag can also be set as TRACEML_<FLAG> (for example TRACEML_LOGS_DIR).
Precedence: flag > TRACEML_* variable > cluster plugin (Slurm) > default.
See --print-config.
"""


def _add_run_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The parser behind `traceml run --help` (runargs.py parses the command line itself)."""
    p = sub.add_parser("run", help="launch a training script with telemetry (wraps torchrun)",
                       description="Launch SCRIPT on this node with torchrun and collect telemetry. "
                                   "Checks first that the script (or -m module) and torch are there "
                                   "for the workers; a launch that cannot work exits 2 with the "
                                   "reason, before anything starts.",
                       usage="traceml run [flags] SCRIPT [args] | traceml run [flags] -m MODULE [args]",
                       epilog=RUN_EPILOG, formatter_class=ParagraphFormatter)
    for o in OPTIONS:
        default = o.default_doc or o.default
        p.add_argument(o.flag, dest=o.key, metavar=o.metavar or None, default=None,
                       help=f"{o.help} [{o.env}; default: {default}]".replace("%", "%%"))
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved launch config with the source of each value, then exit")
    p.add_argument("--json", action="store_true", help="with --print-config: print JSON only")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name (python -m)")
    p.add_argument("--standalone", action="store_true",
                   help="single node on free local ports (torchrun's --standalone)")
    p.add_argument("script", nargs="?", help="the training script")
    return p


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="traceml", description="Training telemetry for PyTorch on Slurm.")
    parser.add_argument("--version", action="version", version=f"traceml {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = _add_run_parser(sub)
    s = sub.add_parser("summarize", help="(re)build a run's final summary from its run directory")
    s.add_argument("run_dir")
    r = sub.add_parser("report", help="(re)write a run's final_summary.html from its summary",
                       description="Write RUN_DIR/final_summary.html from RUN_DIR/final_summary.json "
                                   "(one self-contained page: opens offline).")
    r.add_argument("run_dir", help="the run directory <logs-dir>/<run-name>, or its final_summary.json")
    r.add_argument("--output", "-o", metavar="PATH", default=None,
                   help="where to write the page (default: final_summary.html beside the JSON)")
    ends = end_kinds()  # what a finished run can still write (the live ones go out during it)
    r.add_argument("--export", action="append", default=[], metavar="KIND", choices=ends,
                   help=f"also write the run's series for another tool: {' or '.join(ends)} (repeatable)")
    c = sub.add_parser("compare", help="compare two runs (run directories or final_summary.json files)")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--json", action="store_true")
    c.add_argument("--html", metavar="PATH", default=None,
                   help="also write the comparison and both runs side by side as one HTML page")
    c.add_argument("--fail-on-regression", type=float, metavar="PCT", default=None)
    from .plugins import command_registrars

    for name, _loader in command_registrars():
        sub.add_parser(name, help=f"commands of the {name} plugin (traceml {name} --help)", add_help=False)
    return parser, run


def cmd_run(argv: Sequence[str]) -> int:
    from . import runargs

    args = runargs.parse(argv)
    if args.help:  # the parser exists for this page only: runargs.py parses the command line
        build_parser()[1].print_help()
        return 0
    cli = dict(args.cli)
    if args.standalone:
        runargs.apply_standalone(cli, os.environ)
    from .config import resolve
    from .errors import ConfigError
    from .ports import FREE_SOURCE, free_port

    name_from = args.script.rsplit(".", 1)[-1] if (args.module and args.script) else args.script
    try:
        config = resolve(cli, os.environ, script=name_from, free_port=free_port)
    except ConfigError as exc:  # a value read after the script says so, and how to pass it on
        hint = args.hint_for(exc.variable)
        if not hint:
            raise
        raise ConfigError(f"{exc}{hint}", variable=exc.variable) from None
    if args.after_script:
        from .launcher.supervise import log

        for line in args.announcements():
            log(line)
    notes = list(args.notes)
    rdzv = runargs.check_rdzv(args, config.nnodes, config.source("node_rank"))
    if rdzv:
        notes.append(rdzv)
    free = [k for k in ("master_port", "aggregator_port") if config.source(k) == FREE_SOURCE]
    if free:
        notes.append("free ports for this run: " + ", ".join(f"{k.split('_')[0]} {getattr(config, k)}"
                                                           for k in free)
                     + " (one node outside a cluster and no port given, so each run picks its own; "
                     "pin with " + "/".join("--" + k.replace("_", "-") for k in free) + ")")
    if args.print_config:
        return print_config(config, args.script, args.script_args, as_json=args.json,
                            extra=args.launcher_argv(), notes=notes)
    if args.script is None:
        raise runargs.UsageError("the training script is missing: traceml run [flags] SCRIPT "
                                 "[script args] (or -m MODULE). See traceml run --help.")
    from .launcher.run import launch
    from .launcher.supervise import log

    for note in notes:
        log(note)
    return launch(config, args.script, args.script_args, torchrun_args=args.launcher_argv(),
                  module=args.module, no_python=args.no_python)


def print_config(config, script: Optional[str], script_args: Sequence[str], *, as_json: bool,
                 extra: Sequence[str] = (), notes: Sequence[str] = ()) -> int:
    from .launcher.torchrun import torchrun_command, worker_command

    task = config.layout == "task"
    if task:
        cmd = worker_command(script or "SCRIPT", script_args, module="--module" in extra,
                             no_python="--no-python" in extra)
    else:
        cmd = torchrun_command(config, script or "SCRIPT", script_args, extra=extra)
    if as_json:
        data = config.to_json()
        data["layout_reason"] = config.layout_reason or None
        data["command"] = cmd
        sys.stdout.write(json.dumps(data) + "\n")
        return 0
    rows = [(k, "" if v is None else str(v), s) for k, v, s in config.items()]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'key':<{w0}}  {'value':<{w1}}  source")
    for k, v, s in rows:
        print(f"{k:<{w0}}  {v:<{w1}}  {s}")
    for w in config.warnings:
        print(f"warning: {w}")
    for n in notes:
        print(f"note: {n}")
    why = f" ({config.layout_reason})" if config.layout_reason else ""
    if task:
        print(f"\nlayout: task - this task is rank {config.task_rank} of {config.world_size} (local rank "
              f"{config.local_rank} of {config.nproc_per_node} on node {config.node_rank}){why}")
        print("worker command of this task (no torchrun):")
    else:
        print(f"\nlayout: node - one launcher per node{why}")
        print("torchrun command on this node:")
    print("  " + shlex.join(cmd))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] not in ("run", "summarize", "report", "compare", "-h", "--help", "--version"):
            from .plugins import command_registrars

            for name, loader in command_registrars():
                if argv[0] == name:
                    return int(loader()(argv[1:]) or 0)
        if argv and argv[0] == "run":
            return cmd_run(argv[1:])
        parser, _run = build_parser()
        ns = parser.parse_args(argv)
        if ns.command == "summarize":
            from .report.summarize import summarize_cli

            return summarize_cli(ns.run_dir)
        if ns.command == "report":
            from .report.rebuild import report_cli

            from .exporters.atend import export_summary

            return report_cli(ns.run_dir, ns.output, ns.export, export_summary)
        if ns.command == "compare":
            from .report.compare import compare_cli

            return compare_cli(ns.a, ns.b, as_json=ns.json, fail_on_regression=ns.fail_on_regression,
                               html=ns.html)
        parser.print_help()
        return 0
    except TraceMLError as exc:
        sys.stderr.write(f"traceml: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
