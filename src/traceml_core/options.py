"""The one table of launch options.

The CLI flags, the ``TRACEML_*`` environment variables, ``--print-config``, the reading and
checking of both (:func:`read_given`: each option's pydantic type, :meth:`Option.annotation`) and
the documentation are all generated from :data:`OPTIONS`, so they cannot drift apart: core's rows
(:data:`CORE_OPTIONS`), then the rows each registered output brings for its settings
(exporters/output.py: ``--wandb-project``, ``--mlflow-tracking-uri``, ...). Flags use
torchrun's spelling. Numbers are bounded by :mod:`.limits`; strings by a check function.

Nothing here imports pydantic at import time: ``traceml --help`` builds its parser from this
table alone, and a value's validator is built only when that option is actually given.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Mapping

from . import limits
from .errors import ConfigError, show
from .optionrow import Option, nonempty as _nonempty, path as _path

MODES = ("summary", "cli", "dashboard")
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _host(text: str) -> str:
    value = _nonempty(text)
    if any(c.isspace() for c in value) or "/" in value or "\0" in value:
        raise ValueError("is not a host name or IP address")
    if len(value) > limits.HOST_CHARS.hi:
        raise ValueError(f"is not a host name or IP address (longer than {limits.HOST_CHARS.hi} characters)")
    return value


def _bind_host(text: str) -> str:
    value = _host(text)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("must be an IP address of an interface on node 0 (for example 0.0.0.0)") from None
    return value


def _run_name(text: str) -> str:
    value = _nonempty(text)
    if not RUN_NAME_RE.match(value):
        raise ValueError("may only contain letters, digits, '_', '.' and '-' (at most 128 characters)")
    if value in (".", ".."):
        raise ValueError("is not a valid directory name")
    return value


def _ip(text: str) -> str:
    value = _nonempty(text)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("must be an IP address of this node (for example 127.0.0.1)") from None
    return value


def _mode(text: str) -> str:
    value = _nonempty(text).lower()
    if value not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return value


LAYOUTS = ("auto", "node", "task")


def _layout(text: str) -> str:
    value = _nonempty(text).lower()
    if value not in LAYOUTS:
        raise ValueError(f"must be one of {', '.join(LAYOUTS)}")
    return value


def export_choices() -> tuple[str, ...]:
    """What --export can write besides the summary: the registered outputs (exporters/output.py)."""
    from .exporters.output import registry

    return registry().kinds


def _exports(text: str) -> str:
    value = _nonempty(text).lower()
    kinds = [k.strip() for k in value.split(",") if k.strip()]
    if kinds == ["none"]:
        return "none"
    known = export_choices()
    bad = [k for k in kinds if k not in known]
    if bad or not kinds:
        from .exporters.output import missing_note

        why = missing_note()
        raise ValueError(f"must be none or a comma-separated list of {', '.join(known)} "
                         f"(got {bad[0] if bad else value!r})" + (f"; {why}" if why else ""))
    return ",".join(dict.fromkeys(kinds))


def export_kinds(value: str) -> list[str]:
    """The kinds of a normalised ``export`` value (``[]`` for none)."""
    return [] if value in ("", "none") else value.split(",")


def _hang_after(text: str) -> str:
    """``auto`` (a threshold from the run's own step time), ``off``, or seconds."""
    value = _nonempty(text).lower()
    if value in ("auto", "off"):
        return value
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError("must be auto, off, or a number of seconds") from None
    if not 1.0 <= seconds <= limits.HANG_S.hi:
        raise ValueError(f"must be at least 1 second and at most {limits.HANG_S.hi:g} ({limits.HANG_S.why})")
    return f"{seconds:g}"


#: megabytes each node sends per transfer of the link probe unless --link-probe says otherwise
LINK_PROBE_MB = 32


def _link_probe(text: str) -> str:
    """``off``, or megabytes per transfer (``on`` = the default size)."""
    value = _nonempty(text).lower()
    if value in ("off", "0", "no", "false"):
        return "off"
    if value in ("on", "yes", "true"):
        return str(LINK_PROBE_MB)
    try:
        mb = int(value)
    except ValueError:
        raise ValueError("must be off, on, or megabytes per transfer (a whole number)") from None
    if not 1 <= mb <= 1024:
        raise ValueError("must be between 1 and 1024 megabytes (each node sends it to two peers)")
    return str(mb)


def link_probe_bytes(value: str) -> int:
    """Bytes per transfer of a normalised ``link_probe`` value (0 = off)."""
    return 0 if value == "off" else int(value) * 1000 * 1000


def _fan_in(text: str) -> str:
    """``auto``, ``off``, or nodes per group relay (a whole number from 2)."""
    value = _nonempty(text).lower()
    if value in ("auto", "off"):
        return value
    if value in ("0", "no", "false"):
        return "off"
    try:
        n = int(value)
    except ValueError:
        raise ValueError("must be auto, off, or nodes per group relay (a whole number)") from None
    if not 2 <= n <= limits.NODES.hi:
        raise ValueError(f"must be between 2 and {limits.NODES.hi} nodes per group relay")
    return str(n)


def _cluster(text: str) -> str:
    return _nonempty(text).lower()




CORE_OPTIONS: tuple[Option, ...] = (
    Option("nnodes", limits.NODES, 1, "Number of nodes; one `traceml run` per node.", "N"),
    Option("node_rank", limits.NODE_RANK, 0, "Rank of this node, 0..nnodes-1. Node 0 hosts the aggregator.", "R"),
    Option("nproc_per_node", limits.PROCS_PER_NODE, 1, "Workers (one per GPU) that this node starts.", "N"),
    Option("master_addr", _host, "127.0.0.1", "Address of node 0 for the torchrun rendezvous.", "HOST"),
    Option("master_port", limits.PORT, 29500, "torchrun rendezvous port on node 0.", "PORT",
           default_doc="a free port on one node outside a cluster; under Slurm 61440 + 4 x "
                       "(SLURM_JOB_ID mod 1024); else 29500"),
    Option("run_name", _run_name, None, "Name of the run directory; identical on every node.", "NAME",
           default_doc="<script>-<date>-<time>, or <job name>-<job id> under Slurm"),
    Option("logs_dir", _path, "./logs", "Where node 0 writes <run-name>/final_summary.{json,txt,html}.", "DIR",
           default_doc="./logs, or $SLURM_SUBMIT_DIR/logs under Slurm"),
    Option("mode", _mode, "summary", "summary (default; the only mode for multi-node), cli or dashboard.", "MODE"),
    Option("aggregator_port", limits.PORT, 29765, "TraceML aggregator port on node 0.", "PORT",
           default_doc="a free port on one node outside a cluster; under Slurm the master "
                       "port + 1; else 29765"),
    Option("aggregator_host", _host, None, "Address other nodes use to reach the aggregator.", "HOST",
           default_doc="the master address"),
    Option("aggregator_bind_host", _bind_host, None, "Interface the aggregator listens on, on node 0.", "IP",
           default_doc="0.0.0.0 for multi-node, 127.0.0.1 for one node"),
    Option("aggregator_wait", limits.WAIT_S, 60.0,
           "Seconds a node waits for the aggregator (and node 0 for the other nodes) before giving up.", "S"),
    Option("hang_timeout", limits.HANG_S, 0.0,
           "Stop the run when a rank that has started stepping and not finished sends no step for "
           "this many seconds (a hang); exit status 124, the summary names the silent ranks. Set it "
           "above your longest pause without steps (evaluation, checkpointing); 0 = off.", "S",
           default_doc="0 (off)"),
    Option("hang_report_after", _hang_after, "auto",
           "Hang detection. Once no rank has completed a step for 5 s, node 0 looks at where every "
           "rank is and whether it makes progress, and names a hang (every rank's stack, which rank "
           "the others wait for) in the log and the summary when the ranks the others wait for "
           "make none for 10 s; a rank that works (a long save or evaluation) is never a hang. "
           "This value is the backstop for when the ranks' state cannot decide: auto = max(60 s, "
           "20 x the run's median step); off = no hang detection. The run goes on "
           "(--hang-timeout decides whether to stop it).", "S|auto|off",
           default_doc="auto"),
    Option("export", _exports, "none",
           "Also send the run's per-step series to other tools, from node 0's aggregator; "
           "comma-separated. During the run (every --export-interval): wandb, mlflow, prometheus "
           "(node_exporter textfiles); at the end: tensorboard (<run-dir>/tensorboard), jsonl "
           "(<run-dir>/steps.jsonl); or an output another package registers. Each needs its "
           "extra (the wandb, mlflow, prometheus or tensorboard extra of traceml-slurm); a slow, "
           "failing or hung one never slows training or costs the summary (docs/exports.md).",
           "KINDS"),
    Option("export_interval", limits.EXPORT_INTERVAL_S, 10.0,
           "Seconds between live exports (wandb, mlflow, prometheus); longer on large runs, where "
           "building one takes longer (at most 5 % of the time).", "S"),
    Option("link_probe", _link_probe, str(LINK_PROBE_MB),
           "Multi-node: before training, node 0 measures the TCP bandwidth between the nodes' "
           "launchers (each node sends up to this many MB, for at most 1 s, to each of two other "
           "nodes: 0.1-5 s at the start, never more than the node-join window + 30 s; never fails "
           "the run) and names a node whose link is much slower than the others'; off = skip it.",
           "MB|off", default_doc=f"{LINK_PROBE_MB} (MB per transfer)"),
    Option("relay_fan_in", _fan_in, "auto",
           "Multi-node: nodes per group relay. Each node's relay reports to the relay of its "
           "group's first node, which merges the windows of its group's ranks and reports to node "
           "0, so node 0 serves about sqrt(nodes) links and stays under one core at tens of "
           "thousands of ranks; auto = groups of about sqrt(nodes) from 512 nodes on, else none; "
           "off = every node reports to node 0. The same on every node.", "N|auto|off",
           default_doc="auto"),
    Option("cluster", _cluster, "auto", "Cluster environment to read: auto, none, or a plugin name (slurm).", "NAME"),
    Option("layout", _layout, "auto",
           "How ranks start: node = one `traceml run` per node starts a worker per GPU with torchrun; "
           "task = every task of the job step is one rank (one srun task per GPU, Lightning's and "
           "submitit's layout; no torchrun); auto = the cluster plugin decides (Slurm: task when the srun "
           "step runs more than one task per node), else node.", "MODE", default_doc="auto"),
    Option("auto_steps", bool, True,
           "Find steps in a script that does not call trace_step: from Lightning's, the Hugging "
           "Face Trainer's or Accelerate's own hooks, else one step per optimizer step (off: only "
           "trace_step records steps; every rank still joins the run).", "on/off", default_doc="on"),
    # the live views (--mode cli|dashboard, node 0 only)
    Option("status_interval", limits.STATUS_INTERVAL_S, 10.0,
           "--mode cli when stdout is not a terminal: seconds between status lines.", "S"),
    Option("live_refresh", limits.REFRESH_S, 0.5, "--mode cli on a terminal: seconds between redraws.", "S"),
    Option("dashboard_host", _ip, "127.0.0.1",
           "--mode dashboard: address the page listens on (anything but loopback leaves the URL's token "
           "as the only protection).", "IP"),
    Option("dashboard_port", limits.PORT_OR_AUTO, 0,
           "--mode dashboard: its port; 0 = the aggregator port + 1 when free, else any free port (the "
           "launcher prints the URL).", "PORT", default_doc="0 (automatic)"),
)

def _output_rows() -> tuple[Option, ...]:
    from .exporters.output import option_rows

    return option_rows()


#: the outputs' settings (each output's option rows: exporters/output.py), after core's
OUTPUT_OPTIONS: tuple[Option, ...] = _output_rows()
#: every launch option: the one table the flags, variables, --print-config and docs come from
OPTIONS: tuple[Option, ...] = CORE_OPTIONS + OUTPUT_OPTIONS
OUTPUT_KEYS = frozenset(o.key for o in OUTPUT_OPTIONS)
BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}


def read_given(given: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """The options set by a flag (``given``: raw values by key) or a ``TRACEML_<KEY>`` variable,
    each parsed by :meth:`Option.parse`: key -> (value, source), source ``cli`` or
    ``env:TRACEML_<KEY>``. A flag shadows its variable, which is then not read at all (even a bad
    one); a blank variable counts as unset. A bad value is one ConfigError naming the flag or
    variable, the value and the fix.

    Only what was given is parsed, and each option's validator is built on first use: a launch
    with nothing set never imports pydantic (``--print-config`` stays fast)."""
    out: dict[str, tuple[Any, str]] = {}
    for o in OPTIONS:
        if given.get(o.key) is not None:
            raw, name, source = given[o.key], o.flag, "cli"
        else:
            raw, name = environ.get(o.env), o.env
            if (not isinstance(raw, str) or raw == "") and o.also_env:  # the library's own variable
                raw, name = environ.get(o.also_env), o.also_env
            if not isinstance(raw, str) or raw == "":
                continue
            source = f"env:{name}"
        try:
            value = o.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{name}={show(raw)} {exc}. Fix the value, or unset it to use the "
                              f"default ({o.describe_default()}).", variable=name) from None
        out[o.key] = (value, source)
    return out
