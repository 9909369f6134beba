"""Settings of the live views, read from the environment once when a view starts.

They are not launch options (nothing about the run depends on them, and they only exist on node
0 with ``--mode cli|dashboard``), so they are not in the option table. A bad value must not stop
a training run that is about to start: it is reported in one paragraph naming the variable, the
value and the fix, and the default is used.

``TRACEML_STATUS_INTERVAL``  seconds between status lines when stdout is not a terminal (10)
``TRACEML_LIVE_REFRESH``     seconds between snapshots for the terminal view (0.5)
``TRACEML_DASHBOARD_HOST``   address the dashboard listens on (127.0.0.1)
``TRACEML_DASHBOARD_PORT``   its port (0 = the aggregator port + 1 when free, else any free port)
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional


@dataclass
class ViewSettings:
    status_interval: float = 10.0
    refresh: float = 0.5
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 0
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "ViewSettings":
        env = os.environ if environ is None else environ
        s = cls()

        def read(name: str, parse: Callable[[str], object], default: object, what: str) -> object:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return parse(raw.strip())
            except ValueError:
                s.warnings.append(f"{name}={raw!r} is invalid: it must be {what}. Using the default "
                                  f"({default}); fix or unset {name}.")
                return default

        s.status_interval = float(read("TRACEML_STATUS_INTERVAL", _positive, 10.0,  # type: ignore[arg-type]
                                       "a number of seconds > 0, e.g. 30"))
        s.refresh = float(read("TRACEML_LIVE_REFRESH", _positive, 0.5,  # type: ignore[arg-type]
                               "a number of seconds > 0, e.g. 1"))
        s.dashboard_host = str(read("TRACEML_DASHBOARD_HOST", _host, "127.0.0.1",
                                    "an IP address of this node, e.g. 127.0.0.1"))
        s.dashboard_port = int(read("TRACEML_DASHBOARD_PORT", _port, 0,  # type: ignore[arg-type]
                                    "a port number 1-65535, or 0 for automatic"))
        return s


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0 or v != v or v == float("inf"):
        raise ValueError(text)
    return v


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise ValueError(text)
    return v


def _host(text: str) -> str:
    ipaddress.ip_address(text)
    return text
