"""Free local ports, for a launch that has no port given and nothing to derive one from.

Under a cluster plugin the ports come from the job (Slurm: a block of four per job id), so jobs
sharing a node never clash. A run on one node outside any cluster has no such identity: fixed
defaults (29500/29765) would make a second run on the same machine (another user, a second
experiment) fail on a port it never chose. Such a run takes ports the kernel says are free, as
torchrun's ``--standalone`` does; a multi-node run outside a cluster keeps the fixed defaults,
since every node must agree on them without talking.
"""

from __future__ import annotations

import socket
from typing import Collection

#: the source ``--print-config`` shows for a port picked here
FREE_SOURCE = "free"


def free_port(avoid: Collection[int] = ()) -> int:
    """A TCP port nothing listens on now (the kernel's pick on loopback), not one of ``avoid``.

    The port is released before it is used, so another process could take it meanwhile; the
    launcher's own "port already in use" error then names it."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
