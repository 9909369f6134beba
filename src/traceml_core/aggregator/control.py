"""The launcher's side of the aggregator connection: blocking, small, used outside the hot path.

Two users: node 0's launcher (hello kind ``control``: ``finish``/``query``), and every other
node's launcher (hello kind ``node``: it joins, may send ``system`` frames, says ``bye`` with its
exit code at the end; closing without ``bye`` tells node 0 the node vanished). Training
processes never use this module; they use the SDK's client (wire/client.py).
"""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

from ..wire.protocol import FrameBuffer, ProtocolError, encode, make_hello


class LinkError(Exception):
    """The aggregator could not be reached or answered wrongly; ``str()`` says what happened."""


class LinkRefused(LinkError):
    """The aggregator refused our hello; ``reason`` is its reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the aggregator refused the connection: {reason}")
        self.reason = reason


class Link:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._frames = FrameBuffer()
        self._ready: list[dict[str, Any]] = []

    @classmethod
    def connect(cls, host: str, port: int, *, token: str, run_name: str, job_id: Optional[str],
                kind: str, node: int, hostname: str = "", nproc: Optional[int] = None,
                timeout: float = 5.0, wait_s: float = 0.0) -> "Link":
        """Connect and complete the handshake, retrying refused TCP connects for ``wait_s``."""
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise LinkError(f"cannot connect to the aggregator at {host}:{port}: "
                                    f"{exc.strerror or exc}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = cls(sock)
        extra: dict[str, Any] = {}
        if nproc is not None:
            extra["nproc"] = nproc
        hello = make_hello(token, run=run_name, job=job_id, node=node, rank=-1, kind=kind,
                           host=hostname or socket.gethostname(), extra=extra)
        link.send(hello)
        reply = link.recv(timeout)
        if reply.get("t") == "refused":
            link.close()
            raise LinkRefused(str(reply.get("reason")))
        if reply.get("t") != "welcome":
            link.close()
            raise LinkError(f"unexpected answer to hello: {reply.get('t')!r}")
        return link

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.sendall(encode(msg))
        except OSError as exc:
            raise LinkError(f"lost the connection to the aggregator: {exc}") from None

    def recv(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError(f"no answer from the aggregator within {timeout:.1f} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as exc:
                raise LinkError(f"lost the connection to the aggregator: {exc}") from None
            if not data:
                raise LinkError("the aggregator closed the connection")
            try:
                self._ready.extend(self._frames.feed(data))
            except ProtocolError as exc:
                raise LinkError(f"bad frame from the aggregator: {exc}") from None
        return self._ready.pop(0)

    def request(self, msg: dict[str, Any], want: str, timeout: float) -> dict[str, Any]:
        self.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
            if reply.get("t") == want:
                return reply

    # --- control (node 0's launcher) --------------------------------------------------------
    def finish(self, exit_code: Optional[int], *, interrupted: bool = False, reason: str = "",
               failed_nodes: tuple[int, ...] | list[int] = (), timeout: float = 15.0,
               report: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """``report``: this node's worker report (``workers``, ``oom``; see protocol.worker_report)."""
        return self.request({"t": "finish", "exit_code": exit_code, "interrupted": interrupted,
                             "reason": reason, "failed_nodes": list(failed_nodes), **(report or {})},
                            "finished", timeout)

    def query(self, timeout: float = 2.0) -> dict[str, Any]:
        return self.request({"t": "query"}, "status", timeout)

    def snapshot(self, request: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
        """Live views: a ``snapshot`` frame; replies to earlier, timed-out requests are skipped."""
        self._snap_id = getattr(self, "_snap_id", 0) + 1
        self.send({**request, "t": "snapshot", "id": self._snap_id})
        deadline = time.monotonic() + timeout
        while True:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
            if reply.get("t") == "snapshot" and reply.get("id") == self._snap_id:
                return reply

    # --- node launchers -----------------------------------------------------------------------
    def bye(self, exit_code: Optional[int], status: str = "clean",
            report: Optional[dict[str, Any]] = None) -> None:
        self.send({"t": "bye", "status": status, "exit_code": exit_code, **(report or {})})

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def join_aggregator(host: str, port: int, *, token: str, run_name: str, job_id: Optional[str],
                    node: int, nproc: int, hostname: str = "", wait_s: float = 60.0) -> Link:
    """For a node launcher (node_rank > 0): join node 0's aggregator, waiting up to ``wait_s``."""
    return Link.connect(host, port, token=token, run_name=run_name, job_id=job_id, kind="node",
                        node=node, hostname=hostname, nproc=nproc, wait_s=wait_s)
