"""The typed model of a generated job, and its resolution from flags, a preset and defaults.

Precedence: flag > preset > default; a few values are derived (the job name from the script, the
workers per node from the GPUs). Every value keeps its source (``flag``, ``preset:<name>``,
``default``, ``derived:<key>``) for ``--print`` and ``--json``. Every refusal is one paragraph that
names the flag, the value and the values that would be accepted.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from traceml_core.errors import ConfigError, show

from .options import BY_KEY, TEMPLATE_OPTIONS, TemplateOption, parse_script
from .presets import Preset
from .slurmtime import TimeLimit, parse_time

#: variables the job sets itself; an --env for them would be silently overridden or break the run
RESERVED_ENV = {
    "TRACEML_TOKEN": "the job exports a fresh random token itself",
    "PYTHONUNBUFFERED": "the job sets it to 1 so output reaches the log as it happens",
}
#: with a smaller margin the launcher's stop (up to 15 s) and the summary may not fit
MIN_COMFORTABLE_MARGIN_S = 60


class TemplateError(ConfigError):
    """A template option is invalid; the message lists the valid values."""


@dataclass(frozen=True)
class JobSpec:
    """Everything a generated job depends on, parsed and checked."""

    script: str
    script_args: tuple[str, ...]
    job_name: str
    nodes: int
    gpus_per_node: int
    gpu_type: Optional[str]
    gpu_request: str
    workers_per_node: int
    layout: str
    cpus_per_task: Optional[int]
    mem: Optional[str]
    partition: Optional[str]
    account: Optional[str]
    qos: Optional[str]
    constraint: Optional[str]
    exclusive: bool
    exclude: Optional[str]
    exclude_bad: bool
    output_pattern: str
    time: Optional[str]
    signal_margin: int
    requeue: Optional[bool]
    setup: tuple[str, ...]
    node_setup: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    nccl_ifname: Optional[str]
    wrapper: bool
    container_image: Optional[str]
    apptainer_image: Optional[str]
    container_mount: tuple[str, ...]
    mode: str
    logs_dir: Optional[str]

    @property
    def time_limit(self) -> Optional[TimeLimit]:
        return parse_time(self.time) if self.time is not None else None

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node


@dataclass(frozen=True)
class ResolvedJob:
    """A :class:`JobSpec` with the source of every value, notes for the user, and how it was asked for."""

    spec: JobSpec
    sources: Mapping[str, str]
    notes: tuple[str, ...] = ()
    preset: Optional[Preset] = None
    #: the arguments after ``traceml slurm template`` that regenerate this job
    command: tuple[str, ...] = ()
    out_dir: Optional[str] = None

    def items(self) -> list[tuple[str, Any, str]]:
        keys = ["script", "script_args"] + [o.key for o in TEMPLATE_OPTIONS]
        return [(k, getattr(self.spec, k), self.sources.get(k, "default")) for k in keys]

    def to_json_values(self) -> dict[str, dict[str, Any]]:
        out = {}
        for key, value, source in self.items():
            if isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[key] = {"value": value, "source": source}
        return out


def _stem_name(script: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(script).stem).strip("._-") or "job"
    return f"traceml-{stem}"[:64]


def _fail(option: TemplateOption, raw: Any, source: str, why: str) -> TemplateError:
    where = "" if source == "flag" else f" (from {source})"
    return TemplateError(f"{option.flag}={show(raw)}{where} {why}.", variable=option.flag)


def resolve_job(given: Mapping[str, Any], preset: Optional[Preset] = None, *, script: Optional[str],
                script_args: Sequence[str] = (), command: Sequence[str] = (),
                out_dir: Optional[str] = None, cwd: Optional[Path] = None) -> ResolvedJob:
    """Merge flags (``given``: key -> raw value, None = not given), a preset and defaults into a job."""
    if not script:
        raise TemplateError("the training script is missing: traceml slurm template [options] SCRIPT [ARGS...], "
                            "for example `traceml slurm template --nodes 2 --gpus-per-node 4 train.py`.",
                            variable="SCRIPT")
    try:
        script = parse_script(script)
    except ValueError as exc:
        raise TemplateError(f"SCRIPT={script!r} {exc}.", variable="SCRIPT") from None

    pre = dict(preset.values) if preset else {}
    pre_src = f"preset:{preset.name}" if preset else ""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {"script": "flag", "script_args": "flag" if script_args else "default"}
    for option in TEMPLATE_OPTIONS:
        value, source = _merge(option, given.get(option.key), pre.get(option.key), pre_src)
        values[option.key] = value
        sources[option.key] = source

    if preset:
        missing = [k for k in preset.requires if values.get(k) in (None, (), False)]
        if missing:
            flags = ", ".join(BY_KEY[k].flag for k in missing)
            raise TemplateError(f"--preset={preset.name} needs {flags}: {preset.description}", variable=flags)

    notes: list[str] = []
    _derive(values, sources, script, notes)
    _cross_check(values, sources, notes)
    _check_setup_syntax(values["setup"], "--setup")
    _check_setup_syntax(values["node_setup"], "--node-setup")
    base = cwd or Path.cwd()
    if not (base / script).exists() and not Path(script).is_absolute():
        notes.append(f"{script} does not exist in {base}; the job runs it relative to the directory you submit from.")

    spec = JobSpec(script=script, script_args=tuple(script_args), **values)
    return ResolvedJob(spec, sources, tuple(notes), preset, tuple(command), out_dir)


def _merge(option: TemplateOption, flag: Any, preset: Any, pre_src: str) -> tuple[Any, str]:
    if option.kind == "list":
        items: list[Any] = []
        srcs = []
        for raw_items, src in ((preset, pre_src), (flag, "flag")):
            if raw_items:
                srcs.append(src)
                for raw in raw_items:
                    try:
                        items.append(option.parse(raw))  # type: ignore[misc]
                    except ValueError as exc:
                        raise _fail(option, raw, src, str(exc)) from None
        if option.key == "env":
            items = _merge_env(items, flag or [], preset or [])
        return tuple(items), ("+".join(srcs) if srcs else "default")
    if option.kind in ("bool", "tristate"):
        if flag is not None:
            return bool(flag), "flag"
        if preset is not None:
            return bool(preset), pre_src
        return option.default, "default"
    for raw, src in ((flag, "flag"), (preset, pre_src)):
        if raw is not None:
            try:
                return option.parse(raw), src  # type: ignore[misc]
            except ValueError as exc:
                raise _fail(option, raw, src, str(exc)) from None
    return option.default, "default"


def _merge_env(items: list[tuple[str, str]], flag_raw: Sequence[str], preset_raw: Sequence[str]) -> list[tuple[str, str]]:
    """Preset variables first; a flag replaces a preset's variable of the same name; no key twice per layer."""
    n_pre = len(preset_raw)
    merged: dict[str, str] = {}
    for layer, part in (("preset", items[:n_pre]), ("flag", items[n_pre:])):
        seen = set()
        for key, val in part:
            if key in seen:
                raise TemplateError(f"--env sets {key} twice ({layer}); give each variable once.", variable="--env")
            seen.add(key)
            if key in RESERVED_ENV:
                raise TemplateError(f"--env {key}=... is not allowed: {RESERVED_ENV[key]}. Remove it.",
                                    variable="--env")
            merged[key] = val
    return list(merged.items())


def _derive(values: dict[str, Any], sources: dict[str, str], script: str, notes: list[str]) -> None:
    if values["job_name"] is None:
        values["job_name"], sources["job_name"] = _stem_name(script), "derived:script"
    gpus = values["gpus_per_node"]
    if gpus > 0:
        given = values["workers_per_node"]
        if given is not None:
            raise TemplateError(
                f"--workers-per-node={given} (from {sources['workers_per_node']}) is for CPU jobs only: with "
                f"--gpus-per-node={gpus} TraceML starts one worker per GPU. Remove --workers-per-node, or use "
                f"--gpus-per-node=0 for a CPU job.", variable="--workers-per-node")
        values["workers_per_node"], sources["workers_per_node"] = gpus, "derived:gpus_per_node"
    else:
        if values["workers_per_node"] is None:
            values["workers_per_node"], sources["workers_per_node"] = 1, "default"
        notes.append(f"no GPUs requested (--gpus-per-node=0): a CPU job with {values['workers_per_node']} worker(s) "
                     f"per node, passed as --nproc-per-node (torch then uses gloo).")
    if values["node_setup"] and not values["wrapper"]:
        if sources["wrapper"] == "flag":
            raise TemplateError("--node-setup lines run in launch.sh, but --no-wrapper was given. Drop --no-wrapper "
                                "(or move the lines to --setup, which runs once before srun).", variable="--no-wrapper")
        values["wrapper"], sources["wrapper"] = True, "derived:node_setup"


def _cross_check(values: dict[str, Any], sources: dict[str, str], notes: list[str]) -> None:
    def src(key: str) -> str:
        return "" if sources[key] == "flag" else f" (from {sources[key]})"

    if values["nodes"] > 1 and values["mode"] != "summary":
        raise TemplateError(
            f"--mode={values['mode']}{src('mode')} is for single-node runs, but this job has --nodes="
            f"{values['nodes']}. Valid for multi-node jobs: summary (the live views need one node).",
            variable="--mode")
    if values["layout"] == "task" and values["mode"] != "summary":
        raise TemplateError(
            f"--mode={values['mode']}{src('mode')} needs one launcher per node, but --layout=task{src('layout')} "
            f"runs one task per GPU. Valid with --layout=task: summary.", variable="--mode")
    if values["container_image"] and values["apptainer_image"]:
        raise TemplateError(
            f"--container-image{src('container_image')} (pyxis) and --apptainer-image{src('apptainer_image')} were "
            f"both given; a job uses one container runtime. Keep one of them.", variable="--apptainer-image")
    if values["container_mount"] and not (values["container_image"] or values["apptainer_image"]):
        raise TemplateError("--container-mount needs a container: add --container-image IMAGE (pyxis) or "
                            "--apptainer-image IMAGE.", variable="--container-mount")
    if values["gpu_type"] and values["gpus_per_node"] == 0:
        raise TemplateError(f"--gpu-type={values['gpu_type']}{src('gpu_type')} needs GPUs: add --gpus-per-node N "
                            f"(N of at least 1), or drop --gpu-type.", variable="--gpu-type")
    if values["nccl_ifname"] and any(k == "NCCL_SOCKET_IFNAME" for k, _ in values["env"]):
        raise TemplateError("NCCL_SOCKET_IFNAME is set by both --nccl-ifname and --env; keep one of them.",
                            variable="--nccl-ifname")

    margin = values["signal_margin"]
    limit = parse_time(values["time"]) if values["time"] is not None else None
    if limit is not None and not limit.unlimited:
        total = (limit.minutes or 0) * 60
        if margin >= total:
            raise TemplateError(
                f"--signal-margin={margin}{src('signal_margin')} is not shorter than the time limit --time="
                f"{values['time']}{src('time')} ({total} s after Slurm rounds it up to whole minutes): the signal "
                f"would come as the job starts. Valid: 0 to {total - 1} seconds, or a longer --time.",
                variable="--signal-margin")
    if margin == 0:
        notes.append("--signal-margin=0: no early signal; at the time limit TraceML has only Slurm's KillWait "
                     "(30 s by default) between SIGTERM and SIGKILL to write its summary.")
    else:
        if margin < MIN_COMFORTABLE_MARGIN_S:
            notes.append(f"--signal-margin={margin} is short: the launcher may take up to 15 s to stop its workers "
                         f"before node 0 writes the summary; {MIN_COMFORTABLE_MARGIN_S} s or more is safer.")
        if limit is None:
            notes.append(f"no --time: the partition's default limit applies, and the step's tasks get SIGTERM "
                         f"{margin} s before it.")
        elif limit.unlimited:
            notes.append("no time limit: the early signal never fires (scancel and preemption still send SIGTERM).")
        else:
            notes.append(f"Slurm sends the step's tasks SIGTERM about {margin} s before the {limit.describe()} limit "
                         f"(up to 60 s earlier: Slurm checks time limits about once a minute).")


def _check_setup_syntax(lines: Sequence[str], flag: str) -> None:
    """Setup lines are shell code: refuse a block bash cannot parse, naming the first line that breaks it."""
    if not lines or shutil.which("bash") is None:
        return
    ok, message = bash_syntax("\n".join(lines) + "\n")
    if ok:
        return
    bad = next((line for line in lines if not bash_syntax(line + "\n")[0]), lines[-1])
    raise TemplateError(f"{flag} {bad!r} is not valid shell: {message}. Each {flag} is one line of bash; "
                        f"quote the values inside it.", variable=flag)


def bash_syntax(text: str) -> tuple[bool, str]:
    """Run ``bash -n`` on ``text``; returns (ok, bash's first error line)."""
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=10)
    err = proc.stderr.strip().splitlines()
    return proc.returncode == 0, (err[0] if err else "")


def as_dict(spec: JobSpec) -> dict[str, Any]:
    return asdict(spec)
