"""The table of `traceml slurm template` options.

The command-line flags, the preset files' keys, ``--print``/``--json`` and the documentation page are
all generated from :data:`TEMPLATE_OPTIONS`, so they cannot drift apart. Every parser raises
``ValueError`` with a message that lists the values it accepts; the caller adds the flag and value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from traceml_core import limits
from traceml_core.options import MODES

from ..timelimit import MARGIN_S
from .slurmtime import FORMATS_TEXT, parse_time

GPU_REQUESTS = ("gres", "gpus-per-node")
#: how ranks start (docs/slurm.md, "Two layouts"): one launcher per node, or one srun task per GPU
LAYOUTS = ("node", "task")
#: the `%` letters Slurm expands in --output file names (man sbatch, "filename pattern")
OUTPUT_LETTERS = "AajJNnstux"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_NAMES = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEM = re.compile(r"^[0-9]+[KMGTkmgt]?$")
_IFNAME = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9_.\-]+(\[[0-9,\-]+\][A-Za-z0-9_.\-]*)?(,[A-Za-z0-9_.\-]+(\[[0-9,\-]+\][A-Za-z0-9_.\-]*)?)*$")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.:&|,\[\]*()=-]+$")
_OUTPUT_ESCAPE = re.compile(r"%(%|[0-9]*[A-Za-z]?)")


def _single_line(text: str) -> str:
    value = str(text)
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError("contains a line break; give one line per value (repeat the flag for more)")
    return value


def _nonempty(text: str) -> str:
    value = _single_line(text).strip()
    if not value:
        raise ValueError("is empty")
    return value


def _int(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        raw = str(text).strip()
        try:
            if len(raw) > 32:
                raise ValueError
            value = int(raw)
        except ValueError:
            raise ValueError(f"is not a whole number; use a whole number {_range(lo, hi)}") from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(f"is out of range; use a whole number {_range(lo, hi)}")
        return value

    return parse


def _range(lo: int, hi: Optional[int]) -> str:
    return f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = _nonempty(text).lower()
        if value not in choices:
            raise ValueError(f"is not one of the valid values: {', '.join(choices)}")
        return value

    return parse


def _name(what: str, allow_list: bool = False) -> Callable[[str], str]:
    pattern = _NAMES if allow_list else _NAME
    extra = " (a comma-separated list is allowed)" if allow_list else ""

    def parse(text: str) -> str:
        value = _nonempty(text)
        if not pattern.match(value):
            raise ValueError(f"is not a valid {what}; use letters, digits, '_', '.' and '-'{extra}")
        return value

    return parse


def parse_mem(text: str) -> str:
    value = _nonempty(text)
    if not _MEM.match(value):
        raise ValueError("is not a Slurm memory size; use a whole number with an optional unit K, M, G or T "
                         "(megabytes without a unit), for example 64G; 0 requests all the memory of each node")
    return value.upper()


def parse_time_text(text: str) -> str:
    value = _nonempty(text)
    parse_time(value)  # raises with the accepted formats
    return value


def parse_constraint(text: str) -> str:
    value = _nonempty(text)
    if not _CONSTRAINT.match(value):
        raise ValueError("is not a Slurm constraint; use feature names (letters, digits, '_', '.', ':', '-', '=') "
                         "joined by & (and), | (or), ',' , [ ] (matching OR), ( ) and *N (count)")
    return value


def parse_hostlist(text: str) -> str:
    value = _nonempty(text)
    if not _HOSTLIST.match(value):
        raise ValueError("is not a Slurm host list; use host names separated by commas, with ranges in "
                         "brackets, for example node3,node[7-9]")
    return value


def parse_output(text: str) -> str:
    value = _nonempty(text)
    for m in _OUTPUT_ESCAPE.finditer(value):
        body = m.group(1)
        if body == "%" or (body and body[-1] in OUTPUT_LETTERS):
            continue
        letters = ", ".join("%" + c for c in OUTPUT_LETTERS)
        raise ValueError(f"uses %{body!s} which Slurm does not expand; valid: %%, {letters} "
                         f"(optionally with a zero-padding width, e.g. %4j)")
    return value


def parse_env(text: str) -> tuple[str, str]:
    value = _single_line(text)
    key, sep, val = value.partition("=")
    if not sep or not _ENV_KEY.match(key):
        raise ValueError("is not KEY=VALUE; KEY is letters, digits and '_' (not starting with a digit), "
                         "for example NCCL_DEBUG=INFO")
    return key, val


def parse_ifname(text: str) -> str:
    value = _nonempty(text)
    if not _IFNAME.match(value):
        raise ValueError("is not an interface list for NCCL_SOCKET_IFNAME; use names such as eth0 or ib0, a "
                         "prefix such as eth, a comma-separated list, '^' to exclude (^docker0,lo) or '=' for "
                         "an exact match")
    return value


def parse_mount(text: str) -> str:
    value = _nonempty(text)
    if "," in value or any(c.isspace() for c in value):
        raise ValueError("is not one mount; use SRC[:DST[:FLAGS]] without commas or spaces, and repeat the flag "
                         "for more mounts")
    return value


def parse_setup_line(text: str) -> str:
    value = _single_line(text)
    if not value.strip():
        raise ValueError("is empty")
    return value


def parse_script(text: str) -> str:
    value = _nonempty(text)
    if value.startswith("-"):
        raise ValueError("starts with '-'; give the training script's path (for example train.py) after the options")
    return value


@dataclass(frozen=True)
class TemplateOption:
    """One template option: its key, its kind, how to parse one value, its default and its help.

    ``kind`` is ``value`` (one value), ``list`` (repeatable; ``parse`` reads one item), ``bool``
    (``--x``/``--no-x``) or ``tristate`` (``--x``/``--no-x``/absent: the site's default).
    """

    key: str
    kind: str
    parse: Optional[Callable[[str], Any]]
    default: Any
    help: str
    metavar: str = ""
    group: str = "job"
    default_doc: str = ""
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def describe_default(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.default is None or self.default == ():
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        return str(self.default)


OPTIONS_GROUPS = {
    "job": "Resources",
    "time": "Time limit and signals",
    "env": "Environment and setup",
    "container": "Containers",
    "run": "The training run",
}

TEMPLATE_OPTIONS: tuple[TemplateOption, ...] = (
    TemplateOption("job_name", "value", _name("job name"), None, "Slurm job name; also names the .sbatch file "
                   "and (with the job id) the run.", "NAME", default_doc="traceml-<script name>"),
    TemplateOption("nodes", "value", _int(1, limits.NODES.hi), 1, "Number of nodes; one `traceml run` launcher per node.", "N"),
    TemplateOption("gpus_per_node", "value", _int(0, limits.GPUS_PER_NODE.hi), 0, "GPUs on each node: one worker per GPU. 0: a CPU job.",
                   "N"),
    TemplateOption("gpu_type", "value", _name("GPU type"), None,
                   "GPU type for the request (as in `sinfo -o %G`), e.g. a100.", "TYPE"),
    TemplateOption("gpu_request", "value", _choice(GPU_REQUESTS), "gres",
                   "How to ask for GPUs: gres (--gres=gpu:N) or gpus-per-node (--gpus-per-node=N).", "FORM",
                   choices=GPU_REQUESTS),
    TemplateOption("workers_per_node", "value", _int(1, limits.PROCS_PER_NODE.hi), None, "CPU jobs only: workers per node.", "N",
                   default_doc="the GPUs per node, or 1 in a CPU job"),
    TemplateOption("cpus_per_task", "value", _int(1, limits.CPUS_PER_TASK.hi), None, "CPU cores for each node's "
                   "launcher and its workers (--layout=task: for each rank's task).", "N"),
    TemplateOption("layout", "value", _choice(LAYOUTS), "node",
                   "node: one `traceml run` per node starts a worker per GPU (torchrun); task: one srun task "
                   "per GPU, each task one rank (Lightning's and submitit's layout).", "LAYOUT", choices=LAYOUTS),
    TemplateOption("mem", "value", parse_mem, None, "Memory per node (sbatch --mem), e.g. 64G; 0 = all.", "SIZE"),
    TemplateOption("partition", "value", _name("partition name", allow_list=True), None, "Partition.", "NAME"),
    TemplateOption("account", "value", _name("account name"), None, "Account to charge.", "NAME"),
    TemplateOption("qos", "value", _name("QOS name"), None, "Quality of service.", "NAME"),
    TemplateOption("constraint", "value", parse_constraint, None, "Node features (sbatch --constraint).", "EXPR"),
    TemplateOption("exclusive", "bool", None, False, "Whole nodes only (sbatch --exclusive)."),
    TemplateOption("exclude", "value", parse_hostlist, None, "Hosts the job must not run on (sbatch --exclude), "
                   "e.g. node3,node[7-9].", "HOSTS"),
    TemplateOption("exclude_bad", "bool", None, False, "Also exclude the hosts your node store finds bad "
                   "(`traceml slurm nodes`: worse than their peers in most of their recent jobs)."),
    TemplateOption("output_pattern", "value", parse_output, "%x-%j.out",
                   "Slurm's stdout/stderr file name (sbatch --output).", "PATTERN"),
    TemplateOption("time", "value", parse_time_text, None, f"Time limit: {FORMATS_TEXT}.", "TIME", group="time",
                   default_doc="the partition's default"),
    TemplateOption("signal_margin", "value", _int(0, 65535), MARGIN_S,
                   "Seconds before the time limit at which the step's tasks get SIGTERM (sbatch "
                   "--signal=TERM@S), so TraceML can write its summary. 0: no early signal.", "S", group="time"),
    TemplateOption("requeue", "tristate", None, None, "Allow (--requeue) or forbid (--no-requeue) requeueing; "
                   "a requeued run keeps its run directory, one attempt after another.", group="time", default_doc="the site's default"),
    TemplateOption("setup", "list", parse_setup_line, (), "Shell line run once in the batch shell before srun "
                   "(module load, source venv/bin/activate). Repeatable.", "LINE", group="env"),
    TemplateOption("node_setup", "list", parse_setup_line, (), "Shell line run on every node inside the step, in "
                   "launch.sh (implies --wrapper). Repeatable.", "LINE", group="env"),
    TemplateOption("env", "list", parse_env, (), "Environment variable for every node. Repeatable.", "KEY=VALUE",
                   group="env"),
    TemplateOption("nccl_ifname", "value", parse_ifname, None, "Network interface for NCCL "
                   "(NCCL_SOCKET_IFNAME).", "IFACE", group="env"),
    TemplateOption("wrapper", "bool", None, False, "Also write launch.sh, run by srun once per node, for per-node "
                   "setup.", group="env"),
    TemplateOption("container_image", "value", _nonempty, None, "Run the step in this image with pyxis "
                   "(srun --container-image).", "IMAGE", group="container"),
    TemplateOption("apptainer_image", "value", _nonempty, None, "Run `traceml run` in this image with "
                   "`apptainer exec --nv`.", "IMAGE", group="container"),
    TemplateOption("container_mount", "list", parse_mount, (), "Extra mount SRC[:DST[:FLAGS]] for the container "
                   "(pyxis --container-mounts, apptainer --bind). Repeatable.", "SPEC", group="container"),
    TemplateOption("mode", "value", _choice(MODES), "summary", "TraceML mode; multi-node runs use summary.",
                   "MODE", group="run", choices=MODES),
    TemplateOption("logs_dir", "value", _nonempty, None, "Where node 0 writes <run-name>/final_summary.{json,txt,html}.",
                   "DIR", group="run", default_doc="$SLURM_SUBMIT_DIR/logs"),
)

BY_KEY: dict[str, TemplateOption] = {o.key: o for o in TEMPLATE_OPTIONS}
