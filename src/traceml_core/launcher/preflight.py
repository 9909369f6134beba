"""Pre-flight of ``traceml run``: refuse a launch that cannot work before anything starts.

Checked, in this order, each failure one paragraph and exit status 2, with no run directory and
no aggregator left behind:

1. the script exists (a file, or a directory with ``__main__.py``) and compiles (a syntax error
   is Python's own message, file, line and caret, before any worker starts); with ``--no-python``
   the program is found on PATH or is an executable file (cheap, in the launcher); on node 0 the
   master port is free (torchrun's rendezvous store listens there; taken, every worker would fail
   in torch's rendezvous with a traceback through torchrun's internals);
2. torch imports in the workers' interpreter, and ``-m MODULE`` resolves there: answered by the
   torchrun process itself (:mod:`.agent`), which imports torch anyway, so the check adds no
   time; it holds torchrun back until the launcher says go;
3. the worker count is sane: not more workers than GPUs visible to this node's workers (two
   workers on one GPU fail in NCCL, or silently halve each other's speed); more workers than
   usable CPU cores on a CPU-only run is only warned about (small CPU tests do it on purpose).
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import select
import shutil
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import TraceMLError

#: the launcher says so once when the workers' torch import takes this long (cold shared
#: filesystem), so a slow start is never mistaken for a hang
SLOW_IMPORT_NOTE_S = 30.0


class PreflightError(TraceMLError):
    """The launch cannot work; ``str()`` is the paragraph the user sees."""

    exit_code = 2


@dataclass
class WorkerProbe:
    """What the torchrun process found in the workers' interpreter."""

    torch: str
    cuda_devices: int
    module: Optional[str]
    python: str
    extra: dict[str, Any] = field(default_factory=dict)


def check_script(script: str, *, module: bool, no_python: bool, cwd: Optional[str] = None) -> None:
    """Step 1: the script (or program) exists."""
    if module:
        return
    base = Path(cwd or os.getcwd())
    path = Path(script) if Path(script).is_absolute() else base / script
    if no_python:
        if ("/" in script and path.is_file() and os.access(path, os.X_OK)) or shutil.which(script):
            return
        raise PreflightError(
            f"--no-python runs {script!r} as a program, but it is neither an executable "
            f"file nor found on PATH (looked in {base}). Fix the name or make the file executable "
            "(chmod +x).")
    if path.is_file():
        check_compiles(path, script)
        return
    if path.is_dir() and (path / "__main__.py").is_file():
        check_compiles(path / "__main__.py", script)
        return
    hint = ""
    where = path.parent
    if where.is_dir():
        names = sorted(p.name for p in where.iterdir() if p.suffix == ".py")
        close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
        if close:
            hint = f" Did you mean {Path(script).parent / close[0]}?"
    if not hint and not script.endswith(".py") and "/" not in script and "." in script:
        hint = f" If {script} is a module, run it with -m: traceml run [flags] -m {script} [args]."
    what = "is a directory without __main__.py" if path.is_dir() else "does not exist"
    raise PreflightError(
        f"the training script {script} {what} (looked for {path}).{hint} Nothing was "
        "started.")


def compile_error(path: Path) -> Optional[str]:
    """Python's own report of why ``path`` does not compile (file, line, the line and its caret,
    the message), or None when it compiles (or is not Python source we can read: the workers
    will say). The same check as ``traceml slurm doctor``'s script check."""
    try:
        source = path.read_bytes()
    except OSError:
        return None
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    return None


def check_compiles(path: Path, script: str) -> None:
    """Step 1: a script with a syntax error never reaches its first step; say so before the
    aggregator, torchrun and the workers start (each would otherwise print the error inside a
    traceback through the bootstrap and torchrun)."""
    if path.suffix not in (".py", "") and path.name != "__main__.py":
        return
    err = compile_error(path)
    if err is None:
        return
    indented = "\n".join("    " + line for line in err.splitlines())
    raise PreflightError(
        f"the training script {script} does not compile, so no worker was started. Python says:\n"
        f"{indented}\n"
        f"Fix that line and run again (python -m py_compile {script} checks it without starting "
        "anything).")


def check_master_port(port: int, source: str, nnodes: int) -> None:
    """Step 1, node 0 only: the master port is free. torchrun's rendezvous store listens on it
    (on every interface, address reuse allowed, as torch's TCPStore does) once torch is
    imported; taken, every worker fails inside torch's rendezvous (EADDRINUSE) and the run never
    starts. Port 0 (chosen by torchrun) is not checked."""
    if not port:
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return  # not ours to judge (permissions, no IPv4): torchrun reports it
        same = " (the same on every node of the job)" if nnodes > 1 else ""
        where = f" (from {source})" if source != "default" else ""
        raise PreflightError(
            f"the master port {port}{where} is already in use on this node, which hosts torchrun's "
            "rendezvous store: probably another job or `traceml run` on this machine, or a previous "
            f"run still shutting down. Pass a free port with --master-port PORT (or TRACEML_MASTER_PORT)"
            f"{same}, or --standalone on a single node to pick free ports. Nothing was started.") from None
    finally:
        sock.close()


def check_cpus(nproc: int) -> Optional[str]:
    """A warning when a CPU-only run starts more workers than usable cores."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    if nproc > usable:
        return (f"{nproc} workers on {usable} usable CPU core(s): each worker gets less than a core, "
                "so step times will mostly measure CPU contention")
    return None


def check_probe(probe: WorkerProbe, nproc: int, nproc_source: str) -> None:
    """Step 3 on a GPU node: not more workers than visible GPUs."""
    if probe.cuda_devices > 0 and nproc > probe.cuda_devices:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise PreflightError(
            f"{nproc} workers per node (from {nproc_source}) but the workers' torch sees "
            f"only {probe.cuda_devices} GPU(s) on this node{seen}: two workers would share a GPU, "
            "which NCCL refuses and which halves each one's speed. Pass "
            f"--nproc-per-node={probe.cuda_devices} (one worker per GPU), or make more GPUs visible "
            "(Slurm: --gpus-per-node).")


def probe_failure(reply: dict[str, Any], script: str) -> PreflightError:
    """The paragraph for a failed probe (step 2)."""
    python = reply.get("python") or "python"
    detail = str(reply.get("detail") or "unknown error").strip().splitlines()[-1][:300]
    if reply.get("error") == "module":
        return PreflightError(
            f"-m {script} does not resolve in the workers' Python ({python}, working "
            f"directory {os.getcwd()}): {detail}. Run from the directory that holds the package, add "
            "it to PYTHONPATH, or install the package into this environment. Nothing was started.")
    return PreflightError(
        f"torch cannot be imported by the workers' Python ({python}): {detail}. The "
        "workers run in the same environment as `traceml run`: install torch there (pin the "
        "version, e.g. pip install torch==2.4.1), or activate the environment that has it "
        "(source venv/bin/activate, module load ...) before traceml run. Nothing was started.")


class AgentLink:
    """The launcher's end of the socket to the torchrun process (:mod:`.agent`)."""

    def __init__(self) -> None:
        self.sock, self.child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = b""
        self.failures: Optional[list[dict[str, Any]]] = None
        #: why torchrun could not start at all (the master port taken after the pre-flight), in words
        self.startup_error: Optional[str] = None

    @property
    def child_fd(self) -> int:
        return self.child.fileno()

    def spawned(self) -> None:
        """The agent holds its end now; close ours of it."""
        self.child.close()

    def _line(self, timeout: float) -> Optional[dict[str, Any]]:
        end = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.sock], [], [], min(left, 0.2))
            if not r:
                continue
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                raise EOFError
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return {}
        return msg if isinstance(msg, dict) else {}

    def wait_ready(self, alive: Callable[[], bool], log: Callable[[str], None]) -> Optional[dict[str, Any]]:
        """The probe's reply; None when the agent died or was stopped before answering."""
        start = time.monotonic()
        noted = False
        while True:
            try:
                msg = self._line(0.5)
            except EOFError:
                return None
            if msg is not None:
                return msg
            if not alive():
                return None
            if not noted and time.monotonic() - start > SLOW_IMPORT_NOTE_S:
                noted = True
                log(f"still importing torch in the workers' Python after {SLOW_IMPORT_NOTE_S:.0f} s "
                    "(a cold shared filesystem?); the run starts when it is done")

    def go(self, env: dict[str, str], fds: tuple[int, ...] = ()) -> bool:
        data = (json.dumps({"go": True, "env": env}) + "\n").encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def abort(self) -> None:
        try:
            self.sock.sendall(b'{"go": false}\n')
        except OSError:
            pass
        self.close()

    def collect_failures(self, timeout: float = 0.5) -> list[dict[str, Any]]:
        """torchrun's per-worker outcome of a failed run (empty when it sent none)."""
        if self.failures is None:
            self.failures = []
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                try:
                    msg = self._line(max(0.0, end - time.monotonic()))
                except EOFError:
                    break
                if msg is None:
                    break
                if isinstance(msg.get("failures"), list):
                    self.failures = [f for f in msg["failures"] if isinstance(f, dict)]
                    break
                if isinstance(msg.get("startup_error"), str):
                    self.startup_error = msg["startup_error"][:2000]
                    break
        return self.failures

    def close(self) -> None:
        for s in (self.sock, self.child):
            try:
                s.close()
            except OSError:
                pass
