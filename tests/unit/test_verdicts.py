"""Verdicts on synthetic runs: the statistics go through the real ingest and summary code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from aggpeers import columns, make_settings, relayed
from traceml_core.aggregator.adapter import run_data
from traceml_core.aggregator.state import RunState
from traceml_core.report.summary import build_summary
from traceml_core.rundata import LaunchEnd, RankBye

MiB = 1024 * 1024


def _run(nnodes: int, nproc: int, per_rank: Callable[[int], dict[str, Any]], steps: int = 200,
         batch: int = 50, system: Any = None) -> dict[str, Any]:
    st = RunState(make_settings(Path("/nonexistent"), nnodes=nnodes, nproc_per_node=nproc))
    for rank in range(nnodes * nproc):
        rs = st.rank(rank)
        rs.node, rs.host = rank // nproc, f"gpu-node-{rank // nproc}"
        rs.bye = RankBye("clean", steps, None, 0.0)
        t0 = 1_700_000_000_000_000_000
        for seq in range(0, steps, batch):
            rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": seq, "n": batch, "dropped": 0,
                                    "cols": columns(batch, seq, t0_ns=t0, **per_rank(rank))}))
    for node, samples in (system or {}).items():
        st.node_system(node).ingest(f"gpu-node-{node}", samples)
    st.finish = LaunchEnd(exit_code=0)
    return build_summary(run_data(st))


def _kinds(s):
    return [s["verdict"]["kind"]] + [v["kind"] for v in s["other_verdicts"]]


def test_input_bound_is_named_with_its_numbers():
    s = _run(1, 2, lambda r: dict(step_ms=50.0, input_ms=20.0, forward_ms=10.0, backward_ms=15.0,
                                  optimizer_ms=5.0))
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["severity"] == "critical"
    assert "waits for its next batch 40% of its step time (20.0 ms of 50.0 ms per step on average)" in v["why"]
    assert v["evidence"]["source"] == "fetch"
    assert "num_workers" in v["next_step"] and v["culprit"] is None


def test_small_absolute_input_wait_in_a_toy_step_is_not_input_bound():
    # 0.4 ms of 1.6 ms is 25 % of the step, but below the absolute floor: not worth a verdict
    s = _run(1, 2, lambda r: dict(step_ms=1.6, input_ms=0.4, forward_ms=0.4, backward_ms=0.6,
                                  optimizer_ms=0.2))
    assert "input_bound" not in _kinds(s)


def test_moderate_input_wait_is_a_warning_not_critical():
    s = _run(1, 1, lambda r: dict(step_ms=20.0, input_ms=3.0, forward_ms=6.0, backward_ms=8.0,
                                  optimizer_ms=3.0))
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["severity"] == "warning"


def test_straggler_in_forward_names_rank_and_node():
    # DDP: rank 3 computes 30 ms longer in forward; everyone else waits 30 ms in backward,
    # so every rank's step time is the same and only the own-time comparison can tell
    def rank(r):
        if r == 3:
            return dict(step_ms=60.0, input_ms=1.0, forward_ms=40.0, backward_ms=15.0, optimizer_ms=4.0)
        return dict(step_ms=60.0, input_ms=1.0, forward_ms=10.0, backward_ms=45.0, optimizer_ms=4.0)
    s = _run(2, 2, rank)
    v = s["verdict"]
    assert v["kind"] == "straggler" and v["severity"] == "critical"
    assert v["culprit"] == {"rank": 3, "node": 1, "host": "gpu-node-1"}
    assert "rank 3 (node 1, gpu-node-1)" in v["why"] and "mostly in forward" in v["why"]
    assert "30.0 ms more per step" in v["why"]
    # forward+backward+optimizer are 98% of every rank's step, but most of the others' backward
    # is waiting for rank 3: "compute-bound" would contradict the straggler verdict
    assert "compute_bound" not in _kinds(s)


def test_straggler_outside_the_traced_step():
    # rank 2 does 40 ms of extra work between steps; the others wait for it inside backward
    def rank(r):
        if r == 2:
            return dict(step_ms=30.0, backward_ms=10.0, forward_ms=10.0, input_ms=1.0, gap_ms=40.0)
        return dict(step_ms=70.0, backward_ms=50.0, forward_ms=10.0, input_ms=1.0)
    s = _run(1, 4, rank)
    v = s["verdict"]
    assert v["kind"] == "straggler" and v["culprit"]["rank"] == 2
    assert "outside trace_step" in v["why"] and "between steps" in v["next_step"]


def test_balanced_ranks_are_not_stragglers():
    s = _run(2, 2, lambda r: dict(step_ms=50.0 + 0.5 * r, forward_ms=20.0, backward_ms=25.0,
                                  input_ms=0.5, optimizer_ms=3.0))
    assert "straggler" not in _kinds(s)
    assert s["verdict"]["kind"] == "compute_bound"


def test_memory_creep_names_the_rank():
    def rank(r):
        grow = 512 * 1024 if r == 1 else 0  # rank 1 leaks 0.5 MiB per step
        return dict(mem=1024 * MiB, mem_growth=grow)
    s = _run(1, 2, rank, steps=1000, batch=100)
    kinds = _kinds(s)
    assert "memory_creep" in kinds
    v = [v for v in [s["verdict"]] + s["other_verdicts"] if v["kind"] == "memory_creep"][0]
    assert v["culprit"]["rank"] == 1 and "1 of 2 ranks" in v["why"]
    tr = s["ranks"][1]["mem_peak"]["trend"]
    assert tr["rising"] and tr["growth_pct"] > 30
    assert s["ranks"][0]["mem_peak"]["trend"]["growth_bytes"] == 0


def test_small_memory_growth_is_not_creep():
    s = _run(1, 1, lambda r: dict(mem=1024 * MiB, mem_growth=16 * 1024), steps=1000, batch=100)
    assert "memory_creep" not in _kinds(s)  # +16 MiB over the run: under the 64 MiB floor


def _gpu_samples(util, n=30):
    return [{"ts": float(i), "cpu_pct": 30.0, "ram_used": 10 * 2**30, "ram_total": 64 * 2**30,
             "gpus": [{"index": g, "util_pct": util, "mem_used": 2**33, "mem_total": 2**35,
                       "temp_c": 60, "power_w": 250.0} for g in range(2)]} for i in range(n)]


def test_low_gpu_utilisation_and_compute_bound():
    busy = dict(step_ms=50.0, forward_ms=20.0, backward_ms=25.0, input_ms=0.5, optimizer_ms=3.0)
    s = _run(1, 2, lambda r: busy, system={0: _gpu_samples(15.0)})
    assert s["verdict"]["kind"] == "low_gpu_util" and s["verdict"]["severity"] == "critical"
    assert "busy 15% of the time" in s["verdict"]["why"]
    assert s["system"]["gpu_util_pct_mean"] == 15.0
    s = _run(1, 2, lambda r: busy, system={0: _gpu_samples(95.0)})
    assert s["verdict"]["kind"] == "compute_bound" and "GPUs 95% busy" in s["verdict"]["why"]


def test_too_few_steps_gives_no_verdict():
    s = _run(1, 2, lambda r: dict(step_ms=50.0, input_ms=40.0), steps=20, batch=10)
    v = s["verdict"]
    assert v["kind"] == "no_clear_bottleneck" and "too few steps" in v["why"]
    assert s["other_verdicts"] == []


def test_straggler_excess_is_measured_against_the_other_ranks():
    # with two ranks the median of both would sit half-way and halve the excess
    def rank(r):
        if r == 1:
            return dict(step_ms=40.0, input_ms=0.5, forward_ms=31.0, backward_ms=8.0, optimizer_ms=0.5)
        return dict(step_ms=40.0, input_ms=0.5, forward_ms=1.0, backward_ms=38.0, optimizer_ms=0.5)
    v = _run(1, 2, rank)["verdict"]
    assert v["kind"] == "straggler" and v["culprit"]["rank"] == 1
    assert v["evidence"]["excess_ms"] == 30.0


def test_input_not_measured_reads_the_time_between_steps():
    """A get_batch() before each step: no DataLoader, so input is not measured (null, never 0),
    and the 15 ms between 2 ms steps is the input wait; the model phases are 90% of the *step* but
    not compute-bound, since most of the wall clock is between steps."""
    s = _run(1, 2, lambda r: dict(step_ms=2.0, input_ms=None, forward_ms=0.5, backward_ms=1.2,
                                  optimizer_ms=0.1, gap_ms=15.0))
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["severity"] == "critical"
    assert v["evidence"]["source"] == "between_steps"
    assert "input is not measured" in v["why"] and "time between steps, e.g. fetching the next batch" in v["why"]
    assert "wrap_dataloader" in v["next_step"]
    assert "compute_bound" not in _kinds(s)
    assert s["across_ranks"]["input"] is None and all(r["phases"]["input"] is None for r in s["ranks"])
    from traceml_core.report.render_txt import render
    txt = render(s)
    assert "not measured: input" in txt and "0.00" not in txt.split("input", 1)[1].split("\n", 1)[0]


def test_one_median_step_everywhere():
    """The summary's median step is the p50 of every step of every rank; the verdicts quote it and
    compare reads the same histogram."""
    from traceml_core.report.compare import Run, compare_phase

    def rank(r):
        if r == 1:
            return dict(step_ms=60.0, input_ms=1.0, forward_ms=40.0, backward_ms=15.0, optimizer_ms=4.0)
        return dict(step_ms=60.0, input_ms=1.0, forward_ms=10.0, backward_ms=45.0, optimizer_ms=4.0)
    s = _run(1, 3, rank)
    med = s["step_time"]["median_ms"]
    assert abs(med - 60.0) / 60.0 < 0.01 and s["step_time"]["steps"] == 600
    assert f"the median step, {med:.1f} ms" in s["verdict"]["why"]
    run = Run("A", Path("x"), s)
    assert abs(compare_phase("step", run, run, floor_pct=3.0, floor_ms=0.01).a_ms - med) < 1e-3  # (the summary rounds to 0.1 us)


# --- communication ---------------------------------------------------------------------------------
GPU_WORDS = ("bf16", "torch.compile", "per GPU", "GPU", "pin_memory", "nvidia-smi", "NCCL")


def _comm(step, fwd, bwd, opt, comm, busy=None, nbytes=40_000_000, calls=4, h2d=None):
    busy = comm if busy is None else busy
    return dict(step_ms=step, input_ms=0.2, forward_ms=fwd, backward_ms=bwd, optimizer_ms=opt,
                comm_ms=comm, comm_busy_ms=busy, comm_bytes=nbytes, comm_bus_bytes=nbytes,
                comm_calls=calls, h2d_ms=h2d)


def test_communication_bound_with_its_numbers_and_cpu_advice():
    # 2 nodes on a slow link: 30 ms of a 50 ms step waiting, 40 MB per step in 32 ms of transfer
    s = _run(2, 1, lambda r: _comm(50.0, 5.0, 10.0, 2.0, 30.0 + r, busy=32.0))
    v = s["verdict"]
    assert v["kind"] == "communication_bound" and v["severity"] == "critical"
    assert "at least 30.0 ms of its 50.0 ms step in 9 of 10 steps (60%" in v["why"]
    assert "40 MB per step in 4 collective(s) at 1.25 GB/s bus bandwidth" in v["why"]
    assert v["evidence"]["busbw_gbps"] == 1.25 and v["evidence"]["least_waiting_rank"] == 0
    assert "GLOO_SOCKET_IFNAME" in v["next_step"] and "no_sync()" in v["next_step"]
    assert not any(w in v["next_step"] for w in GPU_WORDS), v["next_step"]
    assert s["device"] == "cpu"
    c = s["ranks"][0]["comm"]
    assert c["exposed_ms"] == 30.0 and c["busy_ms"] == 32.0 and c["bytes_per_step"] == 40_000_000
    assert c["algbw_gbps"] == c["busbw_gbps"] == 1.25 and c["calls_per_step"] == 4
    assert c["overlap_fraction"] == round(1 - 30 / 32, 4)
    assert s["communication"]["measured"] and s["communication"]["exposed_ms"]["min_rank"] == 0
    assert "comm" in s["phases"] and s["across_ranks"]["comm"]["median_ms"] == 30.5


def test_a_straggler_is_not_called_a_slow_network():
    # rank 3 computes 30 ms longer; the others wait for it in the all-reduce, it waits 0.5 ms
    def rank(r):
        if r == 3:
            return _comm(60.0, 40.0, 14.0, 4.0, 0.5, busy=2.0)
        return _comm(60.0, 10.0, 14.0, 4.0, 30.5, busy=32.0)
    s = _run(2, 2, rank)
    assert s["verdict"]["kind"] == "straggler" and s["verdict"]["culprit"]["rank"] == 3
    assert "communication_bound" not in _kinds(s)


def test_heavy_compute_with_a_fast_network_is_not_communication_bound():
    s = _run(2, 1, lambda r: _comm(80.0, 30.0, 45.0, 3.0, 1.5, busy=20.0))
    assert "communication_bound" not in _kinds(s)
    v = s["verdict"]
    assert v["kind"] == "compute_bound" and "communication excluded" in v["why"]
    assert "OMP_NUM_THREADS" in v["next_step"]
    assert not any(w in v["next_step"] for w in GPU_WORDS), v["next_step"]


def test_gpu_runs_get_gpu_advice():
    # h2d measured: the SDK timed these ranks with CUDA events
    s = _run(2, 1, lambda r: _comm(50.0, 5.0, 10.0, 2.0, 30.0, busy=32.0, h2d=0.5))
    assert s["device"] == "cuda"
    v = s["verdict"]
    assert v["kind"] == "communication_bound"
    assert "NCCL_SOCKET_IFNAME" in v["next_step"] and "bf16_compress_hook" in v["next_step"]
    s = _run(1, 2, lambda r: _comm(80.0, 30.0, 45.0, 3.0, 1.5, h2d=0.5))
    assert s["verdict"]["kind"] == "compute_bound" and "bf16 autocast" in s["verdict"]["next_step"]


def test_unmeasured_communication_is_null_not_zero():
    s = _run(1, 2, lambda r: dict(step_ms=20.0, forward_ms=8.0, backward_ms=10.0))
    assert s["ranks"][0]["comm"] is None and s["ranks"][0]["phases"]["comm"] is None
    assert s["communication"]["measured"] is False and s["communication"]["exposed_ms"] is None
    assert "backward includes the gradient all-reduce" in s["verdict"]["why"]


def test_small_all_reduces_on_one_cpu_node_get_latency_advice():
    # the README's demo: 2 ranks on one node, one 25 kB bucket per step, CPUs saturated
    samples = {0: [{"ts": 1.0 + i, "cpu_pct": 99.0, "ram_used": 1 << 30, "ram_total": 8 << 30,
                    "gpus": []} for i in range(20)]}
    s = _run(1, 2, lambda r: _comm(8.0, 0.4, 1.3, 0.25, 5.5, nbytes=25_300, calls=1), system=samples)
    v = s["verdict"]
    assert v["kind"] == "communication_bound" and v["evidence"]["small_messages"] is True
    assert "latency rather than bandwidth" in v["why"]
    assert "no_sync()" in v["next_step"] and "99% busy" in v["next_step"]
    for word in GPU_WORDS + ("GLOO_SOCKET_IFNAME", "between the nodes", "bucket_cap_mb"):
        assert word not in v["next_step"], (word, v["next_step"])


def _paused(where: str, slow_ms: float = 0.0, steps: int = 1200, batch: int = 100, pause_s: float = 90.0,
            at: int = 600) -> dict[str, Any]:
    """4 DDP ranks, 20 ms steps; rank 3 is stopped once for ``pause_s`` at step ``at`` (SIGSTOP):
    ``where`` ``step`` (inside its forward) or ``outside`` (between steps); the other ranks wait
    for it in that step's backward. ``slow_ms``: rank 3 is also that much slower in every step."""
    st = RunState(make_settings(Path("/nonexistent"), nnodes=2, nproc_per_node=2))
    pause = int(pause_s * 1e9)
    for rank in range(4):
        rs = st.rank(rank)
        rs.node, rs.host = rank // 2, f"gpu-node-{rank // 2}"
        rs.bye = RankBye("clean", steps, None, 0.0)
        for seq in range(0, steps, batch):
            me = rank == 3
            cols = columns(batch, seq, t0_ns=1_700_000_000_000_000_000, step_ms=20.0 + slow_ms,
                           input_ms=1.0, forward_ms=8.0 + (slow_ms if me else 0.0),
                           backward_ms=9.0 + (0.0 if me else slow_ms), optimizer_ms=1.0)
            for i in range(batch):
                if seq + i >= at:
                    cols["t_end_ns"][i] += pause
                if seq + i == at:
                    if not me:
                        cols["backward_ns"][i] += pause
                        cols["step_ns"][i] += pause
                    elif where == "step":
                        cols["forward_ns"][i] += pause
                        cols["step_ns"][i] += pause
            rs.ingest_fold(relayed({"t": "steps", "rank": rank, "seq": seq, "n": batch, "dropped": 0, "cols": cols}))
    st.finish = LaunchEnd(exit_code=0)
    return build_summary(run_data(st))


def test_a_pause_is_not_a_straggler():
    """Issue 27, finding 6: one rank stopped for 90 s in a 1,200-step run (75 ms per 20 ms step
    on average) is one pause, not a rank slower at every step, wherever the stop caught it; a rank
    that is also slower at every step is still the straggler, for that slowness alone."""
    for where in ("step", "outside"):
        s = _paused(where)
        assert "straggler" not in _kinds(s), (where, s["verdict"])
    s = _paused("step", slow_ms=6.0)
    v = next(v for v in [s["verdict"]] + s["other_verdicts"] if v["kind"] == "straggler")
    assert v["culprit"]["rank"] == 3 and v["evidence"]["pause_ms"] >= 89_000, v
    assert "6.0 ms more per step" in v["why"] and "not counting one pause of 90.0 s" in v["why"], v["why"]
