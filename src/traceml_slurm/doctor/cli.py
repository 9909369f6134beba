"""``traceml slurm doctor``: the parser, choosing local or cross-node, and exit codes.

Exit codes: 0 every check passed (or only warned), 1 a check failed (``--strict``: or warned),
2 bad usage, 3 the doctor itself could not run. ``--json`` prints only JSON on stdout; everything
else (progress, errors) goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from traceml_core.helpformat import ParagraphFormatter

from .model import TORCH_CHECKS, CheckResult, JobInfo, Report, is_ignored
from .progress import Progress
from .thresholds import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:  # the heavy modules (pydantic via the resolver) load after the torch child starts
    from .node import NodeContext, Options
    from .torchprobe import ProbeProcess

EPILOG = """\
Run it where the training will run: in the sbatch script before `srun`, or in an salloc shell.
From there it starts one agent per node (srun --overlap --ntasks-per-node=1) and checks across
the nodes; --local checks only the node it runs on.

Exit codes: 0 passed (warnings allowed), 1 a check failed (--strict: or warned), 2 bad usage,
3 the doctor itself could not run. `traceml slurm doctor --list` shows the check ids for --ignore
(a group name such as `gpu` ignores the whole group).
"""


class UsageError(Exception):
    pass


def build_parser(prog: str = "traceml slurm doctor") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Preflight checks of a Slurm allocation for a TraceML run, "
                                "on every node.", epilog=EPILOG, formatter_class=ParagraphFormatter)
    p.add_argument("script", nargs="?", help="the training script: checked to exist (and compile) on every node")
    p.add_argument("--local", action="store_true", help="check only this node (fast: under 2 s on a CPU node)")
    p.add_argument("--full", action="store_true", help="add the slow checks: an NCCL all-reduce bandwidth sweep on GPUs")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    p.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    p.add_argument("--ignore", metavar="ID,...", help="check ids (or groups) to skip, comma-separated")
    p.add_argument("--timeout", metavar="S", default=str(DEFAULT_TIMEOUT_S),
                   help=f"seconds any one wait may take: agents starting, a node answering, torch importing "
                        f"(default {DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--controller", choices=("auto", "pyslurm", "scontrol"), default="auto",
                   help="how the ctl.* and time.* checks ask the Slurm controller: pyslurm when it imports, else "
                        "scontrol (auto, the default), or only one of them")
    p.add_argument("-v", "--verbose", action="store_true", help="show every node's values, sources, and what runs")
    p.add_argument("--list", action="store_true", help="list the checks (id and title) and exit")
    return p


def parse_options(ns: argparse.Namespace) -> "Options":
    from .node import Options
    from .registry import UnknownCheck, parse_ignore

    try:
        timeout = float(ns.timeout)
    except ValueError:
        raise UsageError(f"--timeout={ns.timeout!r} is not a number of seconds; give e.g. --timeout=30.") from None
    if not timeout > 0:
        raise UsageError(f"--timeout={ns.timeout} must be more than 0 seconds; give e.g. --timeout=30.")
    try:
        ignore = parse_ignore(ns.ignore)
    except UnknownCheck as exc:
        raise UsageError(str(exc)) from None
    if ns.full and ns.local:
        raise UsageError("--full adds cross-node bandwidth tests and --local checks one node only: use one of them.")
    return Options(local=ns.local, full=ns.full, timeout=timeout, script=ns.script, ignore=ignore, verbose=ns.verbose,
                   controller=ns.controller)


def _results(outcomes: Mapping[str, object], specs, host: str, options: "Options") -> list[CheckResult]:  # type: ignore[no-untyped-def]
    out = []
    for spec in specs:
        r = CheckResult(spec.id, spec.title, spec.scope, ignored=is_ignored(spec.id, options.ignore))
        if spec.id in outcomes:
            r.nodes[host] = outcomes[spec.id]  # type: ignore[assignment]
        out.append(r)
    return out


def early_torch_probe(ns: argparse.Namespace, environ: Mapping[str, str]) -> "Optional[ProbeProcess]":
    """With --local, start `import torch` in its child before loading anything else: it is the
    slowest part of the 2 s budget. Only when a torch check will run; killed if usage is bad."""
    if not ns.local:
        return None
    ignore = [p.strip() for p in (ns.ignore or "").split(",") if p.strip()]
    if all(is_ignored(cid, ignore) for cid in TORCH_CHECKS):
        return None
    try:
        timeout = float(ns.timeout)
    except ValueError:
        return None
    if not timeout > 0:
        return None
    from .torchprobe import INFO_ARGS, ProbeProcess

    try:
        return ProbeProcess(INFO_ARGS, timeout, environ)
    except OSError:
        return None


def run_doctor(options: "Options", environ: Mapping[str, str], progress: Progress, *,
               ctx: "Optional[NodeContext]" = None, torch_process: "Optional[ProbeProcess]" = None) -> Report:
    from traceml_core.errors import ConfigError

    from ..context import Context
    from .node import NodeContext
    from .registry import JOB_SPECS, NODE_SPECS, run_checks

    t0 = time.monotonic()
    ctx = ctx or NodeContext(environ, options, progress=progress, torch_process=torch_process)
    host = ctx.node
    kind = ctx.context
    job_nodes = ctx.job_nodes()
    notes: list[str] = []
    tier = "local" if options.local else ("full" if options.full else "default")
    from .coordinator import Coordinator, DoctorCannotRun, cross_skipped

    try:
        if options.local or kind in (Context.NONE, Context.STEP):
            try:
                step_nodes = ctx.facts.step_nodes if kind is Context.STEP else 1
            except ConfigError:
                step_nodes = None  # a malformed SLURM_* value: slurm.context says which
            if not options.local and step_nodes is not None and step_nodes > 1:
                raise UsageError(
                    f"this is one task of a {step_nodes}-node srun step: every node would run its own doctor. Run "
                    f"`traceml slurm doctor` once, from the batch script (before srun) or the salloc shell: it starts one "
                    f"agent per node itself. Or add --local to check each node on its own.")
            outcomes = run_checks(JOB_SPECS + NODE_SPECS, ctx)
            results = _results(outcomes, JOB_SPECS + NODE_SPECS, host, options)
            if not options.local:
                why = ("not inside a Slurm allocation" if kind is Context.NONE else
                       "this srun step has one node; run the doctor from the batch script or salloc shell to check "
                       "across the job's nodes" if len(job_nodes) > 1 else "one node: nothing to compare or reach across")
                results += cross_skipped(why, options, host)
        else:
            job_out: dict[str, object] = {}
            worker = threading.Thread(target=lambda: job_out.update(run_checks(JOB_SPECS, ctx)), daemon=True)
            worker.start()
            coordinator = Coordinator(ctx, progress)
            node_and_cross, notes = coordinator.run(job_nodes)
            with progress.waiting("the controller (scontrol)", 30.0):
                worker.join(timeout=35.0)
            results = _results(job_out, JOB_SPECS, host, options) + node_and_cross
    except DoctorCannotRun as exc:
        job = JobInfo(ctx.job_id, ctx.facts.job_name, job_nodes, kind.value, host, tier)
        return Report(job, [], time.monotonic() - t0, error=str(exc))
    finally:
        ctx.close()
    job = JobInfo(ctx.job_id, ctx.facts.job_name, job_nodes, kind.value, host, tier)
    return Report(job, results, time.monotonic() - t0, notes=notes)


def main(argv: Optional[Sequence[str]] = None, *, prog: str = "traceml slurm doctor") -> int:
    parser = build_parser(prog)
    try:
        ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code or 0)
    if ns.list:
        from .registry import ALL_IDS, TITLES

        sys.stdout.write("".join(f"{cid:<24} {TITLES[cid]}\n" for cid in ALL_IDS))
        return 0
    progress = Progress(verbose=ns.verbose)
    environ = dict(os.environ)  # the process's environment, read once here: the facts are made of it
    early = early_torch_probe(ns, environ)
    try:
        options = parse_options(ns)
        report = run_doctor(options, environ, progress, torch_process=early)
    except UsageError as exc:
        if early is not None:
            early.kill()
        sys.stderr.write(f"traceml slurm doctor: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("traceml slurm doctor: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - the doctor must say what broke, not dump a traceback
        if ns.verbose:
            traceback.print_exc()
        sys.stderr.write(f"traceml slurm doctor: internal error, the doctor could not run: {type(exc).__name__}: {exc}. "
                         f"Please report it (run with -v for the traceback).\n")
        return 3
    report.strict = ns.strict
    if not options.local and not report.error:
        from ..facts import Facts
        from .nodehealth import next_job

        report.next_job = next_job(report, Facts.of(environ))
    from .render import render_json, render_text

    if ns.json:
        render_json(report, sys.stdout)
    else:
        from ..facts import Facts

        render_text(report, sys.stdout, no_color=Facts.of(environ).env.no_color, verbose=ns.verbose)
    if report.error:
        sys.stderr.write(f"traceml slurm doctor: error: {report.error}\n")
    return report.exit_code
