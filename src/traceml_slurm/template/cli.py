"""``traceml slurm template``: the parser (generated from the option table) and the command.

Files are written to ``-o DIR`` (default: the current directory) unless only ``--print`` or
``--json`` is asked for. Existing files are never overwritten without ``--force``. ``--json`` puts
only JSON on stdout. Exit status: 0 done, 1 ``--test-only`` refused the job, 2 invalid options or a
job that does not fit the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from traceml_core.helpformat import ParagraphFormatter

from .options import OPTIONS_GROUPS, TEMPLATE_OPTIONS

#: flags that change what is shown, not the job: left out of the regeneration line in the header
PRESENTATION_FLAGS = {"--print": 0, "--json": 0, "--force": 0, "--no-check": 0, "--test-only": 0}

DESCRIPTION = """\
Write a ready sbatch job (and, with --wrapper, a per-node launch.sh) that runs SCRIPT with
`traceml run`, one launcher per node. Options go before SCRIPT; everything after SCRIPT is passed to it.
Precedence: flag > --preset > default. See --print for where each value came from."""

EPILOG = """\
examples:
  traceml slurm template --nodes 2 --gpus-per-node 4 --time 2:00:00 \\
      train.py --epochs 3
  traceml slurm template --preset pyxis --container-image nvcr.io#me/train:1 \\
      --nodes 4 train.py
  traceml slurm template --print --nodes 2 train.py  # print it, with sources
"""


def add_template_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("template", help="write a ready sbatch job for traceml run (one launcher per node)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=ParagraphFormatter)
    out = p.add_argument_group("output")
    out.add_argument("-o", "--out-dir", metavar="DIR", default=None,
                     help="write <job-name>.sbatch (and launch.sh) here [default: . unless --print/--json only]")
    out.add_argument("--preset", metavar="NAME", default=None,
                     help="start from a site preset: a shipped name (generic, pyxis, apptainer) or a .toml path")
    out.add_argument("--print", dest="show", action="store_true",
                     help="print the job and the source of each value (preset/flag/default)")
    out.add_argument("--json", action="store_true", help="print a machine-readable description (only JSON on stdout)")
    out.add_argument("--force", action="store_true", help="overwrite existing files")
    out.add_argument("--no-check", action="store_true", help="do not check the job against the local Slurm")
    out.add_argument("--test-only", action="store_true",
                     help="also run `sbatch --test-only` on the generated job (needs Slurm)")
    groups = {key: p.add_argument_group(title.lower()) for key, title in OPTIONS_GROUPS.items()}
    for o in TEMPLATE_OPTIONS:
        g = groups[o.group]
        # argparse %-formats help texts: escape the % of Slurm's file name patterns (%x-%j.out)
        text = (o.help + ("" if o.kind == "list" else f" [default: {o.describe_default()}]")).replace("%", "%%")
        flags = [o.flag] + ([SBATCH_SHORT[o.key]] if o.key in SBATCH_SHORT else [])
        if o.kind == "value":
            g.add_argument(*flags, dest=o.key, metavar=o.metavar or None, default=None, help=text)
        elif o.kind == "list":
            g.add_argument(o.flag, dest=o.key, metavar=o.metavar or None, action="append", default=None, help=text)
        else:
            g.add_argument(o.flag, dest=o.key, action=argparse.BooleanOptionalAction, default=None, help=text)
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="the training script, relative to the submit directory")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT")
    return p


#: sbatch's short spellings of the options it shares with the template, accepted as aliases
#: (sbatch users type `-p short -N 2 -t 1:00:00`); -o stays --out-dir, as it always was
SBATCH_SHORT = {"partition": "-p", "nodes": "-N", "time": "-t", "account": "-A", "qos": "-q",
                "constraint": "-C", "job_name": "-J", "cpus_per_task": "-c"}


def unknown_option(extra: Sequence[str]) -> str:
    """One paragraph for flags the template does not know: the closest options, and --help."""
    import difflib

    flag = next((a for a in extra if a.startswith("-")), extra[0])
    name = flag.split("=", 1)[0]
    known = ["--" + o.key.replace("_", "-") for o in TEMPLATE_OPTIONS] + list(PRESENTATION_FLAGS) + \
        ["--out-dir", "--preset", "--force", "--no-check", "--test-only"]
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return (f"traceml slurm template: error: {name} is not an option of the template.{hint} "
            f"`traceml slurm template --help` lists them (sbatch's -p, -N, -t, -A, -q, -C, -J and -c are "
            f"accepted; put the training script's own arguments after it).")


def regeneration_args(argv: Sequence[str]) -> list[str]:
    return [a for a in argv if a not in PRESENTATION_FLAGS]


def run_template(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import check, presets
    from .model import TemplateError, bash_syntax, resolve_job
    from .render import build_files

    preset = presets.load(ns.preset) if ns.preset else None
    given = {o.key: getattr(ns, o.key) for o in TEMPLATE_OPTIONS}
    script_args = list(ns.script_args or [])
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    job = resolve_job(given, preset, script=ns.script, script_args=script_args,
                      command=regeneration_args(argv), out_dir=ns.out_dir)
    if job.spec.exclude_bad:
        job = with_bad_nodes(job)
    files = build_files(job)
    for f in files:
        ok, message = bash_syntax(f.content)
        if not ok:  # only reachable through setup lines bash accepts alone but not in context
            raise TemplateError(f"the generated {f.name} does not pass `bash -n`: {message}. Check your --setup / "
                                f"--node-setup lines.", variable="--setup")

    result = check.CheckResult(ran=False, note="--no-check: skipped the checks against the cluster.")
    if not ns.no_check:
        parts, note = check.probe()
        result = check.check_job(job.spec, parts) if parts is not None else check.CheckResult(ran=False, note=note)
    if result.problems:
        raise TemplateError("the job does not fit this Slurm cluster: " + " ".join(result.problems)
                            + " (Pass --no-check to write it anyway, for another cluster.)", variable="--partition")

    write = ns.out_dir is not None or not (ns.show or ns.json)
    out_dir = Path(ns.out_dir or ".")
    written: list[str] = []
    if write:
        written = _write(files, out_dir, force=ns.force)

    tested: Optional[check.SbatchTestOnly] = None
    if ns.test_only:
        if write:
            tested = check.sbatch_test_only(str(out_dir / files[0].name))
        else:
            with tempfile.TemporaryDirectory(prefix="traceml-template-") as tmp:
                _write(files, Path(tmp), force=True)
                tested = check.sbatch_test_only(str(Path(tmp) / files[0].name))

    if ns.json:
        sys.stdout.write(json.dumps(_json(job, files, result, written, tested), indent=2) + "\n")
    else:
        _report(job, files, result, written, tested, show=ns.show)
    return 1 if tested is not None and tested.ran and tested.returncode != 0 else 0


def with_bad_nodes(job: Any) -> Any:
    """``--exclude-bad``: the hosts the user's node store excludes, added to ``--exclude``, with a
    note saying which and why (or that none is bad)."""
    from dataclasses import replace

    from ..facts import Facts
    from ..hostlists import compress_hosts, expand_nodelist
    from ..nodes import record

    facts = Facts.of(os.environ)
    health, notes = record(facts.node_store, facts.cluster_name or None, None)
    bad = [h for h in health if h.exclude]
    if not bad:
        known = sum(1 for h in health if h.jobs)
        note = (f"--exclude-bad: no host is bad enough to exclude ({known} host(s) with recent jobs in "
                f"{facts.node_store})")
        return replace(job, notes=job.notes + tuple(notes) + (note,))
    hosts = [h.host for h in bad] + (expand_nodelist(job.spec.exclude, "--exclude") if job.spec.exclude else [])
    note = "--exclude-bad: " + "; ".join(h.reason or f"{h.host}: {h.why}" for h in bad)
    sources = {**job.sources, "exclude": ("flag+" if job.spec.exclude else "") + "node store"}
    return replace(job, spec=replace(job.spec, exclude=compress_hosts(hosts)), sources=sources,
                   notes=job.notes + tuple(notes) + (note,))


def _write(files: Sequence[Any], out_dir: Path, *, force: bool) -> list[str]:
    from .model import TemplateError

    targets = [out_dir / f.name for f in files]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise TemplateError(f"{', '.join(existing)} already exist(s); pass --force to overwrite, or -o DIR to write "
                            f"elsewhere.", variable="--force")
    out_dir.mkdir(parents=True, exist_ok=True)
    for f, target in zip(files, targets):
        target.write_text(f.content, encoding="utf-8")
        mode = 0o755 if f.executable else 0o644
        os.chmod(target, mode)
    return [str(t) for t in targets]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        if not value:
            return "-"
        return " ; ".join("=".join(v) if isinstance(v, tuple) else str(v) for v in value)
    return str(value)


def _report(job, files, result, written, tested, *, show: bool) -> None:
    out = sys.stdout
    if show:
        rows = [(k, shlex.join(v) if k == "script_args" and v else _fmt(v), s) for k, v, s in job.items()]
        w0 = max(len(r[0]) for r in rows)
        w1 = min(max(len(r[1]) for r in rows), 48)
        out.write(f"{'option':<{w0}}  {'value':<{w1}}  source\n")
        for k, v, s in rows:
            out.write(f"{k:<{w0}}  {v:<{w1}}  {s}\n")
        if job.preset:
            out.write(f"\npreset {job.preset.name}: {job.preset.description}\n")
        for f in files:
            out.write(f"\n----- {f.path} -----\n{f.content}")
        out.write("\n")
    for note in job.notes:
        out.write(f"note: {note}\n")
    out.write(f"slurm: {_check_line(result)}\n")
    if tested is not None:
        if tested.ran:
            out.write(f"sbatch --test-only (exit {tested.returncode}): {tested.output}\n")
        else:
            out.write(f"sbatch --test-only: {tested.note}\n")
    if written:
        out.write(f"wrote {', '.join(written)}\nsubmit with: sbatch {written[0]}\n")


def _check_line(result) -> str:
    if not result.ran:
        return result.note
    if result.note:
        return result.note
    return "checked against this cluster: " + "; ".join(result.passed)


def _json(job, files, result, written, tested) -> dict[str, Any]:
    from traceml_core import __version__

    from .render import regenerate_line, srun_words, traceml_argv

    spec = job.spec
    return {
        "schema_version": 1,
        "traceml_version": __version__,
        "preset": None if job.preset is None else {"name": job.preset.name, "description": job.preset.description},
        "job": job.to_json_values(),
        "derived": {"world_size": spec.world_size,
                    "time_limit_minutes": None if spec.time_limit is None else spec.time_limit.minutes,
                    "srun": " ".join(srun_words(spec)), "traceml_run": traceml_argv(spec)},
        "regenerate": regenerate_line(job),
        "files": [{"name": f.name, "path": f.path, "executable": f.executable, "content": f.content} for f in files],
        "written": written,
        "notes": list(job.notes),
        "slurm": result.to_json(),
        "test_only": None if tested is None else tested.to_json(),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Stand-alone entry (``python -m traceml_slurm.template.cli``), same as ``traceml slurm template``."""
    from traceml_core.errors import TraceMLError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="traceml slurm")
    sub = parser.add_subparsers(dest="command")
    add_template_parser(sub)
    ns = parser.parse_args(["template", *argv])
    try:
        return run_template(ns, argv)
    except TraceMLError as exc:
        sys.stderr.write(f"traceml: error: {exc}\n")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
