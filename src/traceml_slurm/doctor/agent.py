"""The per-node agent: ``python -m traceml_slurm.doctor.agent``, one per node, started by the
coordinator with ``srun --overlap --ntasks-per-node=1``.

It connects back to the coordinator (address, token and options come in the srun environment),
proves the token with a hello (the shared transport, ``traceml_core.wire``), runs the node checks (the same functions as
``--local``, here inside a real srun step, so the launch config resolves exactly as `traceml run`
would on this node), sends the outcomes and the facts the cross-node checks compare, then obeys
the coordinator's commands (see :mod:`.wire`) until ``d.bye``. Every wait is bounded: if the
coordinator goes silent or away, the agent ends by itself.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from traceml_core.wire.client import Backoff, Link, LinkError, LinkRefused

from .filesystem import absolute, logs_dir
from .model import Outcome
from .network import resolve_host
from .node import NodeContext, Options, node_name
from .progress import Progress
from .registry import NODE_SPECS, run_checks
from .torchprobe import run_probe
from .wire import (ENV_ADDR, ENV_CLOCK_HOOK, ENV_OPTS, ENV_TOKEN, aggregator_token, doctor_hello,
                   parse_clock_hook, probe_token, recv_by)

#: step records each node sends to node 0's aggregator in the cross.aggregator check
TEST_RECORDS = 3


def connect_back(addr_spec: str, deadline: float, hello: Callable[[], dict[str, Any]], name: str) -> Link:
    """Connect to the first of ``ip1,ip2:port`` that answers and complete the handshake, trying
    each until ``deadline`` (with the one backoff every TraceML client uses)."""
    hosts, _, port = addr_spec.rpartition(":")
    last: Optional[Exception] = None
    backoff = Backoff(0.1, 1.0)
    while time.monotonic() < deadline:
        for host in [h for h in hosts.split(",") if h]:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return Link.connect(host, int(port), hello, timeout=min(3.0, left), name=name)
            except LinkRefused:
                raise
            except LinkError as exc:
                last = exc
        time.sleep(backoff.delay())
    raise OSError(f"cannot reach the doctor at {addr_spec}: {last}")


def plain(value: Any) -> Any:
    """Only what msgpack carries (a Path or a set in some check's data must not lose the node)."""
    return json.loads(json.dumps(value, default=str))


def collect_facts(ctx: NodeContext, outcomes: dict[str, Outcome]) -> dict[str, Any]:
    import traceml_core

    co = ctx.launch()
    c = co.config
    torch = ctx._torch_info  # only what the checks already learnt; never start torch for facts
    facts: dict[str, Any] = {
        "node": node_name(ctx.environ), "hostname": socket.gethostname(), "pid": os.getpid(),
        "slurm_nodeid": ctx.environ.get("SLURM_NODEID"), "node_rank": ctx.node_rank(), "cwd": ctx.cwd,
        "config": None, "config_error": co.error,
        "versions": {"python": ctx.python_version, "traceml": getattr(traceml_core, "__version__", "?"),
                     "torch": (torch.version if torch and torch.ok else (f"unusable: {torch.error}" if torch else None))},
        "gpus": ctx.gpus_on_node(),
        "torch_cuda": torch.cuda_build if torch else None,
        "torch_devices": torch.device_count if torch else None,
        "logs_dir": str(absolute(ctx, logs_dir(ctx)[0])),
    }
    if c is not None:
        facts["config"] = {k: getattr(c, k) for k in ("nnodes", "node_rank", "nproc_per_node", "master_addr",
                                                       "master_port", "aggregator_host", "aggregator_port",
                                                       "aggregator_bind_host", "run_name", "logs_dir")}
        facts["master_addrs"], facts["master_error"] = resolve_host(c.master_addr)
        facts["aggregator_addrs"], facts["aggregator_error"] = resolve_host(c.aggregator_host)
    return facts


class Listeners:
    """Node 0's brief listeners: each accepted connection gets the nonce, so the prober knows it
    reached THIS agent and not some other service on the port."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self.stop = threading.Event()
        self.nonce = secrets.token_bytes(16)
        self.threads: list[threading.Thread] = []

    def listen(self, host: str, port: int) -> str:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(1024)  # every node connects at once; a full backlog would look like a firewall
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is in use"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        s.settimeout(0.2)
        self.socks.append(s)
        th = threading.Thread(target=self._serve, args=(s,), daemon=True)
        th.start()
        self.threads.append(th)
        return "ok"

    def _serve(self, s: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                conn.settimeout(2.0)
                conn.sendall(self.nonce)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=1.0)
        for s in self.socks:
            s.close()
        self.socks.clear()


def probe(host: str, port: int, timeout: float, nonce: Optional[bytes]) -> dict[str, Any]:
    """Connect to host:port and tell apart: ok, refused, timeout, no-route, unresolved, foreign, error."""
    addrs, err = resolve_host(host)
    if err:
        return {"status": "unresolved", "detail": err, "host": host, "port": port}
    addr = addrs[0]
    out: dict[str, Any] = {"host": host, "addr": addr, "port": port}
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    t0 = time.monotonic()
    try:
        s.connect((addr, port))
        out["ms"] = round((time.monotonic() - t0) * 1000, 1)
        if nonce is not None:
            got = b""
            while len(got) < len(nonce):
                chunk = s.recv(len(nonce) - len(got))
                if not chunk:
                    break
                got += chunk
            out["status"] = "ok" if got == nonce else "foreign"
        else:
            out["status"] = "ok"
    except socket.timeout:
        out.update(status="timeout", detail=f"no answer within {timeout:.0f} s")
    except ConnectionRefusedError:
        out.update(status="refused", detail="connection refused")
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            out.update(status="no-route", detail=exc.strerror or str(exc))
        else:
            out.update(status="error", detail=exc.strerror or str(exc))
    finally:
        s.close()
    return out


def _probe_all(targets: list[dict[str, Any]], timeout: float, nonce: Optional[bytes]) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def one(t: dict[str, Any]) -> None:
        results[t["label"]] = probe(t["host"], int(t["port"]), timeout, nonce)

    threads = [threading.Thread(target=one, args=(t,), daemon=True) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout + 3.0)
    for t in targets:
        results.setdefault(t["label"], {"status": "error", "detail": "probe did not finish", "host": t["host"],
                                        "port": t["port"]})
    return results


class Agent:
    def __init__(self, ctx: NodeContext, link: Link) -> None:
        self.ctx = ctx
        self.link = link
        self.node = node_name(ctx.environ)
        self.listeners: Optional[Listeners] = None
        self.aggregator: Optional[Any] = None  # node 0: the real aggregator, started for the check
        self.aggregator_dir: Optional[str] = None
        self.probe_server: Optional[Any] = None  # cross.link-bandwidth: this node's link probe server
        self.clock_offset = parse_clock_hook(ctx.environ.get(ENV_CLOCK_HOOK, ""), self.node)
        #: the agent ends by itself when the coordinator says nothing for this long
        self.idle_s = 4 * ctx.options.timeout + 120

    def handle(self, msg: dict[str, Any]) -> Optional[dict[str, Any]]:
        t = msg.get("t")
        if t == "d.clock":
            return {"t": "d.clock", "now": time.time() + self.clock_offset}
        if t == "d.listen":
            self.listeners = self.listeners or Listeners()
            ports = {str(p["port"]): self.listeners.listen(p["host"], int(p["port"])) for p in msg.get("ports", [])}
            return {"t": "d.listening", "ports": ports, "nonce": self.listeners.nonce}
        if t == "d.unlisten":
            if self.listeners:
                self.listeners.close()
                self.listeners = None
            return {"t": "d.unlistened"}
        if t == "d.probe":
            nonce = msg.get("nonce")
            return {"t": "d.probed", "results": _probe_all(list(msg.get("targets", [])), float(msg.get("timeout", 3.0)),
                                                           bytes(nonce) if nonce else None)}
        if t == "d.fs-write":
            return {"t": "d.fs-written", **self._fs_write(msg)}
        if t == "d.fs-read":
            return {"t": "d.fs-read", **self._fs_read(msg)}
        if t == "d.fs-clean":
            try:
                (Path(self._logs()) / str(msg["name"])).unlink()
            except OSError:
                pass
            return {"t": "d.fs-cleaned"}
        if t == "d.agg-start":
            return {"t": "d.agg-started", **self._agg_start(msg)}
        if t == "d.agg-send":
            return {"t": "d.agg-sent", **self._agg_send(msg)}
        if t == "d.agg-finish":
            return {"t": "d.agg-finished", **self._agg_finish(msg)}
        if t == "d.lp-serve":
            return {"t": "d.lp-serving", **self._lp_serve(msg)}
        if t == "d.lp-run":
            return {"t": "d.lp-result", "probe": self._lp_run(msg)}
        if t == "d.lp-stop":
            self._lp_stop()
            return {"t": "d.lp-stopped"}
        if t == "d.torch":
            args = [str(a) for a in msg.get("args", [])]
            r = run_probe(args, float(msg.get("timeout", 20.0)), self.ctx.environ)
            return {"t": "d.torch", "ok": r.ok, "data": r.data, "error": r.error, "seconds": round(r.seconds, 3),
                    "timed_out": r.timed_out}
        return {"t": "d.error", "error": f"unknown command {t!r}"}

    # -- the link probe between the agents (cross.link-bandwidth) ----------------------------------

    def _lp_identity(self, msg: dict[str, Any]) -> Any:
        from traceml_core.linkprobe.probe import ProbeRun

        return ProbeRun(token=probe_token(self.ctx.environ.get(ENV_TOKEN, "")), run=str(msg["run"]),
                        job=msg.get("job"), nnodes=int(msg["nnodes"]), port=0)

    def _lp_serve(self, msg: dict[str, Any]) -> dict[str, Any]:
        """This node's probe server, as ``traceml run``'s launcher starts it (an ephemeral port:
        the doctor may run beside a job that holds the real one)."""
        from traceml_core.linkprobe.probe import ProbeServer

        self._lp_stop()
        try:
            self.probe_server = ProbeServer(self._lp_identity(msg), int(msg["node"])).start()
        except (OSError, KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "port": self.probe_server.port}

    def _lp_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Node 0: the probe's rounds over every node's server (never raises)."""
        from traceml_core.linkprobe.analysis import failed
        from traceml_core.linkprobe.probe import coordinate

        try:
            return coordinate(self._lp_identity(msg), [str(h) for h in msg["hosts"]],
                              ports=[int(p) for p in msg["ports"]], nbytes=int(msg["nbytes"]),
                              wait_s=float(msg.get("wait", 5.0)), budget_s=float(msg.get("budget", 30.0)))
        except (KeyError, TypeError, ValueError) as exc:
            return failed(f"malformed request ({type(exc).__name__}: {exc})")

    def _lp_stop(self) -> None:
        if self.probe_server is not None:
            self.probe_server.close()
            self.probe_server = None

    # -- the real aggregator on node 0, fed by every node ------------------------------------------

    def _agg_start(self, msg: dict[str, Any]) -> dict[str, Any]:
        import tempfile

        from traceml_core.aggregator.process import start_aggregator
        from traceml_core.aggregator.settings import AggregatorSettings
        from traceml_core.errors import TraceMLError

        self.aggregator_dir = tempfile.mkdtemp(prefix="traceml-doctor-aggregator-")
        token = aggregator_token(self.ctx.environ.get(ENV_TOKEN, ""))
        settings = AggregatorSettings(
            run_name=str(msg["run"]), token=token, run_dir=Path(self.aggregator_dir) / str(msg["run"]),
            job_id=msg.get("job"), bind_host=str(msg["bind_host"]), port=int(msg["port"]), nnodes=int(msg["nnodes"]),
            nproc_per_node=1, node_join_window_s=float(msg.get("wait", 10.0)), master_addr=str(msg.get("master_addr", "")),
            port_source="doctor")
        try:
            self.aggregator = start_aggregator(settings, ready_timeout=float(msg.get("wait", 10.0)))
        except TraceMLError as exc:
            self._agg_cleanup()
            return {"ok": False, "error": str(exc)}
        except OSError as exc:
            self._agg_cleanup()
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "port": self.aggregator.port}

    def _agg_send(self, msg: dict[str, Any]) -> dict[str, Any]:
        """What a node does in a real run: start its relay (which joins node 0's aggregator as the
        node's link), connect a training process to it (hello kind "rank"), send a few step
        records and a bye, then close the relay with the node's bye."""
        from traceml_core.launcher.relay import Relay
        from traceml_core.wire.auth import make_hello, relay_aud
        from traceml_core.wire.client import Link, LinkError
        from traceml_core.wire.protocol import STEP_COLUMNS

        host, port, rank = str(msg["host"]), int(msg["port"]), int(msg["rank"])
        world, run, job = int(msg["world"]), str(msg["run"]), msg.get("job")
        timeout = float(msg.get("timeout", 3.0))
        reach = probe(host, port, timeout, None)
        if reach.get("status") != "ok":
            return {"ok": False, "stage": "connect", **reach}
        token = aggregator_token(self.ctx.environ.get(ENV_TOKEN, ""))
        t0 = time.monotonic()
        try:
            relay = Relay(token=token, run_name=run, job_id=job, node=rank, nnodes=world, nproc_per_node=1,
                          upstream=(reach["addr"], port), hostname=self.node, flush_s=0.0,
                          warn=lambda _m: None, client_options={"connect_timeout": timeout}).start()
        except OSError as exc:
            return {"ok": False, "stage": "connect", "detail": exc.strerror or str(exc)}
        try:
            if not relay.wait_connected(timeout):
                cs = relay.client.stats()
                return {"ok": False, "stage": "hello", "detail": str(cs.refused or cs.last_error or
                                                                   "no answer to the hello")}
            link = Link.connect(relay.host, relay.port, lambda: make_hello(
                token, aud=relay_aud(rank), run=run, job=job, node=rank, rank=rank, kind="rank",
                host=self.node, world=world, extra={"local_rank": 0}), timeout=timeout)
            n, now = TEST_RECORDS, time.time_ns()
            cols = {c: [-1] * n for c in STEP_COLUMNS}
            cols.update(step=list(range(n)), t_end_ns=[now] * n, step_ns=[1_000_000] * n)
            link.send({"t": "steps", "rank": rank, "seq": 0, "n": n, "cols": cols, "dropped": 0})
            link.send({"t": "bye", "rank": rank, "status": "clean", "steps": n, "dropped": 0, "error": None})
            link.close()
            if not relay.drain(timeout):
                return {"ok": False, "stage": "send", "detail": "the relay could not forward the records in time"}
        except (LinkError, OSError) as exc:
            return {"ok": False, "stage": "send", "detail": str(exc)}
        finally:
            relay.close(timeout, bye={"t": "bye", "status": "clean", "exit_code": 0})
        return {"ok": True, "records": TEST_RECORDS, "ms": round((time.monotonic() - t0) * 1000, 1),
                "addr": reach.get("addr")}

    def _agg_finish(self, msg: dict[str, Any]) -> dict[str, Any]:
        h = self.aggregator
        if h is None:
            return {"ok": False, "error": "no aggregator was started here"}
        expect = int(msg.get("expect", 1))
        deadline = time.monotonic() + float(msg.get("wait", 3.0))
        status = h.status() or {}
        while int(status.get("records", 0)) < expect * TEST_RECORDS and time.monotonic() < deadline:
            time.sleep(0.1)
            status = h.status() or {}
        result = h.finish(0, reason="traceml slurm doctor test")
        ranks: list[dict[str, Any]] = []
        error = result.error
        if result.summary_json is not None:
            try:
                summary = json.loads(Path(result.summary_json).read_text())
                ranks = [{"rank": r.get("rank"), "node": r.get("node"), "host": r.get("host"), "steps": r.get("steps")}
                         for r in summary.get("ranks", [])]
            except (OSError, ValueError) as exc:
                error = f"cannot read the summary: {exc}"
        self.aggregator = None
        self._agg_cleanup()
        return {"ok": result.summary_json is not None, "status": status, "ranks": ranks, "error": error}

    def _agg_cleanup(self) -> None:
        import shutil

        if self.aggregator is not None:
            self.aggregator.kill()
            self.aggregator = None
        if self.aggregator_dir:
            shutil.rmtree(self.aggregator_dir, ignore_errors=True)
            self.aggregator_dir = None

    def _logs(self) -> str:
        return str(absolute(self.ctx, logs_dir(self.ctx)[0]))

    def _fs_write(self, msg: dict[str, Any]) -> dict[str, Any]:
        path = Path(self._logs()) / str(msg["name"])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.write(bytes(msg["nonce"]))
                f.flush()
                os.fsync(f.fileno())
            return {"ok": True, "path": str(path)}
        except OSError as exc:
            return {"ok": False, "path": str(path), "error": exc.strerror or str(exc)}

    def _fs_read(self, msg: dict[str, Any]) -> dict[str, Any]:
        path = Path(self._logs()) / str(msg["name"])
        want = bytes(msg["nonce"])
        deadline = time.monotonic() + float(msg.get("wait", 2.0))
        last = "not found"
        while True:
            try:
                got = path.read_bytes()
                if got == want:
                    return {"found": True, "match": True, "path": str(path)}
                last = "found, but with other content (another run's file?)"
            except FileNotFoundError:
                last = "not found"
            except OSError as exc:
                last = exc.strerror or str(exc)
            if time.monotonic() >= deadline:
                return {"found": False, "match": False, "path": str(path), "error": last}
            time.sleep(0.1)  # NFS may need a moment to show a file created on another client

    def serve(self) -> None:
        while True:
            msg = recv_by(self.link, time.monotonic() + self.idle_s)
            if msg is None or msg.get("t") == "d.bye":
                return
            reply = self.handle(msg)
            if reply is not None:
                self.link.send(reply)

    def close(self) -> None:
        if self.listeners:
            self.listeners.close()
        self._agg_cleanup()
        self._lp_stop()
        self.ctx.close()
        self.link.close()


def main() -> int:
    env = dict(os.environ)
    addr, token = env.get(ENV_ADDR), env.get(ENV_TOKEN)
    if not addr or not token:
        sys.stderr.write("traceml doctor agent: started without TRACEML_DOCTOR_ADDR/TOKEN; it is started by "
                         "`traceml slurm doctor`, not by hand.\n")
        return 2
    try:
        options = Options.from_wire(json.loads(env.get(ENV_OPTS) or "{}"))
    except ValueError:
        options = Options()
    name = node_name(env)
    progress = Progress(verbose=options.verbose, prefix=f"traceml doctor agent {name}")
    nodeid = env.get("SLURM_NODEID", "")
    rank = int(nodeid) if nodeid.isdigit() else 0
    try:
        link = connect_back(addr, time.monotonic() + options.timeout,
                            lambda: doctor_hello(token, node=rank, host=name), name)
    except LinkRefused as exc:
        progress.log(f"the doctor did not welcome this agent: {exc.reason}")
        return 3
    except (OSError, LinkError) as exc:
        progress.log(str(exc))
        return 3
    ctx = NodeContext(env, options, progress=progress)
    agent = Agent(ctx, link)
    try:
        outcomes = run_checks(NODE_SPECS, ctx)
        link.send({"t": "d.local", "node": name, "outcomes": plain({k: o.to_wire() for k, o in outcomes.items()}),
                   "facts": plain(collect_facts(ctx, outcomes))})
        agent.serve()
    except (OSError, ConnectionError) as exc:
        progress.log(f"lost the doctor: {exc}")
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
