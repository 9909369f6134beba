"""Stack requests against training ranks: do they ever change a rank's fate, and what do they cost?

The hang autopsy asks every rank where it is (a ``stacks`` request; the rank's interpreter answers
on its client thread, sdk/stackdump.py). An earlier design answered from a signal handler with
faulthandler and killed 2 of 22 processes over 4,131 signals. This script starts real gloo DDP
ranks (tests/faults/faulty_train.py under torchrun) behind a real node relay and aggregator
(tests/faults/rankrig.py), sends stack requests paced at ``--interval-ms`` while they train, in
``--rounds`` fresh runs, then lets each run end on its own, and prints:

* requests sent, answers received, ranks that did not end with exit 0 (crashes), per round;
* the ranks' steps per second with requests and, side by side in the same round, without them.

    PYTHONPATH=src python benchmarks/stack_stress.py                       # 10,000 requests
    PYTHONPATH=src python benchmarks/stack_stress.py --requests 20000 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "faults"))
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "src"))

from rankrig import RankRig  # noqa: E402


def _rate(rig: RankRig, seconds: float) -> float:
    s0, t0 = min(rig.steps().values()), time.monotonic()
    time.sleep(seconds)
    return (min(rig.steps().values()) - s0) / (time.monotonic() - t0)


def one_round(d: Path, requests: int, interval_s: float, quiet_s: float) -> dict:
    rig = RankRig(d)
    try:
        stop = d / "stop.flag"
        rig.start(["--steps", "10000000", "--stop-file", str(stop)])
        rig.wait_steps(5)
        quiet = _rate(rig, quiet_s)
        s0, t0 = min(rig.steps().values()), time.monotonic()
        next_at = t0
        for i in range(requests):
            rig.request_stacks(1_000_000 + i)
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        asked = (min(rig.steps().values()) - s0) / (time.monotonic() - t0)
        deadline = time.monotonic() + 120
        while rig.relay.stats().answers_in < 2 * requests and time.monotonic() < deadline \
                and rig.proc.poll() is None:
            time.sleep(0.05)
        answers = rig.relay.stats().answers_in
        stop.touch()
        try:
            code = rig.wait(120)
        except Exception:
            code = None
        return {"answers": answers, "code": code, "quiet": quiet, "asked": asked,
                "steps": min(rig.steps().values()), "err": rig.stderr() if code != 0 else ""}
    finally:
        rig.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000, help="in all, spread over the rounds")
    ap.add_argument("--rounds", type=int, default=5, help="fresh runs of 2 ranks each")
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--quiet-s", type=float, default=3.0, help="seconds timed without requests")
    args = ap.parse_args()
    per = max(1, args.requests // args.rounds)
    print(f"{args.rounds} rounds x {per} stack requests, one every {args.interval_ms:g} ms, to 2 "
          f"training gloo DDP ranks (load average {os.getloadavg()[0]:.1f})")
    print(f"{'round':>5} {'requests':>9} {'answers':>8} {'exit':>5} {'steps/s quiet':>14} "
          f"{'steps/s asked':>14} {'ratio':>6}")
    crashes = sent = answered = 0
    with tempfile.TemporaryDirectory(prefix="stack-stress-") as tmp:
        for r in range(args.rounds):
            res = one_round(Path(tmp) / f"r{r}", per, args.interval_ms / 1000.0, args.quiet_s)
            sent += per
            answered += res["answers"]
            crashes += res["code"] != 0
            ratio = res["asked"] / res["quiet"] if res["quiet"] else float("nan")
            print(f"{r:>5} {per:>9,} {res['answers']:>8,} {str(res['code']):>5} {res['quiet']:>14.0f} "
                  f"{res['asked']:>14.0f} {ratio:>6.2f}")
            if res["err"]:
                print(res["err"])
    print(f"\n{sent:,} requests to 2 ranks in {args.rounds} runs: {answered:,} answers "
          f"(of {2 * sent:,}), {crashes} run(s) that did not end with exit 0")
    print("target: 0 crashes in at least 10,000 requests: "
          + ("met" if crashes == 0 and sent >= 10_000 else "NOT MET"))


if __name__ == "__main__":
    main()
