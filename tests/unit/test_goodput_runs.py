"""The goodput ledger on real single-node runs: ``traceml compare`` of two runs' ledgers (what a
user reads), declared work, safetensors saves, and summaries rebuilt from checkpoints.

Two ``traceml run`` jobs of tests/slurm/goodput_train.py side by side (one rank each, CPU,
gloo): ``every`` saves a checkpoint after every step (``torch.save`` through a file that takes
``CKPT_MS`` to write, so the save's time is inside it), ``never`` saves none. The compare's
goodput block must name checkpointing as the bucket that moved most, with both runs' figures: A's
0 and B's device-seconds, which are what B's rank recorded of its own saves.

The same two runs check the declared work: ``every`` declares tokens, samples and FLOPs per
step (``traceml.declare_work``), ``never`` declares nothing. A third run beside them,
``safetensors``, saves with safetensors' ``save_model`` and ``save_file`` by turns (they bypass
torch.save): each save is one checkpoint span.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tinyrun import PYTHON, REPO, env_for, stop, traceml_cmd

TRAIN = REPO / "tests" / "slurm" / "goodput_train.py"
STEPS, STEP_MS, CKPT_MS = 20, 20, 500
TOKENS, SAMPLES = 2048, 4
SAFE_EVERY = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("gp-compare-logs")
    procs, truth = {}, {}
    for name, every in (("never", 10_000), ("every", 1), ("safetensors", SAFE_EVERY)):
        truth[name] = tmp_path_factory.mktemp(f"gp-compare-{name}")
        args = ["--steps", str(STEPS), "--step-ms", str(STEP_MS), "--ckpt-every", str(every),
                "--ckpt-ms", str(CKPT_MS), "--ckpt-dir", str(truth[name] / "ckpt")]
        if name == "safetensors":
            args += ["--save", "safetensors"]
        if name == "every":
            args += ["--tokens-per-step", str(TOKENS), "--samples-per-step", str(SAMPLES),
                     "--flops-per-step", "1e9", "--dtype", "bf16"]
        # output to files, not pipes: the three run at once and are waited for one after the
        # other, so a run's unread pipe could fill and block it while the test waited on another
        with open(truth[name] / "stdout.txt", "w") as out, open(truth[name] / "stderr.txt", "w") as err:
            procs[name] = subprocess.Popen(traceml_cmd(logs, name, nproc=1, script=TRAIN, args=args),
                                           env=env_for(GOODPUT_TRUTH=str(truth[name])), text=True,
                                           stdout=out, stderr=err, cwd=str(REPO))
    try:
        for name, p in procs.items():
            p.wait(timeout=240)
            if p.returncode != 0:   # in full: an assertion's message would be cut to a few lines
                out, err = ((truth[name] / f).read_text() for f in ("stdout.txt", "stderr.txt"))
                pytest.fail(f"run {name!r} exited {p.returncode}\n--- stderr\n{err[-12000:]}\n--- stdout\n{out[-4000:]}",
                            pytrace=False)
    finally:
        for p in procs.values():
            stop(p)
    return {name: (logs / name, truth[name]) for name in procs}


def saves_recorded(truth_dir) -> float:
    recs = [json.loads(ln) for ln in (truth_dir / "rank0-a0.jsonl").read_text().splitlines() if ln]
    return sum(r["end"] - r["start"] for r in recs if r["k"] == "ckpt")


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "traceml_core.cli", "compare", *map(str, args)],
                          env=env_for(), capture_output=True, text=True, timeout=60)


def test_compare_names_checkpointing_with_both_runs_figures(runs):
    (a_dir, a_truth), (b_dir, b_truth) = runs["never"], runs["every"]
    assert saves_recorded(a_truth) == 0.0
    saved = saves_recorded(b_truth)
    assert saved >= STEPS * CKPT_MS / 1000 * 0.9, saved

    r = cli(a_dir, b_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    print(text[text.index("Goodput ("):])
    head = next(ln for ln in text.splitlines() if ln.startswith("Goodput ("))
    assert "A: " in head and "B: " in head and "rank-seconds in 1 attempt(s)" in head, head
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("checkpointing"))
    assert row.endswith("<- largest change"), row
    doc = json.loads(cli(a_dir, b_dir, "--json").stdout)["goodput"]
    ck = next(x for x in doc["rows"] if x["bucket"] == "checkpoint")
    assert doc["largest"] == "checkpoint"
    # A saved nothing: a measured 0 (its workers time saves), not "not measured"
    assert ck["a_s"] == 0.0 and ck["a_pct"] == 0.0
    # B: what its rank recorded of its own saves, within 2% of the allocation or 1 s
    tol = max(0.02 * doc["total_b_s"], 1.0)
    assert abs(ck["b_s"] - saved) <= tol, (ck, saved, tol)
    assert ck["change_pp"] == pytest.approx(ck["b_pct"] - ck["a_pct"], abs=0.02) and ck["change_pp"] > 10
    # both figures, as the user reads them
    assert f"0.0 (0.0%)" in row and f"{ck['b_s']:,.1f} ({ck['b_pct']:.1f}%)" in row, row
    assert f"{ck['change_pp']:+.1f} pp" in row, row
    # the other way round, the change has the other sign
    back = json.loads(cli(b_dir, a_dir, "--json").stdout)["goodput"]
    ck_back = next(x for x in back["rows"] if x["bucket"] == "checkpoint")
    assert back["largest"] == "checkpoint" and ck_back["change_pp"] == pytest.approx(-ck["change_pp"], abs=0.02)


def _summary(run_dir):
    return (json.loads((run_dir / "final_summary.json").read_text()),
            (run_dir / "final_summary.txt").read_text())


def test_declared_work_gives_tokens_and_samples_per_second_and_mfu_says_why_not(runs):
    data, text = _summary(runs["every"][0])
    tp = data["goodput"]["throughput"]
    (a,) = data["goodput"]["attempts"]
    (rank,) = data["ranks"]
    assert rank["steps"] == STEPS
    # over the allocation: the rank's steps x what each is worth / the attempt's wall time
    assert tp["tokens_per_s"] == pytest.approx(STEPS * TOKENS / a["wall_s"], rel=0.01), (tp, a["wall_s"])
    assert tp["samples_per_s"] == pytest.approx(STEPS * SAMPLES / a["wall_s"], rel=0.01), tp
    (node,) = tp["nodes"]
    # while stepping: per second of the rank's own step time (the steps are ~STEP_MS each)
    assert node["tokens_per_step_s"] > 10 * tp["tokens_per_s"] and node["samples_per_step_s"] > node["samples_per_s"]
    assert node["tokens_per_step_s"] < TOKENS / (STEP_MS / 1000), node
    # CPU: MFU is not measured, and says why (no peak for the device), never a 0
    assert tp["mfu"] is None and tp["not_measured"]["mfu"].startswith("no peak FLOP/s for this device (CPU)"), tp
    assert f"throughput: {tp['tokens_per_s']:,.1f} tokens/s over the allocation (node 0 " in text, text
    assert f"{tp['samples_per_s']:,.1f} samples/s over the allocation" in text
    assert "throughput: MFU not measured: no peak FLOP/s for this device (CPU)" in text


def test_without_a_declaration_throughput_is_not_measured_and_says_how(runs):
    data, text = _summary(runs["never"][0])
    tp = data["goodput"]["throughput"]
    assert tp["tokens_per_s"] is None and tp["samples_per_s"] is None and tp["mfu"] is None, tp
    assert all("traceml.declare_work(" in tp["not_measured"][k] for k in ("tokens_per_s", "samples_per_s", "mfu"))
    line = next(ln for ln in text.splitlines() if "throughput:" in ln)
    assert "tokens/s, samples/s, MFU not measured: no rank declared what a step is worth: call " \
           "traceml.declare_work(" in line, line


def test_safetensors_saves_are_timed_as_checkpoints(runs):
    pytest.importorskip("safetensors")
    run_dir, truth_dir = runs["safetensors"]
    data, text = _summary(run_dir)
    (a,) = data["goodput"]["attempts"]
    recs = [json.loads(ln) for ln in (truth_dir / "rank0-a0.jsonl").read_text().splitlines() if ln]
    saves = [r for r in recs if r["k"] == "ckpt"]
    assert len(saves) == STEPS // SAFE_EVERY, saves
    # every save_model and save_file call is one checkpoint (save_model's own save_file not twice)
    assert a["progress"]["checkpoints"] == len(saves) and "checkpoint" not in a["not_measured"], a
    assert a["progress"]["checkpoint_position"] == saves[-1]["step"], a["progress"]
    took = sum(r["end"] - r["start"] for r in saves)
    assert a["buckets"]["checkpoint"] > 0 and abs(a["buckets"]["checkpoint"] - took) <= max(0.02 * a["total_s"], 1.0)
    assert f"{len(saves)} checkpoint(s) seen, the last after step {saves[-1]['step'] - 1}" in text, text


def test_a_summary_rebuilt_from_its_checkpoint_keeps_the_attempts_before_it(runs, tmp_path):
    """The three runs' real files laid out as one run of three attempts (as the aggregators'
    archive_previous leaves them): attempt 0 wrote its summary, attempt 1 only its checkpoint (its
    node 0 killed), attempt 2 is at the top. ``traceml summarize`` of attempt 1's own directory
    and of the run rebuild from the checkpoints; each ledger keeps every attempt before it."""
    import shutil

    from traceml_core.rundir import CHECKPOINT_NAME, SUMMARY_JSON

    chain = tmp_path / "chain"
    (chain / "attempt-0").mkdir(parents=True)
    (chain / "attempt-1").mkdir()
    for name in (SUMMARY_JSON, CHECKPOINT_NAME):
        shutil.copy(runs["never"][0] / name, chain / "attempt-0" / name)
    shutil.copy(runs["every"][0] / CHECKPOINT_NAME, chain / "attempt-1" / CHECKPOINT_NAME)
    shutil.copy(runs["safetensors"][0] / CHECKPOINT_NAME, chain / CHECKPOINT_NAME)
    ids = {name: json.loads((runs[name][0] / SUMMARY_JSON).read_text())["goodput"]["attempts"][-1]["run_id"]
           for name in ("never", "every", "safetensors")}

    def summarize(d):
        r = subprocess.run([PYTHON, "-m", "traceml_core.cli", "summarize", str(d)], env=env_for(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads((d / SUMMARY_JSON).read_text())["goodput"], r.stdout

    g1, text1 = summarize(chain / "attempt-1")
    assert [a["run_id"] for a in g1["attempts"]] == [ids["never"], ids["every"]], g1["attempts"]
    assert not g1["attempts"][0]["rebuilt"] and g1["attempts"][1]["rebuilt"] is True
    assert text1.startswith("Goodput of run over 2 attempts"), text1[:300]
    g, text = summarize(chain)
    assert [a["run_id"] for a in g["attempts"]] == [ids["never"], ids["every"], ids["safetensors"]]
    assert [a["rebuilt"] for a in g["attempts"]] == [False, True, True]
    # attempt 1's row is the one its own rebuilt summary holds; the total adds all three
    assert g["attempts"][1]["total_s"] == g1["attempts"][1]["total_s"]
    assert round(sum(a["total_s"] for a in g["attempts"]), 3) == g["total"]["total_s"]
    assert "Goodput of run over 3 attempts" in text and "(rebuilt from its checkpoint)" in text


def test_the_page_shows_the_throughput_and_what_is_not_measured(runs, tmp_path):
    from chromium import Chromium, chromium_path

    if chromium_path() is None:
        pytest.skip("no headless browser here (CI has one)")
    c = Chromium(tmp_path / "chrome", width=1400, height=1000, offline=True)
    try:
        c.open((runs["every"][0] / "final_summary.html").resolve().as_uri())
        assert c.wait_for("document.body.dataset.rendered", timeout=60) == "1"
        lines = [ln for ln in c.eval("document.body.innerText").splitlines() if ln.startswith("throughput:")]
    finally:
        c.close()
    tp = _summary(runs["every"][0])[0]["goodput"]["throughput"]
    # the page rounds as JavaScript does (1852.05 -> "1,852.1"; Python's format gives "1,852.0")
    shown = [re.fullmatch(r"throughput: ([\d,.]+) tokens/s, ([\d,.]+) samples/s over the allocation", ln)
             for ln in lines]
    m = next((x for x in shown if x), None)
    assert m is not None, lines
    tokens, samples = (float(g.replace(",", "")) for g in m.groups())
    assert abs(tokens - tp["tokens_per_s"]) <= 0.051 and abs(samples - tp["samples_per_s"]) <= 0.051, (lines, tp)
    assert any(ln.startswith("throughput: MFU not measured: no peak FLOP/s for this device (CPU)") for ln in lines), lines
