"""The rules of issue 31 on synthetic runs through the real ingest, series and summary code: what a
slower rank's excess is made of (bigger or longer batches, measured or declared; more CPU time for
the same batch; a wait for a core beyond its share; or a wait off the CPU), whose processes held
the cores, and periodic work judged on the rank that pauses, robust to scheduler jitter. Each rule
with the control that carries its confound; every sentence comes back from its evidence (the
harness checks it on every run)."""

from __future__ import annotations

import random
from typing import Any, Optional

from test_verdict_rules import _all, _ddp, _get, _kinds, _run

MS = 1_000_000
STEPS = 200
SAMPLED = 40


def _work(samples: float, elements: float, tokens: float = 0.0, cpu_ms: float = 20.0,
          phase_cpu: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """The ``work`` part of a rank's cpu_threads event, as the SDK sends it (sums of SAMPLED
    sampled steps)."""
    pc = phase_cpu or {"forward": cpu_ms * 0.4, "backward": cpu_ms * 0.5, "optimizer": cpu_ms * 0.1}
    n = SAMPLED
    return {"work": {"n": n, "cpu_ns": int(cpu_ms * MS * n), "wall_ns": int(cpu_ms * 1.2 * MS * n),
                     "phase_cpu_ns": {k: int(v * MS * n) for k, v in pc.items()},
                     "phase_wall_ns": {k: int(v * 1.2 * MS * n) for k, v in pc.items()}, "forwards": n,
                     "measured": n, "samples": int(samples * n), "elements": int(elements * n),
                     "tokens": int(tokens * n)}}


def _cores(proc: float, wall_s: float = 10.0) -> dict[str, Any]:
    """The rank process's CPU use over the steady steps: ``proc`` cores."""
    return {"pcpu0_ns": 0, "pcpu_ns": int(proc * wall_s * 1e9), "wall0_ns": 0, "wall_ns": int(wall_s * 1e9)}


def _none(s: dict[str, Any], kind: str) -> bool:
    return all(v["kind"] != kind for v in _all(s))


# --- bigger batches: work, not the node, not contention -------------------------------------------
def _bigger_batch(rank: int, i: int) -> dict[str, Any]:
    # rank 1's batch is 1.6x: its forward and backward take 1.6x as long; rank 0 waits in comm
    return _ddp(fwd=16.0, bwd=22.4, comm=0.4) if rank == 1 else _ddp(fwd=10.0, bwd=14.0, comm=14.8)


def test_bigger_batches_on_one_rank_are_a_work_imbalance_with_the_figures():
    """Issue 31's first case: rank 1's batches are 1.6x rank 0's on a busy node; its wait for a core
    grew with its work (the same wait per CPU second), so nothing is excused as contention, and
    the advice is about the data, not the node."""
    s = _run(2, STEPS, _bigger_batch,
             threads=lambda rank: (1, [[0, 1]], 13.0 if rank == 1 else 8.0, 32.0 if rank == 1 else 20.0),
             facts=lambda rank: _work(13107 if rank == 1 else 8192, 32 * (13107 if rank == 1 else 8192),
                                      cpu_ms=32.0 if rank == 1 else 20.0))
    v = s["verdict"]
    assert v["kind"] == "work_imbalance" and v["culprit"]["rank"] == 1, _kinds(s)
    ev = v["evidence"]
    assert ev["basis"] == "samples" and ev["ratio"] == 1.6 and (ev["mine"], ev["theirs"]) == (13107, 8192), ev
    assert "rank 1's batches are 1.6x the other ranks' (13,107 vs 8,192 samples per step, measured)" in v["why"]
    assert "sampler" in v["next_step"] and "the node is not the cause" in v["next_step"]
    assert "OMP_NUM_THREADS" not in v["next_step"] and "what else runs on its node" not in v["next_step"]
    assert _none(s, "straggler")
    c = next((x for x in _all(s) if x["kind"] == "cpu_contention"), None)
    assert c is None or c["evidence"]["excused_rank"] is None, c


def test_bigger_batches_that_do_not_slow_their_rank_yet_are_information():
    """Rank 1's batches are 1.6x but it is hardly slower (a tiny model whose step is mostly
    overhead, or a busy CPU whose wait dominates): the imbalance is said, as information, with
    the figures; no warning."""
    def step(rank, i):
        return _ddp(fwd=10.5, bwd=14.5, comm=0.4) if rank == 1 else _ddp(fwd=10.0, bwd=14.0, comm=1.4)
    s = _run(2, STEPS, step, threads=lambda rank: (1, [[0, 1]], 8.0, 21.0 if rank == 1 else 20.0),
             facts=lambda rank: _work(13107 if rank == 1 else 8192, 32 * (13107 if rank == 1 else 8192),
                                      cpu_ms=21.0 if rank == 1 else 20.0))
    v = _get(s, "work_imbalance")
    assert v["severity"] == "info" and v["culprit"]["rank"] == 1 and v["evidence"]["ratio"] == 1.6, v
    assert "not enough to matter yet" in v["why"] and "the other ranks wait for it" not in v["why"], v["why"]
    assert all(x["severity"] == "info" for x in _all(s)), _kinds(s)


def test_the_same_slowness_without_more_work_is_a_straggler_that_waits():
    """The control: rank 1 is as slow, with the same batch and the same CPU time as rank 0 (a
    slower device, a blocking call): a straggler, and its sentence says it waits off the CPU."""
    s = _run(2, STEPS, _bigger_batch,
             threads=lambda rank: (1, [[0, 1]], 8.0, 20.0),
             facts=lambda rank: _work(8192, 32 * 8192, cpu_ms=20.0))
    v = s["verdict"]
    assert v["kind"] == "straggler" and v["culprit"]["rank"] == 1, _kinds(s)
    assert "it spends 14.8 ms per step off the CPU and not waiting for a core (the others 0.4): it waits" in v["why"], v["why"]
    assert _none(s, "work_imbalance")


def test_declared_work_overrides_the_measured_batch():
    """Every rank declared its samples per step (declare_work): 410 vs 256 is the work, whatever
    the sampled batches said; declared equal work leaves the measured difference out."""
    s = _run_declared({0: 256.0, 1: 410.0}, measured={0: 8192, 1: 8192})
    v = s["verdict"]
    assert v["kind"] == "work_imbalance" and v["evidence"]["basis"] == "declared samples", _kinds(s)
    assert "(410 vs 256 samples per step, declared with traceml.declare_work)" in v["why"], v["why"]
    same = _run_declared({0: 256.0, 1: 256.0}, measured={0: 8192, 1: 13107})
    assert same["verdict"]["kind"] != "work_imbalance" or same["verdict"]["evidence"]["basis"] == "cpu", _kinds(same)


def _run_declared(declared: dict[int, float], measured: dict[int, float]) -> dict[str, Any]:
    """A run like _bigger_batch whose ranks declared ``declared`` samples per step."""
    import test_verdict_rules as h
    from traceml_core.aggregator.state import RunState

    real_rank = RunState.rank

    def rank(self, r):  # the declaration arrives as the rank's "work" fact (rankfacts.Work)
        rs = real_rank(self, r)
        if rs.facts.work is None and r in declared:
            rs.facts.apply("work", {"samples_per_step": declared[r]})
        return rs

    RunState.rank = rank
    try:
        return h._run(2, STEPS, _bigger_batch, threads=lambda r: (1, [[0, 1]], 8.0, 20.0),
                      facts=lambda r: _work(measured[r], measured[r] * 32, cpu_ms=20.0))
    finally:
        RunState.rank = real_rank


def test_longer_sequences_for_the_same_samples_are_named_as_tokens():
    s = _run(2, STEPS, _bigger_batch,
             threads=lambda rank: (1, [[0, 1]], 8.0, 32.0 if rank == 1 else 20.0),
             facts=lambda rank: _work(16, 16 * (800 if rank == 1 else 512), tokens=16 * (800 if rank == 1 else 512),
                                      cpu_ms=32.0 if rank == 1 else 20.0))
    v = s["verdict"]
    assert v["kind"] == "work_imbalance" and v["evidence"]["basis"] == "tokens", _kinds(s)
    assert "holds 1.6x the other ranks' tokens (12,800 vs 8,192 per step for 16 samples" in v["why"].replace(
        "batches hold", "holds"), v["why"]
    assert "bucket batches by length" in v["next_step"]


def test_more_cpu_for_the_same_batch_alone_on_its_node_is_not_called_its_own_work():
    """One rank per node: more CPU time for the same batch could be a slower CPU on that node as
    much as work only that rank does, so it is not called a work imbalance."""
    s = _run(2, STEPS, _bigger_batch, threads=lambda r: (1, [[0, 1]], 8.0, 32.0 if r == 1 else 20.0),
             facts=lambda r: _work(8192, 8192 * 32, cpu_ms=32.0 if r == 1 else 20.0), one_per_node=True)
    assert _none(s, "work_imbalance"), _kinds(s)


def test_more_cpu_alike_in_every_part_of_the_step_is_a_slower_core_not_work():
    """The same batch, 1.8x the CPU time in forward, backward, the optimizer and the rest alike:
    its core ran slower (another process on the same physical core: seen on a shared machine for
    a whole run), not work of its own. Not a straggler nor a work imbalance: CPU-CONTENTION says
    so. Its control: the same extra CPU time all in forward is work of its own."""
    def spread(rank):
        k = 1.8 if rank == 1 else 1.0
        return _work(8192, 8192 * 32, cpu_ms=20.0 * k,
                     phase_cpu={"forward": 6.0 * k, "backward": 9.0 * k, "optimizer": 2.0 * k})
    s = _run(2, STEPS, _bigger_batch, threads=lambda r: (1, [[0, 1]], 8.0, 36.0 if r == 1 else 20.0), facts=spread)
    assert _none(s, "straggler") and _none(s, "work_imbalance"), _kinds(s)
    c = _get(s, "cpu_contention")
    assert c["evidence"]["excused_rank"] == 1 and c["evidence"]["excused_by"] == "slow_core", c["evidence"]
    assert "its core ran slower" in c["why"] and "forward 1.8x, backward 1.8x" in c["why"], c["why"]

    def concentrated(rank):
        return _work(8192, 8192 * 32, cpu_ms=36.0 if rank == 1 else 20.0,
                     phase_cpu={"forward": 22.0 if rank == 1 else 6.0, "backward": 9.0, "optimizer": 2.0})
    w = _run(2, STEPS, _bigger_batch, threads=lambda r: (1, [[0, 1]], 8.0, 36.0 if r == 1 else 20.0),
             facts=concentrated)
    v = w["verdict"]
    assert v["kind"] == "work_imbalance" and v["evidence"]["basis"] == "cpu", _kinds(w)
    assert "forward +16.0 ms" in v["why"], v["why"]


def test_a_rank_that_sleeps_on_a_busy_cpu_is_a_straggler_not_contention_or_a_slower_core():
    """Rank 0 sleeps in forward on a CPU shared with busy loops: each wake-up waits for a core, so
    its wait per CPU second exceeds the others', and it wakes to cold caches, so its CPU time is
    1.3x alike in every phase. Neither is why it is slower: it spends the excess off the CPU and
    not waiting for a core (measured: wall clock less communication, CPU time and run-queue wait).
    A straggler that waits (seen on the first held-out pass: it was excused as a slower core)."""
    def step(rank, i):  # 169.3 ms steps; rank 0 is 40 ms longer in forward, rank 1 waits in comm
        return _ddp(fwd=100.0, bwd=60.0, comm=5.0) if rank == 0 else _ddp(fwd=60.0, bwd=60.0, comm=45.0)

    def spread(rank):
        k = 1.3 if rank == 0 else 1.0
        return _work(8192, 8192 * 32, cpu_ms=18.0 * k,
                     phase_cpu={"forward": 6.0 * k, "backward": 11.0 * k, "optimizer": 0.3 * k})
    # per step: CPU 23.4 vs 18.0 ms, run-queue wait 115.9 vs 106.3 ms (4.95 vs 5.9 per CPU ms: no
    # more than its share), so 25 ms of rank 0's step is off the CPU and not waiting, 0 of rank 1's
    s = _run(2, STEPS, step, threads=lambda r: (1, [[0, 1]], 115.9 if r == 0 else 106.3, 23.4 if r == 0 else 18.0),
             facts=spread)
    v = s["verdict"]
    assert v["kind"] == "straggler" and v["culprit"]["rank"] == 0 and v["evidence"]["phase"] == "forward", _kinds(s)
    assert "off the CPU and not waiting for a core" in v["why"], v["why"]
    c = next((x for x in _all(s) if x["kind"] == "cpu_contention"), None)
    assert c is None or c["evidence"]["excused_rank"] is None, c


# --- a wait for a core: per unit of work, and whose --------------------------------------------------
def test_a_wait_beyond_its_share_is_contention_and_says_other_processes_held_the_cores():
    """Rank 1 waits 3x the others' per CPU second for the same CPU time: another process took its
    cores. Its ranks used 1.1 of 2 cores: outside the job's ranks."""
    def step(rank, i):
        return _ddp(fwd=25.0, comm=0.4) if rank == 1 else _ddp(fwd=10.0, comm=15.4)
    s = _run(2, STEPS, step, threads=lambda rank: (1, [[0, 1]], 21.0 if rank == 1 else 7.0, 20.0),
             facts=lambda rank: {**_work(8192, 8192 * 32, cpu_ms=20.0), **_cores(0.55)})
    assert _none(s, "straggler") and _none(s, "work_imbalance"), _kinds(s)
    c = _get(s, "cpu_contention")
    assert c["evidence"]["excused_rank"] == 1 and c["evidence"]["whose"] == "others", c["evidence"]
    assert "processes outside the job's ranks held the cores" in c["why"], c["why"]
    assert "used only 1.1 of the 2 core(s)" in c["why"], c["why"]


def test_waiting_ranks_that_fill_their_cores_are_told_it_is_their_own_processes():
    def step(rank, i):
        return _ddp(fwd=10.0, comm=0.5)
    s = _run(2, STEPS, step, threads=lambda rank: (1, [[0, 1]], 9.0, 20.0),
             facts=lambda rank: {**_work(8192, 8192 * 32, cpu_ms=20.0), **_cores(1.0)})
    c = _get(s, "cpu_contention")
    assert c["evidence"]["whose"] == "own" and "the job's own processes held the cores" in c["why"], c["why"]
    assert "fewer ranks" in c["next_step"]


def test_not_measured_whose_is_not_said_to_be_other_processes():
    def step(rank, i):
        return _ddp(fwd=10.0, comm=0.5)
    s = _run(2, STEPS, step, threads=lambda rank: (1, [[0, 1]], 9.0, 20.0))
    c = _get(s, "cpu_contention")
    assert c["evidence"]["whose"] is None and "other processes" not in c["why"], c["why"]


# --- periodic work: on the rank that pauses, robust to jitter ----------------------------------------
def test_one_ranks_evaluation_is_named_as_that_ranks_periodic_work():
    """Rank 0 alone evaluates every 10 steps (300 ms between steps); rank 1 waits for it in the
    next step's all-reduce. Periodic work, rank 0's, every 10 steps; not a straggler."""
    def step(rank, i):
        pause = rank == 0 and i % 10 == 0 and i > 0
        wait = 300.0 if rank == 1 and i % 10 == 0 and i > 0 else 0.5
        return _ddp(comm=wait, gap=300.0 if pause else 0.2)
    s = _run(2, STEPS, step)
    v = _get(s, "periodic_work")
    assert v["severity"] in ("warning", "critical") and v["culprit"]["rank"] == 0, v
    assert abs(v["evidence"]["period_steps"] - 10) <= 1, v["evidence"]
    assert "every ~10 steps rank 0 (node 0, node-a) alone spends about" in v["why"], v["why"]
    for o in _all(s):
        if o["kind"] in ("straggler", "work_imbalance"):
            assert o["severity"] == "info", o


def test_periodic_work_under_scheduler_jitter_keeps_its_period():
    """Issue 31: an evaluation every 20 steps on every rank, on a loaded machine whose scheduler
    takes a core for 1-8 ms at random (in steps and between them): "every ~20 steps", not "every
    ~8 steps, 16 pauses"."""
    rng = random.Random(5)

    def step(rank, i):
        jitter = rng.uniform(1.0, 8.0) if rng.random() < 0.15 else 0.0
        gap = 200.0 if i % 20 == 0 and i > 0 else 0.18 + (rng.uniform(1.0, 8.0) if rng.random() < 0.15 else 0.0)
        return _ddp(fwd=10.0 + jitter, comm=0.5, gap=gap)
    s = _run(2, STEPS, step)
    v = _get(s, "periodic_work")
    assert v["culprit"] is None and abs(v["evidence"]["period_steps"] - 20) <= 3, v["evidence"]
    assert v["evidence"]["bursts"] <= 12, v["evidence"]


def test_jitter_alone_is_not_periodic_work():
    rng = random.Random(7)

    def step(rank, i):
        jitter = rng.uniform(1.0, 8.0) if rng.random() < 0.15 else 0.0
        gap = 0.18 + (rng.uniform(1.0, 8.0) if rng.random() < 0.15 else 0.0)
        return _ddp(fwd=10.0 + jitter, comm=0.5, gap=gap)
    s = _run(2, STEPS, step)
    assert all(v["kind"] != "periodic_work" or v["severity"] == "info" for v in _all(s)), _kinds(s)
