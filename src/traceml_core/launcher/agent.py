"""The torchrun process of ``traceml run``: checks the workers' Python first, then runs torchrun.

``python -m traceml_core.launcher.agent TORCHRUN-ARGS...`` is started by the launcher before
anything else (see :mod:`.preflight`). Its first job is the pre-flight check that only the workers'
interpreter can answer: it imports torch (the import torchrun needs anyway, so the check costs no
extra time) and, for ``-m module``, resolves the module, exactly where the workers will (same
interpreter, environment and working directory). It reports the result over a private socket
(``TRACEML_AGENT_FD``) and waits for the launcher's go; only then does it run
``torch.distributed.run`` with the environment additions the launcher sends (the run info with
the aggregator's or relay's address, known only once those started). So a missing torch or module
ends the launch before the aggregator exists (no run directory) and without a second torch import.

While torchrun runs, a failing run's per-worker outcome (exit code, signal, pid, time) that
torchrun collected is sent back over the same socket: the summary names a killed rank's signal
from it. The socket is closed to the workers (not inheritable).

Protocol (one JSON object per line): agent -> launcher ``{"ready": true, "torch": VERSION,
"cuda_devices": N, "module": PATH|null, "owns_workers": BOOL}`` (whether each worker will get
SIGKILL from the kernel when this process dies, see :mod:`.ownership`) or ``{"ready": false, "error": "torch"|"module",
"detail": TEXT, "python": PATH}``; launcher -> agent ``{"go": true, "env": {...}}`` (with the file
descriptors to use as stdout/stderr attached, when a live view wants them) or ``{"go": false}`` /
end of file (exit 0 without starting anything); agent -> launcher, at the end of a failed run,
``{"failures": [{"rank", "local_rank", "pid", "exitcode", "signal", "ts", "message", "traceback",
"stderr"}]}`` (``stderr``: the end of the worker's stderr, kept by :mod:`.stderrtee`), or, when
torchrun could not start at all because the master port was taken after the pre-flight,
``{"startup_error": TEXT}`` (one paragraph, :func:`port_taken`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from typing import Any, Optional

from .ownership import kill_workers_with_torchrun
from .stderrtee import SEND_MAX, StderrTees

FD_VAR = "TRACEML_AGENT_FD"
BOOTSTRAP_MODULE = "traceml_core.bootstrap"   # (launcher/torchrun.py; this module stays light)
#: how many file descriptors a go message may carry (stdout and stderr for a live view)
MAX_FDS = 2


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    try:
        sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def _probe(module: Optional[str]) -> dict[str, Any]:
    """Import torch and resolve ``module`` as the workers would."""
    try:
        import torch
    except BaseException as exc:  # ImportError, OSError of a missing shared library, ...
        return {"ready": False, "error": "torch", "detail": f"{type(exc).__name__}: {exc}",
                "python": sys.executable}
    out: dict[str, Any] = {"ready": True, "torch": str(torch.__version__), "cuda_devices": 0,
                           "module": None, "python": sys.executable}
    try:
        out["cuda_devices"] = int(torch.cuda.device_count())
    except Exception:
        pass
    if module:
        import importlib.util

        if "" not in sys.path:
            sys.path.insert(0, "")  # `python -m` puts the working directory first
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.submodule_search_locations is not None:
                spec = importlib.util.find_spec(module + ".__main__")  # `-m package`
        except BaseException as exc:
            return {"ready": False, "error": "module", "detail": f"{type(exc).__name__}: {exc}",
                    "python": sys.executable}
        if spec is None:
            return {"ready": False, "error": "module", "detail": f"No module named {module!r}",
                    "python": sys.executable}
        out["module"] = spec.origin
    return out


def _module_of(argv: list[str]) -> Optional[str]:
    """The module name when torchrun is asked to run one (``--module NAME``); behind the worker
    bootstrap (``--module traceml_core.bootstrap -m NAME``), the user's module."""
    if "--module" not in argv:
        return None
    tokens = [tok for tok in argv if not tok.startswith("-") or tok == "-m"]
    if tokens and tokens[0] == BOOTSTRAP_MODULE:
        return tokens[2] if len(tokens) > 2 and tokens[1] == "-m" else None
    return tokens[0] if tokens and tokens[0] != "-m" else None


def _read_go(sock: socket.socket) -> Optional[tuple[dict[str, Any], list[int]]]:
    buf = b""
    fds: list[int] = []
    while b"\n" not in buf:
        try:
            data, got, _flags, _addr = socket.recv_fds(sock, 65536, MAX_FDS)
        except OSError:
            return None
        fds += got
        if not data:
            return None
        buf += data
    try:
        msg = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    if not isinstance(msg, dict) or not msg.get("go"):
        return None
    return msg, fds


def _error_of(message: Any) -> tuple[str, str]:
    """(Python's error line, its traceback) from torchrun's record of a failed worker: the error
    file the worker bootstrap (or torch's ``@record``) wrote, in torchrun's format; the
    traceback is empty when the worker wrote none (a signal, or a worker that died silently)."""
    if isinstance(message, dict):
        extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
        return str(message.get("message") or ""), str(extra.get("py_callstack") or "")
    text = str(message or "")
    if text.startswith("To enable traceback see"):  # torchrun's words for "no error file"
        return "", ""
    return text, ""


def _failure_reporter(sock: socket.socket, tees: Optional[StderrTees] = None) -> None:
    """Send torchrun's per-worker outcome of a failed run back to the launcher (best effort: on
    a torch without these internals the run is simply not annotated), with the end of each
    failed worker's stderr where ``tees`` kept it (stderrtee.py)."""
    try:
        import torch.distributed.launcher.api as api
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except Exception:
        return
    original = api.launch_agent

    def launch_agent(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except ChildFailedError as exc:
            rows = []
            failures = sorted((getattr(exc, "failures", None) or {}).items())
            try:
                stderr = tees.texts([int(f.local_rank) for _, f in failures]) if tees is not None else {}
            except Exception:
                stderr = {}
            for rank, f in failures:
                try:
                    code = int(f.exitcode)
                    message, tb = _error_of(f.message)
                    rows.append({"rank": int(rank), "local_rank": int(f.local_rank), "pid": int(f.pid),
                                 "exitcode": code, "signal": f.signal_name() if code < 0 else None,
                                 "ts": float(f.timestamp), "message": message[:2000],
                                 "traceback": tb[-4000:],
                                 "stderr": (stderr.get(int(f.local_rank)) or "")[-SEND_MAX:] or None})
                except Exception:
                    continue
            _send(sock, {"failures": rows, "at": time.time()})
            raise

    api.launch_agent = launch_agent


#: torch's words when its rendezvous store cannot listen (c10d TCPStore: DistNetworkError)
_PORT_TAKEN = re.compile(r"EADDRINUSE|address already in use", re.I)
_PORT_OF = re.compile(r"port: (\d+)")


def port_taken(exc: BaseException, argv: list[str]) -> Optional[str]:
    """One paragraph when ``exc`` is torch's rendezvous store failing to listen on the master
    port because another process holds it (taken after the launcher's pre-flight found it free:
    preflight.check_master_port); None for anything else."""
    text = str(exc)
    if not _PORT_TAKEN.search(text):
        return None
    m = _PORT_OF.search(text)
    port = m.group(1) if m else next((a.split("=", 1)[1] for a in argv if a.startswith(("--master-port=",
                                                                                        "--master_port="))), "?")
    return (f"the master port {port} was taken on this node after TraceML's pre-flight found it free, so "
            "torchrun could not start its rendezvous store there (EADDRINUSE) and no worker started: another "
            "job or `traceml run` on this machine took it in the seconds between the check and torchrun. Run "
            "again, or pass another free port with --master-port PORT (or TRACEML_MASTER_PORT; the same on "
            "every node of the job), or --standalone on a single node to pick free ports.")


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    raw = os.environ.pop(FD_VAR, "")
    sock: Optional[socket.socket] = None
    if raw.isdigit():
        try:
            sock = socket.socket(fileno=int(raw))
            os.set_inheritable(sock.fileno(), False)
        except OSError:
            sock = None
    if sock is None:  # started by hand: behave like torchrun
        from torch.distributed.run import main as torchrun_main

        kill_workers_with_torchrun()
        torchrun_main(argv)
        return 0
    result = _probe(_module_of(argv))
    if result["ready"]:
        # every worker gets SIGKILL from the kernel if this process dies (see ownership.py)
        result["owns_workers"] = kill_workers_with_torchrun()
    _send(sock, result)
    if not result["ready"]:
        return 0
    go = _read_go(sock)
    if go is None:
        return 0  # the launcher gave up (pre-flight failed elsewhere, signal) or is gone
    msg, fds = go
    env = msg.get("env") or {}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    if len(fds) == 2:  # a live view prints the workers' output above its display
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    # each worker's stderr through here, its last lines kept for the record of a failed worker;
    # only where no worker can outlive this process (the reader of its stderr)
    tees = StderrTees() if result.get("owns_workers") else None
    if tees is not None and not tees.install():
        tees = None
    _failure_reporter(sock, tees)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except SignalException:
        # stopped by the launcher (the hang watchdog, a node lost) or by scancel: torchrun has
        # stopped the workers, and the launcher logs why; its traceback would only bury that.
        # Exit status 1, as the uncaught exception gave.
        return 1
    except ChildFailedError:
        # a worker failed: it printed its own error, torchrun's record of every worker went to
        # the launcher (_failure_reporter) and the summary names the first failure; torchrun's
        # traceback through its own internals, and its copy of the record, would only bury that.
        # Exit status 1, as the uncaught exception gave.
        return 1
    except Exception as exc:  # noqa: BLE001 - only the port race is ours to explain
        words = port_taken(exc, argv)
        if words is None:
            raise
        # the launcher's words (its log, the run's reason and headline) instead of torch's traceback
        _send(sock, {"startup_error": words, "at": time.time()})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
