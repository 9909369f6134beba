"""This node's network interfaces (name, up, addresses), read from the kernel without extra packages."""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import dataclass


@dataclass
class Interface:
    name: str
    up: bool
    addresses: tuple[str, ...] = ()
    loopback: bool = False


_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_RUNNING = 0x40


def _ifreq(name: str) -> bytes:
    return struct.pack("256s", name.encode()[:15])


def list_interfaces() -> list[Interface]:
    v6: dict[str, list[str]] = {}
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    raw = parts[0]
                    addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
                    v6.setdefault(parts[5], []).append(socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, addr)))
    except OSError:
        pass
    out = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, _ifreq(name))[16:18])[0]
            except OSError:
                continue
            addrs = []
            try:
                addrs.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, _ifreq(name))[20:24]))
            except OSError:
                pass
            addrs += v6.get(name, [])
            loop = bool(flags & _IFF_LOOPBACK)
            up = bool(flags & _IFF_UP) and (bool(flags & _IFF_RUNNING) or loop)
            out.append(Interface(name, up, tuple(addrs), loop))
    finally:
        s.close()
    return out
