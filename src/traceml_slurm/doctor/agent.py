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
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from traceml_core import selftest
from traceml_core.errors import ConfigError
from traceml_core.selftest import TEST_RECORDS, TestAggregator, send_test_telemetry
from traceml_core.wire.client import Backoff, Link, LinkError, LinkRefused

from .filesystem import absolute, logs_dir
from .model import Outcome
from .network import resolve_host
from .node import NodeContext, Options
from .progress import Progress
from .registry import NODE_SPECS, run_checks
from .torchprobe import TorchInfo, run_probe
from .wire import (ENV_ADDR, ENV_CLOCK_HOOK, ENV_OPTS, ENV_TOKEN, aggregator_token, dispatch, doctor_hello,
                   parse_clock_hook, probe_token, recv_by)


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


def _bench(torch: Optional[TorchInfo]) -> Optional[dict[str, Any]]:
    """The micro-benchmarks' figures; when the probe ran out of time first, why (the cross-node
    compute check then says "not measured: the micro-benchmarks did not finish within 15 s")."""
    if torch is None:
        return None
    if torch.bench is None and torch.stalled is not None:
        return {"cpu": {"error": torch.stall_words}}
    return torch.bench


def collect_facts(ctx: NodeContext, outcomes: dict[str, Outcome]) -> dict[str, Any]:
    import traceml_core

    co = ctx.launch()
    c = co.config
    torch = ctx._torch_info  # only what the checks already learnt; never start torch for facts
    try:
        nodeid = ctx.facts.vars.nodeid
    except ConfigError:
        nodeid = None
    facts: dict[str, Any] = {
        "node": ctx.node, "hostname": socket.gethostname(), "pid": os.getpid(),
        "slurm_nodeid": None if nodeid is None else str(nodeid), "node_rank": ctx.node_rank(), "cwd": ctx.cwd,
        "config": None, "config_error": co.error,
        "versions": {"python": ctx.python_version, "traceml": getattr(traceml_core, "__version__", "?"),
                     "torch": (torch.version if torch and torch.ok else (f"unusable: {torch.error}" if torch else None))},
        "gpus": ctx.gpus_on_node(),
        "torch_cuda": torch.cuda_build if torch else None,
        "torch_devices": torch.device_count if torch else None,
        "bench": _bench(torch),
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
    """Answers the coordinator's commands (:data:`.wire.COMMANDS`: one method per command)."""

    def __init__(self, ctx: NodeContext, link: Link, *, token: str, clock_offset: float = 0.0) -> None:
        self.ctx = ctx
        self.link = link
        self.node = ctx.node
        #: the doctor's token (the aggregator's and the link probe's are derived from it)
        self.token = token
        self.listeners: Optional[Listeners] = None
        self.aggregator: Optional[TestAggregator] = None  # node 0: the real aggregator, started for the check
        self.probe_server: Optional[Any] = None  # cross.link-bandwidth: this node's link probe server
        self.clock_offset = clock_offset
        #: the agent ends by itself when the coordinator says nothing for this long
        self.idle_s = 4 * ctx.options.timeout + 120

    def handle(self, msg: dict[str, Any]) -> Optional[dict[str, Any]]:
        return dispatch(self, msg)

    # -- clock, ports, files, torch ------------------------------------------------------------------

    def clock(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"now": time.time() + self.clock_offset}

    def listen(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.listeners = self.listeners or Listeners()
        ports = {str(p["port"]): self.listeners.listen(p["host"], int(p["port"])) for p in msg["ports"]}
        return {"ports": ports, "nonce": self.listeners.nonce}

    def unlisten(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.listeners:
            self.listeners.close()
            self.listeners = None
        return {}

    def probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        nonce = msg.get("nonce")
        return {"results": _probe_all(list(msg["targets"]), float(msg.get("timeout", 3.0)),
                                      bytes(nonce) if nonce else None)}

    def torch(self, msg: dict[str, Any]) -> dict[str, Any]:
        args = [str(a) for a in msg["args"]]
        r = run_probe(args, float(msg.get("timeout", 20.0)), self.ctx.child_environ)
        return {"ok": r.ok, "data": r.data, "error": r.error, "seconds": round(r.seconds, 3), "timed_out": r.timed_out}

    # -- the link probe between the agents (cross.link-bandwidth) ----------------------------------

    def _lp_identity(self, msg: dict[str, Any]) -> Any:
        return selftest.ProbeRun(token=probe_token(self.token), run=str(msg["run"]), job=msg.get("job"),
                                 nnodes=int(msg["nnodes"]), port=0)

    def lp_serve(self, msg: dict[str, Any]) -> dict[str, Any]:
        """This node's probe server, as ``traceml run``'s launcher starts it (an ephemeral port:
        the doctor may run beside a job that holds the real one)."""
        self.lp_stop(msg)
        try:
            self.probe_server = selftest.ProbeServer(self._lp_identity(msg), int(msg["node"])).start()
        except (OSError, KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "port": self.probe_server.port}

    def lp_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Node 0: the probe's rounds over every node's server (never raises)."""
        try:
            hosts, ports = [str(h) for h in msg["hosts"]], [int(p) for p in msg["ports"]]
            run = self._lp_identity(msg)
        except (KeyError, TypeError, ValueError) as exc:
            return {"probe": selftest.probe_failed(f"malformed request ({type(exc).__name__}: {exc})")}
        return {"probe": selftest.measure_links(run, hosts, ports, nbytes=int(msg["nbytes"]),
                                                wait_s=float(msg.get("wait", 5.0)), budget_s=float(msg.get("budget", 30.0)))}

    def lp_stop(self, msg: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        if self.probe_server is not None:
            self.probe_server.close()
            self.probe_server = None
        return {}

    # -- the real aggregator on node 0, fed by every node (cross.aggregator) ---------------------------

    def agg_start(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._agg_cleanup()
        wait = float(msg.get("wait", 10.0))
        self.aggregator, error = TestAggregator.start(
            run=str(msg["run"]), token=aggregator_token(self.token), job=msg.get("job"), bind_host=str(msg["bind_host"]),
            port=int(msg["port"]), nnodes=int(msg["nnodes"]), master_addr=str(msg.get("master_addr", "")), wait_s=wait)
        if self.aggregator is None:
            return {"ok": False, "error": error}
        return {"ok": True, "port": self.aggregator.port}

    def agg_send(self, msg: dict[str, Any]) -> dict[str, Any]:
        """What a node does in a real run (selftest.send_test_telemetry), after checking that node 0's
        port answers at all."""
        host, port, timeout = str(msg["host"]), int(msg["port"]), float(msg.get("timeout", 3.0))
        reach = probe(host, port, timeout, None)
        if reach.get("status") != "ok":
            return {"ok": False, "stage": "connect", **reach}
        out = send_test_telemetry(reach["addr"], port, token=aggregator_token(self.token), run=str(msg["run"]),
                                  job=msg.get("job"), rank=int(msg["rank"]), world=int(msg["world"]),
                                  hostname=self.node, timeout=timeout)
        if out.get("ok"):
            out["addr"] = reach.get("addr")
        return out

    def agg_finish(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.aggregator is None:
            return {"ok": False, "error": "no aggregator was started here"}
        agg, self.aggregator = self.aggregator, None
        return agg.finish(int(msg.get("expect", 1)) * TEST_RECORDS, float(msg.get("wait", 3.0)))

    def _agg_cleanup(self) -> None:
        if self.aggregator is not None:
            self.aggregator.close()
            self.aggregator = None

    # -- the shared logs dir (cross.logs-shared) -------------------------------------------------------

    def _logs(self) -> str:
        return str(absolute(self.ctx, logs_dir(self.ctx)[0]))

    def fs_write(self, msg: dict[str, Any]) -> dict[str, Any]:
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

    def fs_read(self, msg: dict[str, Any]) -> dict[str, Any]:
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

    def fs_clean(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            (Path(self._logs()) / str(msg["name"])).unlink()
        except OSError:
            pass
        return {}

    def serve(self) -> None:
        while True:
            msg = recv_by(self.link, time.monotonic() + self.idle_s)
            if msg is None:
                return
            reply = self.handle(msg)
            if reply is None:  # d.bye
                return
            self.link.send(reply)

    def close(self) -> None:
        if self.listeners:
            self.listeners.close()
        self._agg_cleanup()
        self.lp_stop()
        self.ctx.close()
        self.link.close()


@dataclass(frozen=True)
class AgentInputs:
    """What the coordinator hands the agent in the srun step's environment (wire.ENV_*): read once."""

    addr: Optional[str]
    token: Optional[str]
    options: Options
    clock_hook: str

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> "AgentInputs":
        try:
            options = Options.from_wire(json.loads(env.get(ENV_OPTS) or "{}"))
        except ValueError:
            options = Options()
        return cls(env.get(ENV_ADDR), env.get(ENV_TOKEN), options, env.get(ENV_CLOCK_HOOK, ""))


def main() -> int:
    env = dict(os.environ)  # the srun step's environment, read once: the agent's inputs and the facts
    inputs = AgentInputs.from_environ(env)
    if not inputs.addr or not inputs.token:
        sys.stderr.write("traceml doctor agent: started without TRACEML_DOCTOR_ADDR/TOKEN; it is started by "
                         "`traceml slurm doctor`, not by hand.\n")
        return 2
    ctx = NodeContext(env, inputs.options)
    name = ctx.node
    progress = Progress(verbose=inputs.options.verbose, prefix=f"traceml doctor agent {name}")
    ctx.progress = progress
    try:
        rank = ctx.facts.vars.nodeid or 0
    except ConfigError:
        rank = 0
    try:
        link = connect_back(inputs.addr, time.monotonic() + inputs.options.timeout,
                            lambda: doctor_hello(str(inputs.token), node=rank, host=name), name)
    except LinkRefused as exc:
        progress.log(f"the doctor did not welcome this agent: {exc.reason}")
        return 3
    except (OSError, LinkError) as exc:
        progress.log(str(exc))
        return 3
    agent = Agent(ctx, link, token=inputs.token, clock_offset=parse_clock_hook(inputs.clock_hook, name))
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
