"""The command line of ``traceml run``: TraceML's flags, torchrun's spellings, the script and its arguments.

The grammar is torchrun's: ``traceml run [flags] SCRIPT [script args]``. Flags may be spelled
with ``-`` or ``_`` (``--nproc_per_node``), as torchrun allows, and take their value as
``--flag=V`` or ``--flag V`` (short flags also ``-rV``).

Before the script, every flag is checked: each of torchrun's own flags is honoured (an alias of
one of ours, passed on to torchrun, or translated) or refused with the reason, and a flag that is
neither ours nor torchrun's is refused, with "did you mean" when it is close to one of ours.

After the script come the script's arguments. TraceML's own flags there are still TraceML's (as
they always were, so the seed guide's ``traceml run train.py --nproc-per-node=2`` keeps working),
but never silently: each is announced once on stderr (:meth:`RunArgs.announcements`), and a value
refused there says it was read as TraceML's and how to pass it on (:meth:`RunArgs.hint_for`),
because torchrun users expect everything after the script to reach the script. torchrun's
launch-only flags there (``--standalone``, ``--rdzv-*``, ``--max-restarts``, ``--no-python``) are
refused, since torchrun would hand them to the script and the launch would silently go without
them; everything else is the script's. A ``--`` after the script hands everything after it to the
script verbatim (generated jobs write ``SCRIPT -- ARGS``).

Nothing here imports torch (``--help`` and ``--print-config`` stay fast).
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from .errors import TraceMLError
from .options import BY_KEY, OPTIONS

#: torchrun's own flags and what ``traceml run`` does with each (the docs' table is generated from
#: this; a test checks it covers every flag of the installed torch.distributed.run)
TORCHRUN_TREATMENT: dict[str, str] = {
    "nnodes": "TraceML's --nnodes; `N:N` is N; an elastic range `MIN:MAX` is refused (static rendezvous)",
    "nproc-per-node": "TraceML's --nproc-per-node; `cpu` is the CPU count; `gpu`/`auto`/`xpu` are refused "
                      "(pass the number; under Slurm it comes from the step's GPUs)",
    "node-rank": "TraceML's --node-rank",
    "master-addr": "TraceML's --master-addr",
    "master-port": "TraceML's --master-port",
    "standalone": "one node on free local ports (master and aggregator), unless given",
    "rdzv-backend": "`static` accepted; `c10d` accepted when every node's rank is known (one node, "
                    "--node-rank, or Slurm) and run as static rendezvous; others refused",
    "rdzv-endpoint": "HOST[:PORT] is the master address (and port) unless those are given",
    "rdzv-id": "accepted; no effect with static rendezvous",
    "rdzv-conf": "refused: rendezvous settings apply to elastic rendezvous",
    "max-restarts": "0 accepted; more refused (a restarted worker would count its steps twice; "
                    "use the job's requeue)",
    "module": "`-m MODULE`: the script is a module (resolved in the workers' Python by the pre-flight)",
    "no-python": "the script is a program, not a Python file; passed on to torchrun",
    "run-path": "passed on to torchrun",
    "monitor-interval": "passed on to torchrun",
    "start-method": "passed on to torchrun",
    "event-log-handler": "passed on to torchrun",
    "role": "passed on to torchrun",
    "log-dir": "passed on to torchrun (the workers' own log files; TraceML's run directory is --logs-dir)",
    "redirects": "`-r`: passed on to torchrun",
    "tee": "`-t`: passed on to torchrun",
    "local-ranks-filter": "passed on to torchrun",
    "duplicate-stdout-filters": "passed on to torchrun",
    "duplicate-stderr-filters": "passed on to torchrun",
    "local-addr": "passed on to torchrun",
    "logs-specs": "passed on to torchrun",
    "numa-binding": "passed on to torchrun",
    "signals-to-handle": "passed on to torchrun",
    "shutdown-timeout": "passed on to torchrun",
    "virtual-local-rank": "passed on to torchrun",
}
#: what torchrun does with these: pass them on unchanged (they shape only torchrun's own behaviour
#: or the workers' output, never what TraceML needs to know)
PASS_VALUE = ("monitor-interval", "start-method", "event-log-handler", "role", "log-dir", "redirects",
              "tee", "local-ranks-filter", "duplicate-stdout-filters", "duplicate-stderr-filters",
              "local-addr", "logs-specs", "numa-binding", "signals-to-handle", "shutdown-timeout")
PASS_SWITCH = ("virtual-local-rank", "run-path")
SHORT = {"-r": "redirects", "-t": "tee", "-m": "module"}
#: torchrun flags TraceML translates or checks itself
SPECIAL_VALUE = ("rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts")
SPECIAL_SWITCH = ("standalone", "module", "no-python")
TORCHRUN_FLAGS = PASS_VALUE + PASS_SWITCH + SPECIAL_VALUE + SPECIAL_SWITCH
#: torchrun flags that shape the launch; written after the script (where torchrun would give them
#: to the script) they are refused rather than silently lost
LAUNCH_ONLY_TORCHRUN = ("standalone", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                        "max-restarts", "no-python")
OUR_SWITCHES = ("print-config", "json", "help")
#: torchrun's symbolic worker counts
SYMBOLIC_NPROC = ("auto", "cpu", "gpu", "xpu")


class UsageError(TraceMLError):
    """A command line ``traceml run`` cannot act on; the message says why and how to fix it."""

    exit_code = 2


@dataclass
class RunArgs:
    """The parsed command line. ``cli`` holds raw option values by key (as the resolver takes
    them); ``torchrun`` the flags passed on to torchrun unchanged."""

    cli: dict[str, str] = field(default_factory=dict)
    script: Optional[str] = None
    script_args: list[str] = field(default_factory=list)
    module: bool = False
    no_python: bool = False
    torchrun: list[str] = field(default_factory=list)
    #: lines for the launcher's log: flags accepted with an explanation
    notes: list[str] = field(default_factory=list)
    #: torchrun's --rdzv-backend, checked once the node rank's source is known (see check_rdzv)
    rdzv_backend: Optional[str] = None
    standalone: bool = False
    print_config: bool = False
    json: bool = False
    help: bool = False
    #: TraceML's flags read after the script: key (option key, or print-config/json) -> the words
    #: as written (``--run-name myexp``); announced, never taken silently
    after_script: dict[str, str] = field(default_factory=dict)

    def announcements(self) -> list[str]:
        """One line per TraceML flag read after the script (stderr, before anything starts)."""
        return [f"{words} after {self.script} was read as TraceML's; {self._pass_on(words)}"
                for words in self.after_script.values()]

    def hint_for(self, variable: Optional[str]) -> str:
        """The sentence to add to an error about ``variable`` (a flag, option key or TRACEML_*
        variable) when that value was read after the script, else ``""``."""
        if not variable:
            return ""
        for key, words in self.after_script.items():
            option = BY_KEY.get(key)
            names = {key, "--" + key.replace("_", "-")}
            if option is not None:
                names.add(option.env)
            if variable in names:
                return f" ({words} came after {self.script} and was read as TraceML's; if " \
                       f"{self.script} takes it itself, {self._pass_on(words)}.)"
        return ""

    def _pass_on(self, words: str) -> str:
        return (f"to pass it to {self.script} instead, put `--` before the script's arguments: "
                f"traceml run [flags] {self.script} -- {words} ...")

    def launcher_argv(self) -> list[str]:
        """What torchrun gets between its own flags and the script."""
        out = list(self.torchrun)
        if self.module:
            out.append("--module")
        if self.no_python:
            out.append("--no-python")
        return out


def _our_keys() -> dict[str, str]:
    return {o.key.replace("_", "-"): o.key for o in OPTIONS}


def _canonical(flag: str) -> str:
    """``--nproc_per_node`` -> ``nproc-per-node``; short flags map to their long name."""
    if flag in SHORT:
        return SHORT[flag]
    return flag.lstrip("-").replace("_", "-")


def known_flags() -> list[str]:
    """Every long flag ``traceml run`` accepts, in the dash spelling (for help and suggestions)."""
    return sorted(set(_our_keys()) | set(TORCHRUN_FLAGS) | set(OUR_SWITCHES))


def _suggest(flag: str) -> str:
    """" Did you mean --x?" for the closest known flags (ours first; two when about as close)."""
    name = _canonical(flag.split("=", 1)[0])
    scored = sorted(((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known_flags()), reverse=True)
    best = scored[0][0] if scored else 0.0
    if best < 0.75:
        return ""
    ours = set(_our_keys()) | set(OUR_SWITCHES)
    close = [k for r, k in scored if r >= best - 0.1][:2]
    close.sort(key=lambda k: k not in ours)

    def label(k: str) -> str:
        if len(close) == 1:
            return f"--{k}"
        return f"--{k} ({'TraceML' if k in ours else 'torchrun'})"

    return " Did you mean " + " or ".join(label(k) for k in close) + "?"


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _looks_negative_number(token)


def _looks_negative_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _takes_value(name: str) -> Optional[bool]:
    """True/False for a known flag, None for an unknown one."""
    if name in _our_keys():
        return True
    if name in OUR_SWITCHES or name in PASS_SWITCH or name in SPECIAL_SWITCH:
        return False
    if name in PASS_VALUE or name in SPECIAL_VALUE:
        return True
    return None


def _split(token: str) -> tuple[str, Optional[str]]:
    """(canonical name, inline value) of one flag token."""
    if token.startswith("--"):
        head, eq, value = token.partition("=")
        return _canonical(head), (value if eq else None)
    head = token[:2]
    rest = token[2:]
    if rest.startswith("="):
        rest = rest[1:]
    return _canonical(head), (rest if rest else None)


def parse(argv: Sequence[str]) -> RunArgs:
    """Parse ``traceml run``'s arguments; :class:`UsageError` for anything it cannot honour."""
    args = RunArgs()
    ours = _our_keys()
    argv = list(argv)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if not _is_flag(tok):
            break
        if tok in ("-h",):
            args.help = True
            i += 1
            continue
        if not tok.startswith("--") and tok[:2] not in SHORT:
            raise UsageError(f"{tok} is not a TraceML or torchrun flag.{_suggest(tok)} "
                             "Flags go before the script; the script's own arguments go after it: "
                             "traceml run [flags] SCRIPT [script args]. See traceml run --help.")
        name, value = _split(tok)
        takes = _takes_value(name)
        if takes is None:
            raise UsageError(f"{tok.split('=', 1)[0]} is not a TraceML or torchrun flag."
                             f"{_suggest(tok)} Flags go before the script; the script's own arguments "
                             "go after it: traceml run [flags] SCRIPT [script args]. See traceml run "
                             "--help.")
        spelled = tok.split("=", 1)[0] if tok.startswith("--") else tok[:2]
        if takes:
            if value is None:
                if i + 1 >= len(argv):
                    raise UsageError(f"{spelled} needs a value ({spelled}=VALUE).")
                value = argv[i + 1]
                i += 1
        elif value is not None:
            raise UsageError(f"{spelled} takes no value (got {spelled}={value}).")
        i += 1
        _apply(args, name, spelled, value, ours)
    if i < len(argv):
        args.script = argv[i]
        _after_script(args, argv[i + 1:], ours)
    return args


def _after_script(args: RunArgs, rest: Sequence[str], ours: dict[str, str]) -> None:
    """The script's arguments. Before a ``--``, TraceML's own flags (either spelling) are still
    TraceML's, as they always were, and torchrun's launch-only flags are refused; a ``--``
    hands everything after it to the script verbatim (and is itself dropped)."""
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "--":
            args.script_args += rest[i + 1:]
            return
        name, value = _split(tok) if tok.startswith("--") else ("", None)
        if name in ours or name in ("print-config", "json"):
            spelled = tok.split("=", 1)[0]
            words = tok
            if name in ours and value is None:
                if i + 1 >= len(rest):
                    raise UsageError(f"{spelled} needs a value ({spelled}=VALUE). It came after the "
                                     f"script {args.script} and was read as TraceML's; if "
                                     f"{args.script} takes {spelled} itself, put `--` before its "
                                     f"arguments: traceml run [flags] {args.script} -- {spelled} ...")
                value = rest[i + 1]
                words = shlex.join([tok, value])
                i += 1
            key = ours.get(name, name)
            args.after_script[key] = words
            try:
                _apply(args, name, spelled, value, ours)
            except UsageError as exc:
                raise UsageError(f"{exc}{args.hint_for(key)}") from None
        elif name in LAUNCH_ONLY_TORCHRUN:
            flag = tok.split("=", 1)[0]
            raise UsageError(
                f"{flag} comes after the script {args.script}, where torchrun would hand it to the "
                f"script and the launch would silently go without it. Put it before the script: "
                f"traceml run {flag} ... {args.script} ...; if {args.script} takes {flag} itself, put "
                f"`--` before its arguments: traceml run [flags] {args.script} -- ARGS.")
        else:
            args.script_args.append(tok)
        i += 1


def _apply(args: RunArgs, name: str, spelled: str, value: Optional[str], ours: dict[str, str]) -> None:
    if name == "help":
        args.help = True
    elif name == "print-config":
        args.print_config = True
    elif name == "json":
        args.json = True
    elif name == "nnodes":
        args.cli["nnodes"] = _nnodes(spelled, value or "")
    elif name == "nproc-per-node" and (value or "").strip().lower() in SYMBOLIC_NPROC:
        args.cli["nproc_per_node"] = _symbolic_nproc(spelled, value or "")
    elif name in ours:
        args.cli[ours[name]] = value or ""
    elif name in PASS_VALUE:
        if name == "log-dir":
            args.notes.append(f"{spelled} is torchrun's directory for the workers' own log files, "
                              "passed on to torchrun; TraceML's run directory is set by --logs-dir")
        args.torchrun.append(f"--{name}={value}")
    elif name in PASS_SWITCH:
        args.torchrun.append(f"--{name}")
    elif name == "module":
        args.module = True
    elif name == "no-python":
        args.no_python = True
    elif name == "standalone":
        args.standalone = True
    elif name == "max-restarts":
        _max_restarts(spelled, value or "")
    elif name == "rdzv-backend":
        backend = (value or "").strip().lower()
        if backend not in ("static", "c10d"):
            raise UsageError(
                f"{spelled}={value} is refused: TraceML launches with static rendezvous "
                "(every node is told its rank, node 0 is the master), so elastic backends such as "
                "etcd are not used. Drop the flag; give the master with --master-addr/--master-port "
                "(under Slurm both are read from the job).")
        args.rdzv_backend = backend
    elif name == "rdzv-endpoint":
        host, port = _endpoint(spelled, value or "")
        args.cli.setdefault("master_addr", host)
        if port is not None:
            args.cli.setdefault("master_port", port)
        args.notes.append(f"{spelled}={value}: used as the master address"
                          + (" and port" if port is not None else "")
                          + " of TraceML's static rendezvous")
    elif name == "rdzv-id":
        args.notes.append(f"{spelled}={value} accepted; it has no effect with static rendezvous (the "
                          "run is told apart by its ports and run name)")
    elif name == "rdzv-conf":
        raise UsageError(
            f"{spelled}={value} is refused: rendezvous settings apply to elastic "
            "rendezvous, and TraceML launches with static rendezvous (each node is told its rank). "
            "Drop the flag; --aggregator-wait bounds how long nodes wait for each other.")


def _nnodes(spelled: str, value: str) -> str:
    text = value.strip()
    if ":" in text:
        lo, _, hi = text.partition(":")
        if lo.strip() != hi.strip():
            raise UsageError(
                f"{spelled}={value} asks for an elastic node range, which TraceML does "
                "not run: it launches a fixed number of nodes with static rendezvous. Pass one "
                f"number ({spelled}={hi.strip() or lo.strip()}); under Slurm leave it out, the job's "
                "node count is used.")
        return lo.strip()
    return text


def _symbolic_nproc(spelled: str, value: str) -> str:
    word = value.strip().lower()
    if word == "cpu":
        import os

        return str(os.cpu_count() or 1)
    raise UsageError(
        f"{spelled}={value} is refused: TraceML needs the number of workers before it "
        "starts anything (the aggregator sizes the run from it). Pass the number, e.g. "
        f"{spelled}=4 for four GPUs; under Slurm leave it out: one worker per GPU of the step is "
        "used (SLURM_GPUS_ON_NODE).")


def _max_restarts(spelled: str, value: str) -> None:
    try:
        n = int(value.strip())
    except ValueError:
        n = -1
    if n != 0:
        raise UsageError(
            f"{spelled}={value} is refused: TraceML runs torchrun with "
            "--max-restarts=0, because a restarted worker starts its step count again and its "
            "telemetry would be counted twice. Restart the whole job instead (Slurm: sbatch "
            "--requeue); or drop the flag.")


def _endpoint(spelled: str, value: str) -> tuple[str, Optional[str]]:
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep or text.endswith("]"):
        return text.strip("[]"), None
    if not port.isdigit() or not host:
        raise UsageError(f"{spelled}={value} is not HOST or HOST:PORT.")
    return host.strip("[]"), port


def check_rdzv(args: RunArgs, nnodes: int, node_rank_source: str) -> Optional[str]:
    """``--rdzv-backend=c10d`` (the common torchrun recipe) is honoured as static rendezvous when
    every node's rank is known; returns the log line, or raises :class:`UsageError`."""
    if args.rdzv_backend != "c10d":
        return None
    if nnodes == 1 or node_rank_source != "default":
        return ("--rdzv-backend=c10d: TraceML uses static rendezvous with this node's rank from "
                f"{node_rank_source if nnodes > 1 else 'the single-node launch'} (the same result "
                "for a fixed node count)")
    raise UsageError(
        "--rdzv-backend=c10d is refused here: TraceML uses static rendezvous, which "
        f"needs each node's rank, and this is a {nnodes}-node launch with no node rank given. "
        "Under Slurm run one `traceml run` per node inside srun (the rank comes from "
        "SLURM_NODEID); elsewhere pass --node-rank on each node.")


def apply_standalone(cli: dict[str, str], environ: Mapping[str, str]) -> None:
    """torchrun's ``--standalone``: one node on this machine, on ports nobody else uses. Values the
    user gave (flag or TRACEML_* variable) are kept; a node count other than 1 is refused."""
    nnodes = cli.get("nnodes") or environ.get("TRACEML_NNODES") or "1"
    if nnodes.strip() != "1":
        raise UsageError(f"--standalone runs one node, but the node count is {nnodes}. Drop "
                         "--standalone for a multi-node launch, or the node count for a single "
                         "node.")
    cli["nnodes"] = "1"
    cli.setdefault("node_rank", "0")
    cli.setdefault("master_addr", "127.0.0.1")
    from .ports import free_port

    for key in ("master_port", "aggregator_port"):
        if key not in cli and not environ.get("TRACEML_" + key.upper()):
            taken = {int(v) for k, v in cli.items() if k.endswith("_port") and str(v).isdigit()}
            cli[key] = str(free_port(avoid=taken))
