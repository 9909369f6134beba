"""Verdicts on synthetic runs: the statistics go through the real ingest and summary code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from aggpeers import columns, make_settings
from traceml_core.aggregator.state import RunState
from traceml_core.report.summary import build_summary

MiB = 1024 * 1024


def _run(nnodes: int, nproc: int, per_rank: Callable[[int], dict[str, Any]], steps: int = 200,
         batch: int = 50, system: Any = None) -> dict[str, Any]:
    st = RunState(make_settings(Path("/nonexistent"), nnodes=nnodes, nproc_per_node=nproc))
    for rank in range(nnodes * nproc):
        rs = st.rank(rank)
        rs.node, rs.host = rank // nproc, f"gpu-node-{rank // nproc}"
        rs.bye = {"status": "clean", "steps": steps, "error": None, "at": 0.0}
        t0 = 1_700_000_000_000_000_000
        for seq in range(0, steps, batch):
            rs.ingest_steps({"t": "steps", "rank": rank, "seq": seq, "n": batch, "dropped": 0,
                             "cols": columns(batch, seq, t0_ns=t0, **per_rank(rank))})
    for node, samples in (system or {}).items():
        st.node_system(node).ingest(f"gpu-node-{node}", samples)
    st.finish = {"exit_code": 0, "interrupted": False, "reason": "", "failed_nodes": []}
    return build_summary(st.to_data())


def _kinds(s):
    return [s["verdict"]["kind"]] + [v["kind"] for v in s["other_verdicts"]]


def test_input_bound_is_named_with_its_numbers():
    s = _run(1, 2, lambda r: dict(step_ms=50.0, input_ms=20.0, forward_ms=10.0, backward_ms=15.0,
                                  optimizer_ms=5.0))
    v = s["verdict"]
    assert v["kind"] == "input_bound" and v["severity"] == "critical"
    assert "waits for the next batch 40% of its step time (20.0 ms of 50.0 ms per step on average)" in v["why"]
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
