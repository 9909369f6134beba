"""Ports for the real runs the tests start, picked so that two runs started side by side cannot
meet on one (imported by name: tests/unit is on sys.path for tests/unit and tests/faults).

The kernel's own pick (bind to port 0) comes from its ephemeral range, which is also where every
outgoing connection gets its local port: between the pick and the launcher's bind, a connection
of another run (its workers' TCPStore and gloo sockets, its aggregator client) may be given the
same port, and the launcher fails on a port it was told was free. So a port here comes from
below the ephemeral range (``net.ipv4.ip_local_port_range``), where no connection is given one,
is checked free by a bind, and is never handed out twice in this process.
"""

from __future__ import annotations

import random
import socket

#: the lowest port handed out (above the well-known services a test machine may run)
LOWEST = 15000
_given: set[int] = set()
_rng = random.Random()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on, none handed out before in this process."""
    high = _ephemeral_low()
    out: list[int] = []
    while len(out) < n:
        if high - LOWEST < 1000:   # an unusual ephemeral range: the kernel's pick, still never twice
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        else:
            port = _rng.randrange(LOWEST, high)
            if not _bindable(port):
                continue
        if port in _given:
            continue
        _given.add(port)
        out.append(port)
    return out


def free_port() -> int:
    return free_ports(1)[0]
