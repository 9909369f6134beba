"""Start and talk to the aggregator process: the API node 0's launcher calls.

The aggregator is a child process (``python -m traceml_core.aggregator``) in its own session, so
a crash or OOM kill of it never touches training, and a Ctrl-C in the terminal reaches the
launcher (which decides) rather than the aggregator. Typical use::

    handle = start_aggregator(settings)           # raises AggregatorStartError (port in use, ...)
    ... run torchrun; workers get handle.port and the token ...
    result = handle.finish(exit_code, interrupted=False, reason="")   # never raises
    print(Path(result.summary_txt).read_text())

:meth:`AggregatorHandle.finish` rebuilds the summary from the last checkpoint when the aggregator
died during the run (``result.rebuilt``), so the launcher always gets a summary when one can exist.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import TraceMLError
from ..codec import decode
from ..livesnapshot import LiveSnapshot
from ..wire.auth import AGGREGATOR, make_hello
from ..wire.client import Link, LinkError
from .settings import ERROR, READY, AggregatorSettings

_PKG_PARENT = str(Path(__file__).resolve().parents[2])


class AggregatorStartError(TraceMLError):
    """The aggregator could not start; the message names the cause and the fix."""

    exit_code = 3


@dataclass
class FinishResult:
    summary_json: Optional[Path]
    summary_txt: Optional[Path]
    #: True when the summary was rebuilt from a checkpoint because the aggregator was gone
    rebuilt: bool = False
    #: why there is no summary (both paths None), or what went wrong before a rebuild
    error: Optional[str] = None


def _connect_host(bind_host: str) -> str:
    if bind_host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


class AggregatorHandle:
    """A running aggregator: its port, its run directory, its control connection."""

    def __init__(self, proc: subprocess.Popen, settings: AggregatorSettings, port: int,
                 run_dir: Path, run_dir_note: Optional[str]) -> None:
        self.proc = proc
        self.settings = settings
        self.port = port
        self.run_dir = run_dir
        self.run_dir_note = run_dir_note
        self.control: Optional[Link] = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def connect_host(self) -> str:
        """Where processes on node 0 reach the aggregator."""
        return _connect_host(self.settings.bind_host)

    def connect_control(self, timeout: float = 5.0) -> None:
        s = self.settings
        host = socket.gethostname()
        self.control = Link.connect(
            self.connect_host, self.port,
            lambda: make_hello(s.control_token, aud=AGGREGATOR, run=s.run_name,
                               job=s.job_id, node=0, rank=-1, kind="control", host=host),
            timeout=timeout, wait_s=timeout, name="control")

    def status(self, timeout: float = 2.0, notices_after: int = 0) -> Optional[dict[str, Any]]:
        """``{"nodes_joined": [...], "ranks_connected", "ranks_seen", "records", "notices"}``
        (``notices``: the hang detection's log lines after ``notices_after``), or None."""
        if self.control is None or not self.alive():
            return None
        try:
            return self.control.request({"t": "query", "notices_after": notices_after}, "status", timeout)
        except LinkError:
            return None

    def autopsy(self, silent_s: float, threshold_s: float, threshold_source: str,
                timeout: float = 15.0) -> Optional[dict[str, Any]]:
        """A hang report: the aggregator has every rank's stack taken and read (aggregator/
        autopsy.py); None when it could not answer."""
        if self.control is None or not self.alive():
            return None
        try:
            reply = self.control.request({"t": "autopsy", "silent_s": silent_s, "threshold_s": threshold_s,
                                          "threshold_source": threshold_source}, "autopsy", timeout)
        except LinkError:
            return None
        return reply.get("report")

    def snapshot(self, request: dict[str, Any], timeout: float = 2.0) -> LiveSnapshot:
        """Live views: one snapshot (raises LinkError, and pydantic's ValidationError on a
        malformed frame)."""
        if self.control is None:
            raise LinkError("no control connection")
        return decode(LiveSnapshot, self.control.request({**request, "t": "snapshot"}, "snapshot", timeout))

    def finish(self, exit_code: Optional[int], *, interrupted: bool = False, reason: str = "",
               failed_nodes: Sequence[int] = (), timeout: Optional[float] = None,
               report: Optional[dict[str, Any]] = None) -> FinishResult:
        """Report the end of training; wait for the summary. Never raises.

        ``timeout`` defaults to the drain time plus 10 s of finalisation budget. When the
        aggregator is gone or does not answer in time it is stopped and the summary is rebuilt
        from its last checkpoint.
        """
        budget = self.settings.drain_s + 10.0 if timeout is None else timeout
        error: Optional[str] = None
        reply: Optional[dict[str, Any]] = None
        if self.control is not None and self.alive():
            try:
                reply = self.control.request(
                    {"t": "finish", "exit_code": exit_code, "interrupted": interrupted,
                     "reason": reason, "failed_nodes": list(failed_nodes), **(report or {})},
                    "finished", budget)
            except LinkError as exc:
                error = str(exc)
        elif not self.alive():
            error = f"the aggregator had exited ({_describe_exit(self.proc.returncode)})"
        else:
            error = "no control connection to the aggregator"
        self._close_control()
        self.stop(timeout=5.0)
        if reply is not None and reply.get("summary_json"):
            return FinishResult(Path(reply["summary_json"]), Path(reply["summary_txt"]), False,
                                reply.get("error"))
        if reply is not None:
            error = reply.get("error") or "the aggregator wrote no summary"
        from ..report.summarize import summarize
        try:
            # say in the summary itself why it is rebuilt (the launcher's log may be lost)
            why = "; ".join(x for x in (reason, f"summary rebuilt because {error}" if error else "") if x)
            out = summarize(self.run_dir, run_id=self.settings.run_id, finish={
                "exit_code": exit_code, "interrupted": interrupted, "reason": why,
                "failed_nodes": list(failed_nodes), "at": time.time(), **(report or {})})
        except TraceMLError as exc:
            return FinishResult(None, None, False, f"{error}; {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug of ours must not cost the launcher its exit
            return FinishResult(None, None, False, f"{error}; the rebuild failed too "
                                                   f"({type(exc).__name__}: {exc})")
        return FinishResult(Path(out["summary_json"]), Path(out["summary_txt"]), True, error)

    def _close_control(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """Wait for the process to exit; SIGTERM, then SIGKILL, past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the aggregator (tests of the no-run-lost path)."""
        self._close_control()
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()


def _describe_exit(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"status {code}"


def _child_env(env: Optional[dict[str, str]]) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PKG_PARENT not in parts:
        out["PYTHONPATH"] = os.pathsep.join([_PKG_PARENT] + parts)
    return out


def start_aggregator(settings: AggregatorSettings, *, ready_timeout: float = 15.0,
                     python: str = sys.executable, env: Optional[dict[str, str]] = None,
                     connect_control: bool = True,
                     command: Optional[Sequence[str]] = None) -> AggregatorHandle:
    """Spawn the aggregator and wait (at most ``ready_timeout``) until it listens.

    Raises :class:`AggregatorStartError` with a one-paragraph message (port in use, bind address
    not on this node, no writable run directory, did not start in time). ``command`` replaces
    ``[python, "-m", "traceml_core.aggregator"]`` (e.g. to run it under a profiler).
    """
    try:
        proc = subprocess.Popen(
            list(command or [python, "-m", "traceml_core.aggregator"]), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=None, start_new_session=True, close_fds=True,
            env=_child_env(env))
    except OSError as exc:
        raise AggregatorStartError(f"Cannot start the TraceML aggregator ({python}): {exc}") from None
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((settings.model_dump_json() + "\n").encode())
        proc.stdin.close()
    except OSError:
        pass
    line = _read_line(proc, ready_timeout)
    proc.stdout.close()
    if line is None or not (line.startswith(READY) or line.startswith(ERROR)):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        code = proc.wait()
        raise AggregatorStartError(
            f"The TraceML aggregator did not start within {ready_timeout:.0f} s "
            f"(exit status {code}; its messages are above). Training was not started.")
    kind, _, payload = line.partition(" ")
    try:
        info = json.loads(payload)
    except ValueError:
        info = {}
    if kind == ERROR:
        proc.wait()
        raise AggregatorStartError(str(info.get("message") or payload))
    handle = AggregatorHandle(proc, settings, int(info["port"]), Path(info["run_dir"]),
                              info.get("run_dir_note"))
    if connect_control:
        try:
            handle.connect_control()
        except LinkError as exc:
            handle.stop(timeout=2.0)
            raise AggregatorStartError(f"The TraceML aggregator started but its launcher "
                                       f"connection failed: {exc}") from None
    return handle


def _read_line(proc: subprocess.Popen, timeout: float) -> Optional[str]:
    """One line from the child's stdout within ``timeout``; None on timeout or EOF."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace").strip()
