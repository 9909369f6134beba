"""A training rank as a separate process, for the relay tests: the real TelemetryClient and the
real step recorder (no torch needed), sending to a relay on loopback.

Usage: ``python relay_rank.py PORT RANK NODE STEPS [TOKEN RUN JOB]``. Records ``STEPS`` steps
(one every 0.2 ms), prints ``sent N`` once they are handed to the client, then closes with a bye.
With STEPS = -1 it records forever (a rank to be killed); it prints ``running`` once connected.
"""

from __future__ import annotations

import sys
import time

from traceml_core.sdk.recorder import StepRecorder
from traceml_core.sdk.tracer import Tracer
from traceml_core.wire.auth import relay_aud
from traceml_core.wire.client import ClientConfig, TelemetryClient


def main() -> None:
    port, rank, node, steps = (int(a) for a in sys.argv[1:5])
    token, run, job = (sys.argv[5:8] + ["test-token-0123456789", "test-run", "42"][len(sys.argv[5:8]):])
    rec = StepRecorder(rank=rank, batch_size=64, seal_interval_s=0.05)
    client = TelemetryClient(ClientConfig("127.0.0.1", port, token, aud=relay_aud(node), run=run, job=job, node=node,
                                          rank=rank, kind="rank", world=0, extra={"local_rank": rank % 2},
                                          backoff_initial=0.02, backoff_max=0.2), source=rec)
    client.start()
    if not client.wait_connected(5.0):
        print("not connected", flush=True)
        sys.exit(3)
    ctx = Tracer(rec).step
    if steps < 0:
        print("running", flush=True)
        while True:
            with ctx:
                pass
            time.sleep(0.0002)
    for _ in range(steps):
        with ctx:
            pass
    rec.flush_partial()
    ok = client.close(5.0, bye=lambda: {"t": "bye", "rank": rank, "status": "clean",
                                        "steps": rec.count, "dropped": rec.lost, "error": None})
    print(f"sent {rec.count} lost {rec.lost} ok {ok}", flush=True)


if __name__ == "__main__":
    main()
