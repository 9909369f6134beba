"""The finished run, looked at without rerunning it: final_summary.html, `traceml report`,
`traceml compare --html`, and the TensorBoard / JSONL exports, all from real runs.

Two real `traceml run` jobs (gloo DDP on CPU): examples/straggler.py with 3 ranks and rank 2
30 ms slower per step (run with ``--export tensorboard,jsonl``), and examples/input_bound.py with
2 ranks (its run directory holds a *file* named ``tensorboard``, so that export must fail - and
the run must not). Headless Chromium opens the HTML pages from file URLs with every request
routed to a proxy that does not exist; screenshots go to ``artifacts/``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from chromium import Chromium, chromium_path
from tinyrun import PYTHON, REPO, env_for, traceml_cmd
from traceml_core.wire.protocol import COMM_COLUMNS

ARTIFACTS = REPO / "artifacts"
STRAGGLER = REPO / "examples" / "straggler.py"
INPUT_BOUND = REPO / "examples" / "input_bound.py"
needs_chromium = pytest.mark.skipif(chromium_path() is None,
                                    reason="needs chromium (apt-get install chromium)")


def _run(logs: Path, name: str, script: Path, nproc: int, args: list[str], flags: list[str],
         **env: str) -> subprocess.CompletedProcess:
    cmd = traceml_cmd(logs, name, nproc=nproc, script=script, args=args)
    i = cmd.index(str(script))
    cmd[i:i] = flags
    return subprocess.run(cmd, env=env_for(**env), text=True, capture_output=True, timeout=300,
                          cwd=str(REPO))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("report-logs")
    (logs / "inp").mkdir()
    (logs / "inp" / "tensorboard").write_text("not a directory: the tensorboard export must fail")
    strag = _run(logs, "strag", STRAGGLER, 3, ["--steps", "160"], ["--export", "tensorboard,jsonl"],
                 STRAGGLER_RANK="2", STRAGGLER_DELAY_MS="30")
    assert strag.returncode == 0, strag.stderr[-3000:]
    inp = _run(logs, "inp", INPUT_BOUND, 2, ["--steps", "60"], ["--export", "tensorboard"])
    assert inp.returncode == 0, inp.stderr[-3000:]
    return {"strag": logs / "strag", "inp": logs / "inp", "strag_proc": strag, "inp_proc": inp}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "final_summary.json").read_text())


def test_summary_names_the_html_and_keeps_bounded_series(runs):
    s = _summary(runs["strag"])
    assert s["files"]["html"] == str(runs["strag"] / "final_summary.html")
    assert (runs["strag"] / "final_summary.html").is_file()
    tl = s["timeline"]
    assert tl["ranks_shown"] == "all" and [r["rank"] for r in tl["ranks"]] == [0, 1, 2]
    assert 0 < tl["buckets"] <= tl["bucket_limit"] == 256
    # every step of every rank is in a bucket: 160 steps at steps_per_bucket each
    assert tl["buckets"] * tl["steps_per_bucket"] >= 160
    own = {r["rank"]: [v for v in r["own_ms"] if v is not None] for r in tl["ranks"]}
    mean = {k: sum(v) / len(v) for k, v in own.items()}
    assert mean[2] > 20 + max(mean[0], mean[1]), mean  # 30 ms of its own per step
    assert {"input", "forward", "backward", "optimizer", "outside"} <= set(tl["phases"])
    assert tl["nodes"] and tl["nodes"][0]["cpu_pct"], "per-node CPU over time"
    assert tl["nodes"][0]["gpus"] == []  # a CPU run: no GPU series, not zeros


def _open(path: Path, shot: str, tmp_path: Path, width: int = 1400) -> Chromium:
    c = Chromium(tmp_path / f"chrome-{shot}", width=width, height=1000, offline=True)
    c.open(path.resolve().as_uri())
    assert c.wait_for("document.body.dataset.rendered", timeout=60) == "1"
    return c


def _charts(c: Chromium) -> dict:
    return c.eval("""(() => { const out = {};
      for (const id of Object.keys(TraceCharts.registry)) {
        const el = document.getElementById(id);
        out[el.dataset.kind || id] = {labels: TraceCharts.registry[id].labels,
          series: +el.dataset.series, points: +el.dataset.points,
          means: TraceCharts.seriesMeans(id), canvas: !!el.querySelector('canvas')};
      } return out; })()""")


@needs_chromium
def test_html_of_a_straggler_run_shows_the_straggler_above_the_others(runs, tmp_path):
    c = _open(runs["strag"] / "final_summary.html", "strag", tmp_path)
    try:
        assert c.eval("performance.getEntriesByType('resource').length") == 0, "nothing fetched"
        charts = _charts(c)
        assert c.eval("document.querySelectorAll('canvas').length") >= len(charts) >= 8
        own = charts["own"]
        assert own["canvas"] and own["series"] == 3 and own["points"] > 0
        assert own["labels"] == ["rank 0", "rank 1", "rank 2 (culprit)"]
        m = own["means"]
        assert m[2] > 3 * max(m[0], m[1]), m  # the straggler's line lies above the others
        assert charts["step"]["series"] == 3  # step time: lockstep under DDP, drawn anyway
        fwd = charts["phase:forward"]["means"]
        assert fwd[2] > 20 + max(fwd[0], fwd[1]), fwd  # where its extra time goes
        for ph in ("input", "backward", "optimizer", "outside"):
            assert charts[f"phase:{ph}"]["series"] == 3
        text = c.eval("document.body.innerText")
        assert "STRAGGLER" in text and "rank 2 (node 0" in text
        assert "How each rank ended" in text and "3 clean" in text
        assert "Telemetry loss accounting" in text and "step records received" in text
        assert "none known" not in text  # the control: a clean run's count is complete
        assert "No GPU samples on this node" in text  # CPU run: said, not drawn as 0 %
        c.screenshot(ARTIFACTS / "report-straggler.png")
    finally:
        c.close()


@needs_chromium
def test_html_of_an_input_bound_run_shows_the_input_wait(runs, tmp_path):
    c = _open(runs["inp"] / "final_summary.html", "inp", tmp_path)
    try:
        assert c.eval("performance.getEntriesByType('resource').length") == 0
        charts = _charts(c)
        assert charts["own"]["series"] == 2 and charts["phase:input"]["series"] == 2
        inp, fwd = charts["phase:input"]["means"], charts["phase:forward"]["means"]
        assert min(inp) > 5 * max(fwd), (inp, fwd)  # ~32 ms of loading against ~1 ms of model
        text = c.eval("document.body.innerText")
        assert "INPUT-BOUND" in text
        c.screenshot(ARTIFACTS / "report-input-bound.png")
    finally:
        c.close()


def test_a_failing_export_never_fails_the_run(runs):
    err = runs["inp_proc"].stderr
    assert "tensorboard export failed" in err, err[-2000:]
    assert _summary(runs["inp"])["run"]["status"] == "completed"


def test_without_the_writer_library_the_export_says_how_to_get_it(runs, tmp_path):
    """No tensorboardX in this Python: one line saying what to install, nothing raised, the
    summary untouched (as at the end of a run whose environment lacks the extra)."""
    code = ("import sys, json; sys.modules['tensorboardX'] = None\n"
            "from traceml_core.exporters.atend import export_summary\n"
            f"s = json.load(open({str(runs['strag'] / 'final_summary.json')!r}))\n"
            f"print(export_summary(s, {str(tmp_path)!r}, 'tensorboard')[0])")
    p = subprocess.run([PYTHON, "-c", code], env=env_for(), text=True, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "tensorboard export skipped" in p.stdout and "pip install tensorboardX" in p.stdout
    assert not (tmp_path / "tensorboard").exists()


def test_tensorboard_event_files_read_back_with_tensorboards_reader(runs):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    s = _summary(runs["strag"])
    tl = s["timeline"]
    root = runs["strag"] / "tensorboard"
    assert sorted(p.name for p in root.iterdir()) == ["node_00", "rank_0000", "rank_0001", "rank_0002"]
    own_means = {}
    for r in tl["ranks"]:
        acc = ea_mod.EventAccumulator(str(root / f"rank_{r['rank']:04d}")).Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"step_time_ms", "own_time_ms", "memory/peak_mib", "phase/input_ms",
                "phase/forward_ms", "phase/backward_ms", "phase/optimizer_ms", "phase/outside_ms"} <= tags
        ev = acc.Scalars("step_time_ms")
        want = [v for v in r["step_ms"] if v is not None]
        assert [e.value for e in ev] == pytest.approx(want, rel=1e-5)  # float32 in the file
        assert all(b.step > a.step for a, b in zip(ev, ev[1:]))
        assert ev[-1].wall_time > ev[0].wall_time > 1.5e9  # real wall-clock times
        own = [e.value for e in acc.Scalars("own_time_ms")]
        own_means[r["rank"]] = sum(own) / len(own)
    assert own_means[2] > 20 + max(own_means[0], own_means[1])
    node = ea_mod.EventAccumulator(str(root / "node_00")).Reload()
    assert {"system/cpu_pct", "system/ram_used_gib"} <= set(node.Tags()["scalars"])
    assert all(0 <= e.value <= 100 for e in node.Scalars("system/cpu_pct"))


def test_jsonl_has_a_line_per_step_bucket(runs):
    s = _summary(runs["strag"])
    tl = s["timeline"]
    rows = [json.loads(line) for line in (runs["strag"] / "steps.jsonl").read_text().splitlines()]
    ranks = [r for r in rows if r["kind"] == "rank"]
    nodes = [r for r in rows if r["kind"] == "node"]
    assert len(ranks) == 3 * tl["buckets"]
    assert len(nodes) == len(tl["nodes"][0]["t_s"])
    steps = {r["rank"]: r["steps"] for r in s["ranks"]}
    for r in ranks:
        width = r["step_last"] - r["step_first"] + 1
        if r["bucket"] < tl["buckets"] - 1:
            assert width == tl["steps_per_bucket"], r
        else:  # the newest bucket ends at the rank's last step (a resumed attempt's points follow it)
            assert 1 <= width <= tl["steps_per_bucket"] and r["step_last"] == steps[r["rank"]] - 1, r
        assert {"step_ms", "own_ms", "input_ms", "forward_ms", "backward_ms", "mem_peak_bytes"} <= set(r)
    by = {k: [r["own_ms"] for r in ranks if r["rank"] == k and r["own_ms"] is not None] for k in (0, 1, 2)}
    mean = {k: sum(v) / len(v) for k, v in by.items()}
    assert mean[2] > 20 + max(mean[0], mean[1]), mean
    # a bucket's phases are consistent with its step: own time (step - backward + outside) >= 0
    assert all(v >= -0.5 for vals in by.values() for v in vals), by


def test_traceml_report_rebuilds_the_page_and_exports(runs, tmp_path):
    out = tmp_path / "again.html"
    p = subprocess.run([PYTHON, "-m", "traceml_core.cli", "report", str(runs["inp"]), "-o", str(out),
                        "--export", "jsonl"], env=env_for(), text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert "TraceML report: inp" in page and "<script src" not in page and "<link" not in page
    assert (runs["inp"] / "steps.jsonl").is_file()
    bad = subprocess.run([PYTHON, "-m", "traceml_core.cli", "report", str(tmp_path / "nope")],
                         env=env_for(), text=True, capture_output=True, timeout=60)
    assert bad.returncode == 2 and "RUN_DIR" in bad.stderr and "Traceback" not in bad.stderr
    for name, text, words in (("notjson.json", "xx", "the file is not JSON"),
                              ("other.json", '{"a": 1}', "no schema_version/run fields")):
        f = tmp_path / name
        f.write_text(text)
        bad = subprocess.run([PYTHON, "-m", "traceml_core.cli", "report", str(f)],
                             env=env_for(), text=True, capture_output=True, timeout=60)
        msg = bad.stderr.strip()
        assert bad.returncode == 2 and str(f) in msg and words in msg and "\n" not in msg, bad.stderr


@needs_chromium
def test_compare_html_shows_both_runs_side_by_side(runs, tmp_path):
    page = tmp_path / "cmp.html"
    p = subprocess.run([PYTHON, "-m", "traceml_core.cli", "compare", str(runs["inp"]), str(runs["strag"]),
                        "--html", str(page)], env=env_for(), text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    c = _open(page, "cmp", tmp_path, width=1800)
    try:
        text = c.eval("document.body.innerText")
        assert "not comparable" in text.lower()
        assert "A: Verdict" in text and "B: Verdict" in text
        charts = _charts(c)
        assert charts["own"]["canvas"]  # each side draws its own charts
        assert c.eval("document.querySelectorAll('.cols canvas').length") >= 16
        c.screenshot(ARTIFACTS / "report-compare.png")
    finally:
        c.close()


@needs_chromium
def test_html_of_a_failed_run_leads_with_the_failure(tmp_path):
    """A rank SIGKILLs itself: the page opens on how the run ended, and the rank's fate is in
    the table, so nobody reads a bottleneck verdict of a run that died."""
    from tinyrun import run_tiny

    p = run_tiny(tmp_path, "dies", TINY_STEPS="400", TINY_SLEEP_MS="3", TINY_KILL_RANK="1",
                 TINY_KILL_AT="60", PET_MONITOR_INTERVAL="1")
    assert p.returncode != 0
    c = _open(tmp_path / "dies" / "final_summary.html", "dies", tmp_path)
    try:
        text = c.eval("document.body.innerText")
        first = c.eval("document.querySelector('.badbox').innerText")
        assert "The run ended failed" in first, first
        assert "crashed" in text and "How each rank ended" in text
        # a rank ended without a goodbye: the count is incomplete, and the page never says "none" lost
        tel = _summary(tmp_path / "dies")["telemetry"]
        assert tel["complete"] is False, tel
        if not tel["records_lost"]:
            n = tel["ranks_without_goodbye"]
            assert n >= 1 and f"none known (incomplete: {n} rank(s) ended without a goodbye" in text, text
        # what each rank measured before the end is still drawn (a rank killed before its
        # first batch left nothing to draw)
        sent = [r for r in _summary(tmp_path / "dies")["ranks"] if r["steps"] > 0]
        assert _charts(c)["own"]["series"] == len(sent) >= 1
        c.screenshot(ARTIFACTS / "report-failed.png")
    finally:
        c.close()


def _large_run(tmp_path: Path, world: int = 80, steps: int = 20_000, slow: int = 37) -> dict:
    """A long run of many ranks through the real aggregator state (no sockets): rank ``slow``
    spends 5 ms more per step in forward and 5 ms less in backward (a straggler under DDP)."""
    from aggpeers import relayed
    from traceml_core.rundir import prepare_run_dir
    from traceml_core.aggregator.settings import AggregatorSettings
    from traceml_core.aggregator.state import RunState
    from traceml_core.aggregator.adapter import run_data
    from traceml_core.report.output import write_summary

    st = RunState(AggregatorSettings(run_name="big", token="t" * 32, run_dir=tmp_path / "big",
                                     nnodes=1, nproc_per_node=world))
    batch = 500
    for k in range(world):
        rs = st.rank(k)
        rs.node, rs.host = 0, "big-node"
        extra = 5_000_000 if k == slow else 0
        t = 1_700_000_000_000_000_000
        for seq in range(0, steps, batch):
            t_end = [t + (i + 1) * 10_100_000 for i in range(batch)]
            t = t_end[-1]
            rs.ingest_fold(relayed({"rank": k, "seq": seq, "n": batch, "dropped": 0, "cols": {
                "step": list(range(seq, seq + batch)), "t_end_ns": t_end, "step_ns": [10_000_000] * batch,
                "input_ns": [200_000] * batch, "forward_ns": [2_000_000 + extra] * batch,
                "backward_ns": [7_000_000 - extra] * batch, "optimizer_ns": [500_000] * batch,
                "h2d_ns": [-1] * batch, "mem_peak": [300 << 20] * batch,
                **{c: [-1] * batch for c in COMM_COLUMNS}}}))
    # the node's system samples: the real sampler over a fake NVML (the one thing this machine
    # lacks), two GPUs, one busy and one idle, taken 2 s apart over the run
    from traceml_core.sdk.samplers import FakeGpu, FakeNvml, SystemSampler

    nv = FakeNvml([FakeGpu(uuid="GPU-a", util_pct=95, mem_used=60 << 30, mem_total=80 << 30),
                   FakeGpu(uuid="GPU-b", util_pct=5, mem_used=2 << 30, mem_total=80 << 30)])
    sampler = SystemSampler(nv)
    t0 = st.settings.started_at
    for i in range(100):
        sample = sampler.sample()
        sample["ts"] = t0 + 2.0 * i
        st.node_system(0).ingest("big-node", [sample])
    rd = prepare_run_dir(tmp_path / "big", "big")
    return write_summary(run_data(st), rd, "big")


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("large")
    return tmp, _large_run(tmp)


def test_a_long_large_run_keeps_the_series_bounded(large):
    tmp_path, out = large
    tl = out["summary"]["timeline"]
    assert tl["buckets"] <= 256 and tl["buckets"] * tl["steps_per_bucket"] >= 20_000
    assert tl["ranks_shown"] == "selected" and tl["ranks_total"] == 80 and len(tl["ranks"]) == 16
    assert 37 in [r["rank"] for r in tl["ranks"]]  # the culprit is always drawn
    env = tl["envelope"]
    assert env["ranks"] == 80
    assert min(v for v in env["own_ms"]["max"] if v is not None) > 7.5  # the straggler's ~8 ms
    assert max(v for v in env["own_ms"]["median"] if v is not None) < 3.5  # the others' ~3 ms
    assert Path(out["summary_json"]).stat().st_size < 2_000_000
    node = tl["nodes"][0]
    assert len(node["t_s"]) <= 256 and node["t_s"][-1] > 190  # 200 s of samples
    util = {g["index"]: g["util_pct"] for g in node["gpus"]}
    assert set(util[0]) - {None} == {95.0} and set(util[1]) - {None} == {5.0}  # None: no sample then
    # exported per node too, read back with TensorBoard's reader
    from traceml_core.exporters.atend import export_summary

    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    export_summary(out["summary"], tmp_path / "big", "tensorboard")
    acc = ea_mod.EventAccumulator(str(tmp_path / "big" / "tensorboard" / "node_00")).Reload()
    assert {"gpu0/util_pct", "gpu1/util_pct", "gpu0/mem_used_gib"} <= set(acc.Tags()["scalars"])
    assert {e.value for e in acc.Scalars("gpu0/util_pct")} == {95.0}
    runs = sorted(p.name for p in (tmp_path / "big" / "tensorboard").iterdir())
    assert runs[:3] == ["all_ranks_max", "all_ranks_median", "all_ranks_min"] and len(runs) == 3 + 16 + 1


@needs_chromium
def test_html_of_a_large_run_draws_the_envelope_and_communication(large, tmp_path):
    s = dict(large[1]["summary"])
    # the communication section, as a summary that measured it carries it (rendered generically)
    s["communication"] = {"measured": True, "ranks_measured": 80, "not_measured_why": None,
                          "exposed_ms": {"median": 1.5, "min": 0.2, "min_rank": 37, "max": 6.5, "max_rank": 3},
                          "probe": None}
    from traceml_core.report.render_html import render_html

    page = tmp_path / "big.html"
    page.write_text(render_html(s))
    c = _open(page, "big", tmp_path)
    try:
        own = _charts(c)["own"]
        assert own["series"] == 16 + 3, own["labels"]
        assert own["labels"][-3:] == [f"{k} of all 80 ranks" for k in ("max", "median", "min")]
        assert "rank 37 (culprit)" in own["labels"]
        text = c.eval("document.body.innerText")
        assert "16 of 80 ranks are drawn one by one" in text
        assert "Communication" in text and "exposed ms" in text
        assert "No GPU samples" not in text
        labels = [l for ch in c.eval("Object.values(TraceCharts.registry).map(c => c.labels)") for l in ch]
        assert {"gpu0 util %", "gpu1 util %", "gpu0 memory", "gpu1 memory", "cpu %"} <= set(labels)
        c.screenshot(ARTIFACTS / "report-large.png")
    finally:
        c.close()
