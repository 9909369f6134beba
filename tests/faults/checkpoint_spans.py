"""A traced loop whose rank reports checkpoint saves: real ones, or forged ones.

``SPAN_MODE=forged``: after every 10th step the rank reports a 2 s ``torch.save`` it never made (the
SDK's own span reporter, called as a script that wanted to lie would), and goes straight on with its
next step. ``SPAN_MODE=real``: after every 10th step it really saves (``torch.save`` of a state
held 300 ms by a slow writer, timed by the SDK like any save). 60 steps of about 5 ms either way.
"""

from __future__ import annotations

import io
import os
import time

import torch
import torch.nn as nn

import traceml_core as traceml
from traceml_core.sdk import spans


class SlowWriter(io.BytesIO):
    """A slow filesystem: the save's first write waits 300 ms."""

    def write(self, b):
        if not self.tell():
            time.sleep(0.3)
        return super().write(b)


def main() -> None:
    mode = os.environ.get("SPAN_MODE", "forged")
    torch.set_num_threads(1)
    traceml.init()
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for step in range(60):
        with traceml.trace_step(model):
            time.sleep(0.005)
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if step % 10 == 9:
            if mode == "forged":
                now = time.perf_counter_ns()
                spans._span(now - 2_000_000_000, now, "torch.save")
            else:
                buf = SlowWriter()
                torch.save({"w": model.state_dict(), "pad": [b"x" * 64] * 3}, buf)
    print("checkpoint_spans: done", flush=True)


if __name__ == "__main__":
    main()
