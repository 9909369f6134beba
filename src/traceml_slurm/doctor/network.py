"""Network checks on one node: node 0's ports free, the master address resolves, socket interfaces
exist and are up, risky NCCL/CUDA variables reported. Reachability between nodes is in crossnode.py.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import Optional

from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .netinfo import Interface
from .node import NodeContext

#: variable -> (risky value test, why it matters)
RISKY = {
    "NCCL_P2P_DISABLE": "GPU peer-to-peer is off: intra-node all-reduce goes through host memory (slower)",
    "NCCL_IB_DISABLE": "InfiniBand is off: NCCL falls back to TCP sockets (much slower across nodes)",
    "NCCL_SHM_DISABLE": "shared-memory transport is off: intra-node traffic takes a slower path",
    "CUDA_LAUNCH_BLOCKING": "every CUDA kernel runs synchronously: training is much slower and step timings mislead",
    "TORCH_NCCL_BLOCKING_WAIT": "collectives block the CPU thread: slower, and a hang surfaces only at the timeout",
}
#: these are risky when set to 0 (they turn a safety net off)
RISKY_WHEN_ZERO = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "a failed collective hangs the job instead of ending it",
    "NCCL_ASYNC_ERROR_HANDLING": "a failed collective hangs the job instead of ending it",
}


def try_bind(host: str, port: int) -> Optional[OSError]:
    """Bind like a server would (SO_REUSEADDR, so TIME_WAIT leftovers do not count); None when free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(1)
        return None
    except OSError as exc:
        return exc
    finally:
        s.close()


def port_owner(port: int) -> Optional[str]:
    """``pid N (name)`` of the process listening on ``port``, when /proc lets us see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError):
            continue
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    with open(f"/proc/{pid}/comm") as f:
                        return f"pid {pid} ({f.read().strip()})"
        except OSError:
            continue
    return None


def check_ports_free(ctx: NodeContext) -> Outcome:
    out = ctx.launch()
    c = out.config
    if c is None:
        return skipped("the launch config does not resolve (see slurm.launch-config)")
    rank = ctx.node_rank()
    if rank is None:
        return skipped(f"this host is not a node of the job; node 0 is {c.master_addr} (drop --local to check there)")
    if rank != 0:
        return skipped(f"only node 0 listens; this is node {rank}")
    ports = [("rendezvous", "0.0.0.0", c.master_port, "--master-port"),
             ("aggregator", c.aggregator_bind_host, c.aggregator_port, "--aggregator-port")]
    busy, free = [], []
    for label, host, port, flag in ports:
        err = try_bind(host, port)
        if err is None:
            free.append(f"{label} {host}:{port}")
        elif err.errno == errno.EADDRINUSE:
            owner = port_owner(port)
            busy.append((f"{label} port {port} is in use on {ctx.hostname}" + (f" by {owner}" if owner else ""), flag))
        elif err.errno == errno.EADDRNOTAVAIL:
            busy.append((f"{label} bind address {host} is not an address of {ctx.hostname}", "--aggregator-bind-host"))
        else:
            busy.append((f"{label} {host}:{port} cannot be bound: {err.strerror}", flag))
    data = {"master_port": c.master_port, "aggregator_port": c.aggregator_port, "bind_host": c.aggregator_bind_host}
    if busy:
        flags = sorted({f for _, f in busy})
        envs = [f"TRACEML_{f[2:].upper().replace('-', '_')}" for f in flags]
        return failed("; ".join(m for m, _ in busy),
                      f"Stop the process holding it (a leftover run? another job on this node?), or choose another "
                      f"value with {' / '.join(flags)} (or {' / '.join(envs)}).", **data)
    return passed("free: " + ", ".join(free), **data)


def resolve_host(host: str) -> tuple[list[str], Optional[str]]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return [], str(exc.strerror or exc)
    addrs: list[str] = []
    for family, *_rest, sockaddr in infos:
        a = str(sockaddr[0])
        if a not in addrs:
            addrs.append(a)
    addrs.sort(key=lambda a: ":" in a)  # IPv4 first, as torch's TCPStore tries them
    return addrs, None


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def check_master_resolves(ctx: NodeContext) -> Outcome:
    c = ctx.launch().config
    if c is None:
        return skipped("the launch config does not resolve (see slurm.launch-config)")
    data: dict[str, object] = {}
    lines = []
    for label, host in (("master", c.master_addr), ("aggregator", c.aggregator_host)):
        if label == "aggregator" and host == c.master_addr:
            data["aggregator"] = data["master"]
            continue
        addrs, err = resolve_host(host)
        data[label] = addrs
        if err:
            return failed(f"the {label} address {host!r} does not resolve on {ctx.hostname}: {err}", 
                          f"Use a name every node resolves, or node 0's IP: --{'master-addr' if label == 'master' else 'aggregator-host'}=IP.",
                          **data)
        if c.nnodes > 1 and all(is_loopback(a) for a in addrs):
            return failed(f"the {label} address {host} resolves to loopback {', '.join(addrs)} on {ctx.hostname}: "
                          f"other nodes cannot reach that",
                          f"Fix /etc/hosts on {ctx.hostname} ({host} must map to its network address, not 127.0.x.x), "
                          f"or pass node 0's IP with --{'master-addr' if label == 'master' else 'aggregator-host'}.", **data)
        lines.append(f"{label} {host} -> {', '.join(addrs)}")
    return passed("; ".join(lines), **data)


def match_nccl_ifname(spec: str, interfaces: list[Interface]) -> list[Interface]:
    """Interfaces NCCL would consider for NCCL_SOCKET_IFNAME=spec (prefix match, ``=`` exact, ``^`` exclude)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    names = [p.strip() for p in spec.split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(name == n if exact else name.startswith(n) for n in names)

    return [i for i in interfaces if hit(i.name) != exclude]


def check_socket_ifname(ctx: NodeContext) -> Outcome:
    env = ctx.facts.env.comm_vars
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    gloo = env.get("GLOO_SOCKET_IFNAME", "").strip()
    if not nccl and not gloo:
        return passed("NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not set (NCCL and gloo pick an interface)")
    ifaces = ctx.interfaces()
    have = ", ".join(f"{i.name}{'' if i.up else ' (down)'}" for i in ifaces) or "none"
    c = ctx.launch().config
    multi = c is not None and c.nnodes > 1
    problems, lines = [], []
    data: dict[str, object] = {"interfaces": [{"name": i.name, "up": i.up, "addresses": list(i.addresses)} for i in ifaces]}
    if nccl:
        usable = [i for i in match_nccl_ifname(nccl, ifaces) if i.up and i.addresses]
        if multi:
            usable = [i for i in usable if not i.loopback] or usable
        if not usable:
            problems.append(f"NCCL_SOCKET_IFNAME={nccl} matches no interface that is up with an address")
        elif multi and all(i.loopback for i in usable):
            problems.append(f"NCCL_SOCKET_IFNAME={nccl} matches only loopback, which other nodes cannot reach")
        else:
            lines.append(f"NCCL_SOCKET_IFNAME={nccl} -> {', '.join(i.name for i in usable)}")
    if gloo:
        by_name = {i.name: i for i in ifaces}
        for name in [p.strip() for p in gloo.split(",") if p.strip()]:
            i = by_name.get(name)
            if i is None:
                problems.append(f"GLOO_SOCKET_IFNAME names {name}, which does not exist")
            elif not i.up or not i.addresses:
                problems.append(f"GLOO_SOCKET_IFNAME names {name}, which is down or has no address")
            elif multi and i.loopback:
                problems.append(f"GLOO_SOCKET_IFNAME names {name}, loopback, which other nodes cannot reach")
        if not any(p.startswith("GLOO") for p in problems):
            lines.append(f"GLOO_SOCKET_IFNAME={gloo}")
    if problems:
        return failed("; ".join(problems) + f" on {ctx.hostname} (interfaces: {have})",
                      "Set it to the interface that carries traffic between nodes (see `ip -br addr` on a node), or "
                      "unset it so NCCL/gloo choose.", **data)
    return passed("; ".join(lines), **data)


def check_risky_vars(ctx: NodeContext) -> Outcome:
    env = ctx.facts.env.comm_vars
    found = []
    for var, why in RISKY.items():
        v = env.get(var, "").strip()
        if v and v not in ("0", "false", "False"):
            found.append((var, v, why))
    for var, why in RISKY_WHEN_ZERO.items():
        v = env.get(var, "").strip()
        if v == "0":
            found.append((var, v, why))
    if not found:
        return passed("none of NCCL_P2P_DISABLE, NCCL_IB_DISABLE, CUDA_LAUNCH_BLOCKING, ... is set")
    return warned("; ".join(f"{var}={v}: {why}" for var, v, why in found),
                  f"Unset {', '.join(v for v, _, _ in found)} unless you set them on purpose to debug.",
                  variables={var: v for var, v, _ in found})


CHECKS = (
    CheckSpec("net.ports-free", "Node 0's ports are free", check_ports_free),
    CheckSpec("net.master-resolves", "Master address resolves", check_master_resolves),
    CheckSpec("net.socket-ifname", "Socket interfaces exist", check_socket_ifname),
    CheckSpec("net.risky-vars", "No risky NCCL/CUDA variables", check_risky_vars),
)
