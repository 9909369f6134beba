"""A node's relay in a process of its own, joined to a real aggregator, for flood tests that read
its memory and CPU from /proc: ``python relay_host.py RUN_DIR [SPARE_FDS]`` prints one line
``READY <relay port> <aggregator port>`` and serves until stdin closes; then it finishes the run
and prints ``DONE <summary json path> <relay counters as JSON>``. ``SPARE_FDS`` lowers the
open-files limit to the descriptors in use plus that many (fd exhaustion).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

from traceml_core.aggregator.process import start_aggregator
from traceml_core.aggregator.settings import AggregatorSettings
from traceml_core.launcher.relay import Relay

TOKEN = "flood-token-0123456789"
RUN = "flood"


def main() -> None:
    run_dir = Path(sys.argv[1])
    h = start_aggregator(AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=run_dir, port=0,
                                            nnodes=1, nproc_per_node=2, drain_s=1.0))
    relay = Relay(token=TOKEN, run_name=RUN, job_id=None, node=0, nnodes=1, nproc_per_node=2,
                  upstream=(h.connect_host, h.port), hostname="flood-node", flush_s=0.05,
                  warn=lambda m: print(f"[relay] {m}", file=sys.stderr, flush=True)).start()
    assert relay.wait_connected(10.0)
    if len(sys.argv) > 2:
        used = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + int(sys.argv[2]), hard))
    print(f"READY {relay.port} {h.port}", flush=True)
    sys.stdin.read()
    relay.drain(5.0)
    relay.run_ended()
    res = h.finish(0)
    relay.close(1.0)
    print(f"DONE {res.summary_json} {json.dumps(relay.counters)}", flush=True)


if __name__ == "__main__":
    main()
