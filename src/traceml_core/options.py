"""The one table of launch options.

The CLI flags, the ``TRACEML_*`` environment variables, ``--print-config`` and the documentation
are all generated from :data:`OPTIONS`, so they cannot drift apart. Flags use torchrun's spelling.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

MODES = ("summary", "cli", "dashboard")
#: what --export can write besides the summary (traceml_core/export.py)
EXPORT_KINDS = ("tensorboard", "jsonl")
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _int(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise ValueError("not a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise ValueError(f"must be {bound}")
        return value

    parse.__name__ = "integer"
    return parse


def _float(lo: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise ValueError("not a number of seconds") from None
        if not value >= lo:
            raise ValueError(f"must be at least {lo}")
        return value

    return parse


def _nonempty(text: str) -> str:
    value = str(text).strip()
    if not value:
        raise ValueError("is empty")
    return value


def _host(text: str) -> str:
    value = _nonempty(text)
    if any(c.isspace() for c in value) or "/" in value:
        raise ValueError("is not a host name or IP address")
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


def _mode(text: str) -> str:
    value = _nonempty(text).lower()
    if value not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return value


def _switch(text: str) -> bool:
    value = _nonempty(text).lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError("must be on or off (or 1/0)")


def _exports(text: str) -> str:
    value = _nonempty(text).lower()
    kinds = [k.strip() for k in value.split(",") if k.strip()]
    if kinds == ["none"]:
        return "none"
    bad = [k for k in kinds if k not in EXPORT_KINDS]
    if bad or not kinds:
        raise ValueError(f"must be none or a comma-separated list of {', '.join(EXPORT_KINDS)} "
                         f"(got {bad[0] if bad else value!r})")
    return ",".join(dict.fromkeys(kinds))


def export_kinds(value: str) -> list[str]:
    """The kinds of a normalised ``export`` value (``[]`` for none)."""
    return [] if value in ("", "none") else value.split(",")


def _cluster(text: str) -> str:
    return _nonempty(text).lower()


@dataclass(frozen=True)
class Option:
    """One launch option: its key, how to parse it, its default and its help."""

    key: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = ""
    #: shown in docs/--help when the default is computed rather than fixed
    default_doc: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return "TRACEML_" + self.key.upper()


OPTIONS: tuple[Option, ...] = (
    Option("nnodes", _int(1), 1, "Number of nodes; one `traceml run` per node.", "N"),
    Option("node_rank", _int(0), 0, "Rank of this node, 0..nnodes-1. Node 0 hosts the aggregator.", "R"),
    Option("nproc_per_node", _int(1), 1, "Workers (one per GPU) that this node starts.", "N"),
    Option("master_addr", _host, "127.0.0.1", "Address of node 0 for the torchrun rendezvous.", "HOST"),
    Option("master_port", _int(1, 65535), 29500, "torchrun rendezvous port on node 0.", "PORT",
           default_doc="29500; under Slurm 61440 + 4 x (SLURM_JOB_ID mod 1024)"),
    Option("run_name", _run_name, None, "Name of the run directory; identical on every node.", "NAME",
           default_doc="<script>-<date>-<time>, or <job name>-<job id> under Slurm"),
    Option("logs_dir", _nonempty, "./logs", "Where node 0 writes <run-name>/final_summary.{json,txt}.", "DIR",
           default_doc="./logs, or $SLURM_SUBMIT_DIR/logs under Slurm"),
    Option("mode", _mode, "summary", "summary (default; the only mode for multi-node), cli or dashboard.", "MODE"),
    Option("aggregator_port", _int(1, 65535), 29765, "TraceML aggregator port on node 0.", "PORT",
           default_doc="29765; under Slurm the master port + 1"),
    Option("aggregator_host", _host, None, "Address other nodes use to reach the aggregator.", "HOST",
           default_doc="the master address"),
    Option("aggregator_bind_host", _bind_host, None, "Interface the aggregator listens on, on node 0.", "IP",
           default_doc="0.0.0.0 for multi-node, 127.0.0.1 for one node"),
    Option("aggregator_wait", _float(0), 60.0,
           "Seconds a node waits for the aggregator (and node 0 for the other nodes) before giving up.", "S"),
    Option("hang_timeout", _float(0), 0.0,
           "Stop the run when a rank that has started stepping and not finished sends no step for "
           "this many seconds (a hang); exit status 124, the summary names the silent ranks. Set it "
           "above your longest pause without steps (evaluation, checkpointing); 0 = off.", "S",
           default_doc="0 (off)"),
    Option("export", _exports, "none",
           "Also write the run's per-step series for other tools, from node 0's aggregator at the "
           "end of the run: tensorboard (event files in <run-dir>/tensorboard; needs the "
           "tensorboard extra) and/or jsonl (<run-dir>/steps.jsonl, a line per step bucket); "
           "comma-separated. Never fails training.", "KINDS"),
    Option("cluster", _cluster, "auto", "Cluster environment to read: auto, none, or a plugin name (slurm).", "NAME"),
    Option("relay", _switch, True,
           "Ranks send to a relay in this node's launcher, which forwards one stream to node 0 "
           "(off: every rank connects to node 0 itself).", "on/off", default_doc="on"),
)

BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}
