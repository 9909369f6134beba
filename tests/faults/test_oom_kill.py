"""An OOM-killed rank, for real: `traceml run` inside a memory cgroup with a limit this test sets,
one rank allocating until the kernel's OOM killer takes it. The headline must say "OOM killer",
not just "SIGKILL"; a kill -9 in the same cgroup (test_worker_faults) must not.

Skipped, with the reason, where no memory cgroup can be created (not root, no memory controller,
a read-only cgroup filesystem).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness import assert_no_leftovers, run

from traceml_core.launcher import memcg

LIMIT = 2500 << 20  # two gloo workers, torchrun, the launcher and the aggregator fit in ~1.3 GiB


@pytest.fixture
def memory_cgroup():
    here = memcg.find()
    if here is None:
        pytest.skip("no memory cgroup is visible to this process (no memory controller mounted)")
    path = here.path / f"traceml-oom-test-{os.getpid()}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup under {here.path}: {exc.strerror}")
    try:
        if here.version == 1:
            (path / "memory.limit_in_bytes").write_text(str(LIMIT))
            swap = path / "memory.memsw.limit_in_bytes"  # no swapping instead of the OOM kill
            if swap.exists():
                swap.write_text(str(LIMIT))
        else:
            (path / "memory.max").write_text(str(LIMIT))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
    except OSError as exc:
        path.rmdir()
        pytest.skip(f"cannot set a memory limit in {path}: {exc.strerror}")
    yield path
    deadline = time.monotonic() + 10
    while True:
        try:
            path.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_oom_killed_rank_is_named_as_such(tmp_path, memory_cgroup: Path):
    procs = memory_cgroup / "cgroup.procs"
    # the launcher enters the cgroup before it starts anything; every worker inherits it
    prefix = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]
    args = ("--steps", "200", "--step-ms", "10", "--fault", "oom", "--fault-rank", "1",
            "--fault-step", "40")
    r = run(tmp_path, args, run_name="oom", prefix=prefix, timeout=120)
    assert r.code != 0
    s = r.summary()
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"]["rank"] == 1, v
    ev = v["evidence"]
    assert ev["cause"] == "oom" and ev["oom_killed"] is True and ev["signal"] == "SIGKILL", ev
    assert ev["consequence_ranks"] == [0], ev
    # where it died: step 40 from rank 0's records; on a loaded machine both ranks' last records can
    # die with them (rank 0 is stopped by SIGTERM), and then the step is a lower bound, said so
    # (rank 1's own telemetry at step 40 and nobody's further: exact, but node 0 cannot know it,
    # so 'after at least 40 steps' is honest then too)
    assert 0 < ev["step"] <= 40, ev
    if ev["step"] < 40:
        assert ev["step_at_least"] is True, ev
    words = (f"rank 1 was killed by the OOM killer after at least {ev['step']} steps",) + \
        (("rank 1 was killed by the OOM killer around step 40",) if ev["step"] == 40 else ())
    assert s["run"]["reason"].startswith(words), (s["run"]["reason"], words)
    assert "OOM killer" in v["why"] and "limit 2.4 GiB" in v["why"]
    assert "rank 1 (node 0" in r.out and "SIGKILL (OOM kill)" in r.out
    assert_no_leftovers(r)
