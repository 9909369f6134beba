"""Who may feed a run: strangers are refused AND logged, while the real run goes on untouched.

1. Through a real ``traceml run``: during training, a client without the token, a client signed
   with another run's token and a client that skips the hello connect to the run's aggregator;
   each is answered ``refused`` and closed, each refusal is a line on the launcher's stderr (the
   job log), counted in the summary, and the run's own records are complete.
2. A real client's hello, captured on the wire by a proxy (what an eavesdropper on the cluster
   network gets), is replayed byte for byte: refused as a replay, and logged.
"""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time

from aggpeers import RUN, TOKEN, make_settings, node
from harness import Launch, Progress, assert_no_leftovers
from traceml_core.aggregator.process import start_aggregator
from traceml_core.wire.auth import AGGREGATOR, make_hello, relay_aud
from traceml_core.wire.client import ClientConfig, TelemetryClient
from traceml_core.wire.protocol import FrameBuffer, encode


def _attempt(port: int, frame: bytes) -> tuple[dict, bool]:
    """Send one first frame; return the server's answer and whether it then closed the socket."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(frame)
    buf, got = FrameBuffer(), []
    closed = False
    try:
        while True:
            data = s.recv(65536)
            if not data:
                closed = True
                break
            got.extend(buf.feed(data))
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        pass
    s.close()
    return (got[0] if got else {}), closed


def test_strangers_are_refused_and_logged_during_a_real_run(tmp_path):
    run_name = "authrun"
    launch = Launch(tmp_path, ("--steps", "150", "--step-ms", "15"), run_name=run_name,
                    env={"TRACEML_TOKEN": secrets.token_hex(16)})
    deadline = time.monotonic() + 180
    while Progress.read(launch.progress_dir).done(0) < 10:
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()
        time.sleep(0.05)
    port = launch.aggregator_port
    unsigned = make_hello("", aud=AGGREGATOR, run=run_name, job=None, node=0, rank=-1, kind="node")
    del unsigned["mac"]
    attempts = {
        "no token": encode(unsigned),
        "another run's token": encode(make_hello(secrets.token_hex(16), aud=AGGREGATOR, run=run_name,
                                                 job=None, node=0, rank=-1, kind="node")),
        "no hello": encode({"t": "steps", "rank": 0, "seq": 10**6, "n": 0, "cols": {}}),
    }
    for what, frame in attempts.items():
        reply, closed = _attempt(port, frame)
        assert reply.get("t") == "refused" and closed, (what, reply)
    r = launch.wait(180)
    assert r.code == 0 and r.progress.result is not None

    refusals = re.findall(r"traceml-aggregator: refused connection from 127\.0\.0\.1:\d+: (.*)", r.err)
    assert len(refusals) == 3, r.err[-3000:]
    assert sum("authentication failed" in x for x in refusals) == 2
    assert sum("first frame must be a hello" in x for x in refusals) == 1
    s = r.summary()
    assert s["telemetry"]["wire"]["refused"] == 3
    assert s["telemetry"]["records_received"] == 2 * 150 and s["telemetry"]["complete"]
    assert "wire: refused 3" in r.out  # the printed summary shows it too
    assert_no_leftovers(r)


class RecordingProxy:
    """A TCP proxy that forwards both ways and keeps what the client sent (an eavesdropper)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.captured = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", self.upstream))

        def pipe(src: socket.socket, dst: socket.socket, keep: bool) -> None:
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if keep:
                        self.captured += data
                    dst.sendall(data)
            except OSError:
                pass
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=pipe, args=(server, client, False), daemon=True).start()
        pipe(client, server, True)

    def first_frame(self) -> bytes:
        n = int.from_bytes(self.captured[:4], "big")
        assert len(self.captured) >= 4 + n
        return bytes(self.captured[:4 + n])


def test_a_captured_hello_replayed_is_refused_at_both_endpoints_and_logged(tmp_path, capfd):
    h = start_aggregator(make_settings(tmp_path, nproc_per_node=2))
    relay = node(h, 0, warn=lambda msg: print(f"[traceml] warning: {msg}", file=__import__("sys").stderr))
    try:
        proxy = RecordingProxy(relay.port)
        real = TelemetryClient(ClientConfig("127.0.0.1", proxy.port, TOKEN, aud=relay_aud(0), run=RUN, job="42",
                                            node=0, rank=0, kind="rank", world=2))
        real.start()
        assert real.wait_connected(5.0)
        hello = proxy.first_frame()
        reply, closed = _attempt(relay.port, hello)  # at the relay, while the real rank is connected
        assert reply.get("t") == "refused" and "replayed" in reply.get("reason", "") and closed
        reply, closed = _attempt(h.port, hello)      # at node 0's aggregator: another endpoint
        assert reply.get("t") == "refused" and "authentication failed" in reply.get("reason", "") and closed
        real.close(1.0)
        time.sleep(0.2)
        reply, closed = _attempt(relay.port, hello)  # and after it left
        assert reply.get("t") == "refused" and "replayed" in reply.get("reason", "") and closed
        status = h.status()
        assert status["ranks_seen"] == 1  # only the real rank ever got in
        relay.drain(2.0)
        relay.run_ended()
        res = h.finish(0)
    finally:
        relay.close(1.0)
        if h.alive():
            h.kill()
    err = capfd.readouterr().err
    logged = re.findall(r"node 0's relay: refused connection from 127\.0\.0\.1:\d+: replayed hello", err)
    assert len(logged) == 2, err[-2000:]
    assert re.search(r"traceml-aggregator: refused connection from 127\.0\.0\.1:\d+: authentication failed", err)
    import json
    assert json.loads(res.summary_json.read_text())["telemetry"]["wire"]["refused"] == 1
    assert relay.stats().refused == 2
