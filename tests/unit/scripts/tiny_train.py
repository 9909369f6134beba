"""A tiny traced training loop for the compare and live-view tests (no process group).

Each rank trains its own small model (no collectives, so one rank dying does not stop the
others). Knobs, all environment variables:

``TINY_STEPS`` (100)        steps per rank
``TINY_SLEEP_MS`` (3)       sleep inside the model's forward per step (the "slower" knob: sleep
                            dominates the step, so step times are stable on a busy machine)
``TINY_PRINT_EVERY`` (0)    print a "tiny: rank R step S" training line every N steps on rank 0
``TINY_KILL_RANK`` / ``TINY_KILL_AT``   that rank SIGKILLs itself at that step
``TINY_KILL_WHEN`` (path)   ... or, when set, at the first step from ``TINY_KILL_AT`` on at which
                            that file exists (the test decides the moment, not the machine's load)
``TINY_KILL_SIGNAL`` (KILL) the signal it sends itself: ``STOP`` freezes the rank with its
                            connection open and silent, which torchrun never notices, so a test
                            can look at "a rank went silent" for as long as it needs and then
                            SIGKILL it by pid (a SIGKILL raced torchrun's worker check: when the
                            check came soon after the death, the whole run ended at once)
``TINY_PIDFILE`` (path)     the signalled rank writes its pid there first (atomically)
``TINY_BARRIER`` (``DIR:N``)  before the first step, wait until N workers (of any runs sharing
                            DIR) are ready, so runs started together also step together
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.nn as nn

import traceml_core as traceml


class Sleepy(nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 1)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        return self.lin(x)


def barrier(spec: str) -> None:
    where, _, n = spec.rpartition(":")
    open(os.path.join(where, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(where)) < int(n) and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    steps = int(os.environ.get("TINY_STEPS", "100"))
    sleep_s = float(os.environ.get("TINY_SLEEP_MS", "3")) / 1000.0
    every = int(os.environ.get("TINY_PRINT_EVERY", "0"))
    kill_rank = int(os.environ.get("TINY_KILL_RANK", "-1"))
    kill_at = int(os.environ.get("TINY_KILL_AT", "-1"))
    kill_when = os.environ.get("TINY_KILL_WHEN")
    kill_sig = getattr(signal, "SIG" + os.environ.get("TINY_KILL_SIGNAL", "KILL"))
    pidfile = os.environ.get("TINY_PIDFILE")
    signalled = False
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    traceml.init()
    model = Sleepy(sleep_s)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(16)]
    if os.environ.get("TINY_BARRIER"):
        barrier(os.environ["TINY_BARRIER"])
    for step in range(steps):
        if not signalled and rank == kill_rank and (step >= kill_at and os.path.exists(kill_when)
                                                    if kill_when else step == kill_at):
            signalled = True
            if pidfile:
                with open(pidfile + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(pidfile + ".tmp", pidfile)
            os.kill(os.getpid(), kill_sig)
        x, y = data[step % len(data)]
        with traceml.trace_step(model):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if every and rank == 0 and step % every == 0:
            print(f"tiny: rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"tiny: done {steps} steps", flush=True)


if __name__ == "__main__":
    main()
