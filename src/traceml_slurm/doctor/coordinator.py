"""The coordinator: from a batch shell, salloc shell or interactive step, start one agent per node
with ``srun --overlap --ntasks-per-node=1``, gather them over TCP on the calling host, and run the
cross-node phases (clock, ports, shared logs dir, gloo all-reduce, NCCL sweep with --full).

Every wait has a deadline and, past a second, a message on stderr naming what it waits for.
The agents get the coordinator's address, a fresh random token (for the hello's HMAC) and the
options through the srun environment; nothing is written to disk.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from traceml_core.wire.auth import NonceCache, check_hello
from traceml_core.wire.client import Link
from traceml_core.wire.server import Conn, FramedServer, Handler, Limits

from . import crossnode
from .model import CheckResult, Outcome, skipped
from .network import is_loopback, resolve_host
from .node import NodeContext, Options
from .progress import Progress
from .registry import NODE_SPECS, is_ignored
from .thresholds import CONNECT_TIMEOUT_S, NCCL_SWEEP_BYTES
from .wire import ENV_ADDR, ENV_OPTS, ENV_TOKEN, command, doctor_endpoint, gather, recv_by

AGENT_MODULE = "traceml_slurm.doctor.agent"


class DoctorCannotRun(Exception):
    """The doctor itself cannot run (exit 3): no srun, no socket. The message is for the user."""


def advertised_addresses(nodes: list[str]) -> list[str]:
    """Addresses of this host that the job's nodes can reach: the source address of our route to each
    of (the first few) nodes, then what our hostname resolves to. Loopback never."""
    out: list[str] = []
    for node in nodes[:3]:
        addrs, _err = resolve_host(node)
        for a in addrs[:1]:
            try:
                s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    s.connect((a, 9))
                    src = s.getsockname()[0]
                finally:
                    s.close()
            except OSError:
                continue
            if not is_loopback(src) and src not in out:
                out.append(src)
    for a in resolve_host(socket.gethostname())[0]:
        if not is_loopback(a) and a not in out and ":" not in a:
            out.append(a)
    return out or [socket.gethostname()]


class _AgentGate(Handler):
    """The coordinator's rules while the agents arrive: a doctor hello (fresh nonce, this run's
    token), then the agent's ``d.local`` report."""

    def __init__(self, token: str, nnodes: int, t0: float) -> None:
        self.endpoint = doctor_endpoint(token, nnodes)
        self.nonces = NonceCache()
        self.answered: dict[str, float] = {}
        self.locals: dict[str, dict[str, Any]] = {}

    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Any:
        return check_hello(msg, self.endpoint, self.nonces)

    def on_accept(self, conn: Conn) -> None:
        assert conn.ident is not None
        conn.user = conn.ident.host or "?"
        self.answered[conn.user] = time.monotonic()

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        if msg.get("t") == "d.local" and conn.user not in self.locals:
            self.locals[conn.user] = msg

    def on_close(self, conn: Conn) -> None:
        pass


@dataclass
class Agents:
    """What the gathering produced."""

    links: dict[str, Link] = field(default_factory=dict)
    locals: dict[str, dict[str, Any]] = field(default_factory=dict)
    answered_after: dict[str, float] = field(default_factory=dict)
    srun_note: Optional[str] = None
    waited_s: float = 0.0


class Coordinator:
    def __init__(self, ctx: NodeContext, progress: Progress, *, srun: Optional[str] = None) -> None:
        self.ctx = ctx
        self.options: Options = ctx.options
        self.progress = progress
        self.srun = srun or shutil.which("srun", path=ctx.facts.env.path)
        self.proc: Optional[subprocess.Popen[str]] = None
        self.srun_lines: collections.deque[str] = collections.deque(maxlen=40)
        self.server: Optional[socket.socket] = None
        self.token = secrets.token_hex(16)

    # -- start ---------------------------------------------------------------------------------

    def srun_command(self, n: int) -> list[str]:
        return [str(self.srun), "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=0", "--export=ALL", "--input=none",
                self.ctx.python, "-m", AGENT_MODULE]

    def start(self, nodes: list[str]) -> None:
        if not self.srun:
            raise DoctorCannotRun("`srun` is not on PATH here, so the doctor cannot start its agents on the nodes. "
                                  "Load the Slurm module (or run where srun exists), or use --local to check this node.")
        try:
            self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.server.bind(("0.0.0.0", 0))
            self.server.listen(max(16, len(nodes)))
        except OSError as exc:
            raise DoctorCannotRun(f"cannot open a TCP port for the agents on this host: {exc}") from None
        port = self.server.getsockname()[1]
        addrs = advertised_addresses(nodes)
        env = dict(self.ctx.child_environ)
        env[ENV_ADDR] = ",".join(addrs) + f":{port}"
        env[ENV_TOKEN] = self.token
        env[ENV_OPTS] = json.dumps(self.options.to_wire())
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = self.srun_command(len(nodes))
        self.progress.debug(f"agents: {' '.join(cmd)} (they connect to {env[ENV_ADDR]})")
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                                         cwd=self.ctx.cwd)
        except OSError as exc:
            raise DoctorCannotRun(f"cannot run srun ({self.srun}): {exc}") from None
        threading.Thread(target=self._read_srun, daemon=True).start()

    def _read_srun(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip()
            if line:
                self.srun_lines.append(line)
                self.progress.debug(f"srun| {line}")

    def srun_note(self) -> Optional[str]:
        lines = [ln for ln in self.srun_lines if "srun:" in ln or "error" in ln.lower()]
        return " / ".join(lines[-3:]) if lines else None

    # -- gather --------------------------------------------------------------------------------

    def gather_agents(self, nodes: list[str]) -> Agents:
        assert self.server is not None
        out = Agents()
        t0 = time.monotonic()
        local_grace = self.options.timeout + 5.0  # the agent's own checks are bounded by --timeout
        gate = _AgentGate(self.token, len(nodes), t0)
        net = FramedServer(self.server, gate, counters={}, log=self.progress.debug, name="doctor",
                           limits=Limits(hello_timeout_s=self.options.timeout, max_pending=max(64, 4 * len(nodes))))
        srun_done_at: Optional[float] = None

        def missing() -> list[str]:
            return [n for n in nodes if n not in gate.locals]

        what = f"agents on {len(nodes)} node{'s' if len(nodes) != 1 else ''} (srun step, then their local checks)"
        try:
            with self.progress.waiting(what, local_grace + self.options.timeout):
                while missing():
                    now = time.monotonic()
                    if self.proc is not None and self.proc.poll() is not None and srun_done_at is None:
                        srun_done_at = now
                    if srun_done_at is not None and now - srun_done_at > 1.0:
                        break
                    hello_over = now > t0 + self.options.timeout
                    if hello_over and not net.pending and all(
                            now > gate.answered.get(n, t0) + local_grace for n in missing()):
                        break
                    net.step(0.2)
                    for name in list(gate.answered):
                        if name not in out.answered_after:
                            out.answered_after[name] = gate.answered[name] - t0
                            self.progress.debug(f"{name} connected after {out.answered_after[name]:.1f} s")
            # the agents that reported: from here on, plain request/response on blocking links
            for conn in list(net.conns):
                name = conn.user
                if name in gate.locals and name not in out.links:
                    sock, rest = net.detach(conn)
                    out.links[name] = Link(sock, name, rest)
                    out.locals[name] = gate.locals[name]
        finally:
            for conn in list(net.pending) + list(net.conns):
                net.close(conn)
            net.poller.close()
        out.waited_s = time.monotonic() - t0
        for name in missing():
            out.answered_after.pop(name, None)
        if missing():
            out.srun_note = self.srun_note()
        return out

    # -- phases --------------------------------------------------------------------------------

    def ask(self, targets: Mapping[str, dict[str, Any]], links: Mapping[str, Link], bound: float,
            what: str) -> dict[str, dict[str, Any]]:
        """Send each node its command, gather the answers in parallel within ``bound`` seconds."""
        live = {}
        for node, msg in targets.items():
            link = links.get(node)
            if link is None or link.closed:
                continue
            try:
                link.send(msg)
                live[node] = link
            except OSError:
                link.closed = True
        with self.progress.waiting(what, bound):
            return gather(live.values(), time.monotonic() + bound)

    def clock_phase(self, links: Mapping[str, Link]) -> dict[str, tuple[float, float]]:
        offsets: dict[str, tuple[float, float]] = {}
        for node, link in links.items():
            best: Optional[tuple[float, float]] = None
            for _ in range(3):
                t0 = time.time()
                try:
                    link.send(command("d.clock"))
                except OSError:
                    break
                reply = recv_by(link, time.monotonic() + 2.0)
                t1 = time.time()
                if not reply or "now" not in reply:
                    break
                rtt = t1 - t0
                off = float(reply["now"]) - (t0 + t1) / 2.0
                if best is None or rtt < best[1]:
                    best = (off, rtt)
            if best is not None:
                offsets[node] = best
        return offsets

    def ports_phase(self, facts: Mapping[str, Mapping[str, Any]], links: Mapping[str, Link], node0: str
                    ) -> tuple[dict[str, Any], dict[str, str], str]:
        c0 = facts[node0]["config"]
        bind = c0["aggregator_bind_host"]
        ask = command("d.listen", ports=[{"port": c0["master_port"], "host": "0.0.0.0"},
                                         {"port": c0["aggregator_port"], "host": bind}])
        ans = self.ask({node0: ask}, links, 5.0, "node 0 to open its ports").get(node0) or {}
        port_status = ans.get("ports") or {}
        listening = {"rendezvous": port_status.get(str(c0["master_port"]), "no answer from node 0"),
                     "aggregator": port_status.get(str(c0["aggregator_port"]), "no answer from node 0")}
        nonce = ans.get("nonce")
        probes = {}
        for node, f in facts.items():
            c = f.get("config")
            if not c:
                continue
            agg_host = c["aggregator_host"]
            if node == node0:  # node 0's own workers reach the aggregator as the launcher tells them
                agg_host = "127.0.0.1" if c["aggregator_bind_host"] in ("0.0.0.0", "::") else c["aggregator_bind_host"]
            probes[node] = command("d.probe", timeout=CONNECT_TIMEOUT_S, nonce=nonce, targets=[
                {"label": "rendezvous", "host": c["master_addr"], "port": c["master_port"]},
                {"label": "aggregator", "host": agg_host, "port": c["aggregator_port"]}])
        got = self.ask(probes, links, CONNECT_TIMEOUT_S + 3.0,
                       f"every node to connect to node 0's ports (at most {CONNECT_TIMEOUT_S:.0f} s each)")
        self.ask({node0: command("d.unlisten")}, links, 3.0, "node 0 to close its ports")
        reach = {node: (r.get("results") or {}) for node, r in got.items()}
        for node in probes:
            reach.setdefault(node, {"rendezvous": {"status": "error", "detail": "no answer from the agent"},
                                    "aggregator": {"status": "error", "detail": "no answer from the agent"}})
        return reach, listening, bind

    def fs_phase(self, facts: Mapping[str, Mapping[str, Any]], links: Mapping[str, Link], node0: str
                 ) -> dict[str, Outcome]:
        name = f".traceml-doctor-shared-{secrets.token_hex(6)}"
        nonce = secrets.token_bytes(16)
        written = self.ask({node0: command("d.fs-write", name=name, nonce=nonce)}, links, 5.0,
                           "node 0 to write a file in the logs dir").get(node0) or {"ok": False, "error": "no answer"}
        reads: dict[str, Any] = {}
        if written.get("ok"):
            others = {n: command("d.fs-read", name=name, nonce=nonce, wait=2.0) for n in facts if n != node0}
            reads = self.ask(others, links, 6.0, "the other nodes to read node 0's file")
            for n in others:
                reads.setdefault(n, {"match": False, "error": "no answer from the agent", "path": "?"})
            self.ask({node0: command("d.fs-clean", name=name)}, links, 3.0, "node 0 to remove its file")
        c0 = facts[node0].get("config") or {}
        summary = os.path.join(str(facts[node0].get("logs_dir")), str(c0.get("run_name", "<run-name>")), "final_summary.json")
        return crossnode.logs_shared(node0, written, reads, summary)

    def torch_phase(self, kind: str, facts: Mapping[str, Mapping[str, Any]], links: Mapping[str, Link],
                    timeout: float) -> dict[str, Any]:
        world = len(facts)
        cmds = {}
        for node, f in facts.items():
            c = f["config"]
            args = [kind, c["master_addr"], c["master_port"], f["node_rank"], world, timeout]
            if kind == "nccl":
                args.append(",".join(str(s) for s in NCCL_SWEEP_BYTES))
            cmds[node] = command("d.torch", args=args, timeout=timeout + 5.0)
        label = "a gloo all-reduce across the nodes" if kind == "gloo" else "the NCCL bandwidth sweep"
        got = self.ask(cmds, links, timeout + 10.0, f"{label} (torch in a child process on each node)")
        for node in cmds:
            got.setdefault(node, {})
        return got

    def aggregator_phase(self, facts: Mapping[str, Mapping[str, Any]], links: Mapping[str, Link], node0: str
                         ) -> dict[str, Outcome]:
        """Node 0 starts the real aggregator on the real port; every node sends test step records to
        it as a training process would; node 0 finishes it and reads the summary."""
        c0 = facts[node0]["config"]
        run = f"traceml-doctor-{secrets.token_hex(4)}"
        wait = min(self.options.timeout, 15.0)
        started = self.ask({node0: command("d.agg-start", run=run, job=self.ctx.job_id, port=c0["aggregator_port"],
                                           bind_host=c0["aggregator_bind_host"], nnodes=len(facts), wait=wait,
                                           master_addr=c0["master_addr"])},
                           links, wait + 5.0, "node 0 to start the aggregator").get(node0) or {"ok": False}
        ranks = {n: int(f["node_rank"]) for n, f in facts.items()}
        sent: dict[str, Any] = {}
        finished: dict[str, Any] = {}
        if started.get("ok"):
            cmds = {}
            for node, f in facts.items():
                c = f["config"]
                host = c["aggregator_host"]
                if node == node0:  # as the launcher tells node 0's workers
                    host = "127.0.0.1" if c["aggregator_bind_host"] in ("0.0.0.0", "::") else c["aggregator_bind_host"]
                cmds[node] = command("d.agg-send", host=host, port=c["aggregator_port"], run=run,
                                     job=self.ctx.job_id, rank=ranks[node], world=len(facts),
                                     timeout=CONNECT_TIMEOUT_S)
            sent = self.ask(cmds, links, CONNECT_TIMEOUT_S * 2 + 3.0, "every node to send test telemetry to node 0")
            for node, cmd in cmds.items():
                sent.setdefault(node, {"ok": False, "stage": "agent", "detail": "no answer from the agent"})
                sent[node].setdefault("host", cmd["host"])
                sent[node].setdefault("port", cmd["port"])
            finished = self.ask({node0: command("d.agg-finish", expect=len(facts), wait=3.0)}, links, 25.0,
                                "node 0's aggregator to write its summary").get(node0) or {}
        return crossnode.aggregator(started, sent, finished, ranks, node0)

    def link_probe_phase(self, facts: Mapping[str, Mapping[str, Any]], links: Mapping[str, Link]
                         ) -> dict[str, Outcome]:
        """The link probe of ``traceml run`` between the agents: every node serves it, node 0's
        agent runs the rounds (so the coordinator's host need not reach the nodes)."""
        from traceml_core import selftest

        names = [n for n, _ in sorted(facts.items(), key=lambda kv: int(kv[1]["node_rank"]))]
        ident = {"run": f"traceml-doctor-{secrets.token_hex(4)}", "job": self.ctx.job_id, "nnodes": len(names)}
        serving = self.ask({n: command("d.lp-serve", **ident, node=i) for i, n in enumerate(names)}, links, 5.0,
                           "every node to start its link probe server")
        ports = [int((serving.get(n) or {}).get("port") or 0) for n in names]
        wait = 5.0
        try:
            if not ports[0]:
                probe = selftest.probe_failed(f"node 0's agent could not serve the probe: "
                               f"{(serving.get(names[0]) or {}).get('error') or 'no answer'}")
            else:
                asked = {names[0]: command("d.lp-run", **ident, hosts=names, ports=ports,
                                           nbytes=selftest.DEFAULT_BYTES, wait=wait, budget=selftest.ROUNDS_BUDGET_S)}
                got = self.ask(asked, links, wait + selftest.ROUNDS_BUDGET_S + 15.0,
                               "node 0 to measure the links between the nodes (link probe)")
                probe = (got.get(names[0]) or {}).get("probe") or selftest.probe_failed("no answer from node 0's agent")
        finally:
            self.ask({n: command("d.lp-stop") for n in names}, links, 3.0, "the nodes to stop their probe servers")
        return crossnode.link_bandwidth(probe, names)

    # -- end -----------------------------------------------------------------------------------

    def stop(self, links: Mapping[str, Link]) -> None:
        for link in links.values():
            try:
                link.send(command("d.bye"))
            except OSError:
                pass
            link.close()
        if self.server is not None:
            self.server.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.progress.debug("srun did not end; stopping the agent step")
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=3.0)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    self.proc.wait(timeout=3.0)

    # -- all of it -----------------------------------------------------------------------------

    def run(self, nodes: list[str]) -> tuple[list[CheckResult], list[str]]:
        """Node and cross-node results (job-scope checks are run by the caller meanwhile)."""
        notes: list[str] = []
        opts = self.options
        self.start(nodes)
        agents = Agents()
        try:
            agents = self.gather_agents(nodes)
            results = self._node_results(agents)
            results += self._cross_results(nodes, agents, notes)
        finally:
            self.stop(agents.links)
        if opts.verbose and self.srun_lines:
            notes.append("srun output: " + " / ".join(list(self.srun_lines)[-5:]))
        return results, notes

    def _node_results(self, agents: Agents) -> list[CheckResult]:
        out = []
        for spec in NODE_SPECS:
            r = CheckResult(spec.id, spec.title, spec.scope, ignored=is_ignored(spec.id, self.options.ignore))
            for node, msg in agents.locals.items():
                raw = (msg.get("outcomes") or {}).get(spec.id)
                if raw:
                    r.nodes[node] = Outcome.from_wire(raw)
            out.append(r)
        return out

    def _cross_results(self, nodes: list[str], agents: Agents, notes: list[str]) -> list[CheckResult]:
        opts = self.options
        facts = {n: m.get("facts") or {} for n, m in agents.locals.items()}
        links = agents.links
        res: dict[str, dict[str, Outcome]] = {}

        def want(cid: str) -> bool:
            return not is_ignored(cid, opts.ignore)

        res["cross.answers"] = crossnode.answers(nodes, agents.answered_after, opts.timeout, agents.srun_note)
        for o in res["cross.answers"].values():
            o.duration_s = agents.waited_s
        answered = list(facts)
        node0 = crossnode.node0_of(facts)
        nnodes = len(nodes)
        res["cross.node-ranks"] = crossnode.node_ranks(facts, nnodes) if facts else {}
        if nnodes < 2:
            why = "one node: nothing to compare or reach across"
            for cid, _ in crossnode.CROSS[2:]:
                res[cid] = crossnode.skip_all(answered, why)
            return self._as_results(res)
        res["cross.config-agrees"] = crossnode.config_agrees(facts) if facts else {}
        res["cross.master-address"] = crossnode.master_address(facts) if facts else {}
        res["cross.versions"] = crossnode.versions(facts) if facts else {}
        if want("cross.clock-skew") and links:
            t = time.monotonic()
            res["cross.clock-skew"] = crossnode.clock_skew(self.clock_phase(links), node0)
            self._timed(res, "cross.clock-skew", t)
        have0 = node0 is not None and (facts.get(node0) or {}).get("config") is not None
        no0 = ("node 0 did not answer" if node0 is None else "node 0's launch config does not resolve")
        if want("cross.ports-reachable"):
            if have0:
                t = time.monotonic()
                reach, listening, bind = self.ports_phase(facts, links, str(node0))
                res["cross.ports-reachable"] = crossnode.ports_reachable(reach, listening, str(node0), bind)
                self._timed(res, "cross.ports-reachable", t)
            else:
                res["cross.ports-reachable"] = crossnode.skip_all(answered, no0)
        if want("cross.logs-shared"):
            t = time.monotonic()
            res["cross.logs-shared"] = (self.fs_phase(facts, links, str(node0)) if node0 is not None
                                        else crossnode.skip_all(answered, "node 0 did not answer"))
            self._timed(res, "cross.logs-shared", t)
        all_in = len(facts) == nnodes and all(f.get("config") for f in facts.values())
        ranks_ok = sorted(f.get("node_rank") for f in facts.values() if f.get("node_rank") is not None) == list(range(nnodes))
        why_not = ("not every node answered (see cross.answers)" if len(facts) != nnodes else
                   "the launch config does not resolve on every node" if not all_in else
                   "node ranks are not 0..N-1 (see cross.node-ranks)")
        if want("cross.gloo-allreduce"):
            if all_in and ranks_ok:
                t = time.monotonic()
                got = self.torch_phase("gloo", facts, links, min(opts.timeout, 30.0))
                res["cross.gloo-allreduce"] = crossnode.gloo_allreduce(got, nnodes)
                self._timed(res, "cross.gloo-allreduce", t)
            else:
                res["cross.gloo-allreduce"] = crossnode.skip_all(answered, why_not)
        if want("cross.aggregator"):
            if all_in and ranks_ok:
                t = time.monotonic()
                res["cross.aggregator"] = self.aggregator_phase(facts, links, str(node0))
                self._timed(res, "cross.aggregator", t)
            else:
                res["cross.aggregator"] = crossnode.skip_all(answered, why_not)
        if want("cross.link-bandwidth"):
            if all_in and ranks_ok:
                t = time.monotonic()
                res["cross.link-bandwidth"] = self.link_probe_phase(facts, links)
                self._timed(res, "cross.link-bandwidth", t)
            else:
                res["cross.link-bandwidth"] = crossnode.skip_all(answered, why_not)
        if want("cross.compute-speed"):
            # measured by every node's torch child at its start (torchprobe: info --bench), all at once
            res["cross.compute-speed"] = crossnode.compute_speed({n: f.get("bench") for n, f in facts.items()})
        if want("cross.nccl-bandwidth"):
            if not opts.full:
                res["cross.nccl-bandwidth"] = crossnode.skip_all(answered, "runs with --full only")
            elif not all(f.get("gpus") and f.get("torch_cuda") and f.get("torch_devices") for f in facts.values()):
                res["cross.nccl-bandwidth"] = crossnode.skip_all(answered, "no GPU with a CUDA torch on every node")
            elif all_in and ranks_ok:
                t = time.monotonic()
                got = self.torch_phase("nccl", facts, links, max(60.0, opts.timeout))
                res["cross.nccl-bandwidth"] = crossnode.nccl_bandwidth(got)
                self._timed(res, "cross.nccl-bandwidth", t)
            else:
                res["cross.nccl-bandwidth"] = crossnode.skip_all(answered, why_not)
        return self._as_results(res)

    @staticmethod
    def _timed(res: dict[str, dict[str, Outcome]], cid: str, t0: float) -> None:
        for o in (res.get(cid) or {}).values():
            o.duration_s = time.monotonic() - t0

    def _as_results(self, res: dict[str, dict[str, Outcome]]) -> list[CheckResult]:
        out = []
        for cid, title in crossnode.CROSS:
            r = CheckResult(cid, title, "cross", ignored=is_ignored(cid, self.options.ignore))
            if not r.ignored:
                r.nodes = dict(res.get(cid) or {})
            out.append(r)
        return out


def cross_skipped(why: str, options: Options, host: str) -> list[CheckResult]:
    """The cross-node checks, all skipped for one reason (one node, not in a job, ...)."""
    out = []
    for cid, title in crossnode.CROSS:
        ignored = is_ignored(cid, options.ignore)
        out.append(CheckResult(cid, title, "cross", {} if ignored else {host: skipped(why)}, ignored=ignored))
    return out


__all__ = ["Coordinator", "DoctorCannotRun", "advertised_addresses", "cross_skipped"]
