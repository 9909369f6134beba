"""Failures named by their cause, on real runs (issue 31, item 6): the real ``traceml run``, real
torchrun and gloo DDP workers on loopback, each case a failure a new user meets.

* A rank that runs out of data and ends cleanly while the other still trains: the headline names
  it first, the other rank's lost-peer error as what followed, placed in the script's own line
  (never in TraceML's timing wrapper around ``backward``).
* A collective only one rank calls (a mismatch): gloo aborts that rank from native code; the
  headline quotes gloo's own sentence from the rank's stderr, not "a segfault in an extension".
* A script that exits in ``argparse`` before its first step: DID-NOT-START with the script's own
  message, from ``traceml run``, ``traceml summarize`` and ``traceml report`` alike.

The logic (which rank is first, what a library's line means, what the verdicts may read after a
failure) is tested in-process in tests/unit/test_failure_causality.py.
"""

from __future__ import annotations

import json
import subprocess

from harness import PY, REPO, base_env, run

STEPS = ("--steps", "60", "--step-ms", "5")


def test_a_rank_that_left_early_is_named_first(tmp_path):
    r = run(tmp_path, STEPS + ("--fault", "leave", "--fault-rank", "0", "--fault-step", "30", "--settle", "0"),
            run_name="left")
    s = r.summary()
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"]["rank"] == 0, (v, r.err[-3000:])
    ev = v["evidence"]
    assert ev["cause"] == "left_early" and ev["step"] == 30 and ev["consequence_ranks"] == [1], ev
    assert v["why"].startswith("rank 0 (node 0, "), v["why"]
    assert "finished cleanly after 30 steps while rank 1 was still training" in v["why"], v["why"]
    assert s["run"]["reason"].startswith(
        "rank 0 finished after 30 steps while rank 1 was still training; rank 1's error followed"), s["run"]
    # rank 1's error, where the script called backward: never TraceML's wrapper of it
    assert ev["where"] and ev["where"].startswith("faulty_train.py:") and ev["where"].endswith(" in main"), ev
    assert "_tm_wrapper" not in json.dumps(v) and "<traceml" not in json.dumps(v), v
    assert "check the node and network" not in v["why"] and "same number of steps" in v["next_step"], v
    ranks = {x["rank"]: x for x in s["ranks"]}
    assert ranks[0]["status"] == "clean" and ranks[1]["failure"]["role"] == "consequence"
    assert "Verdict: RUN-FAILED (critical): rank 0 (node 0, " in r.out


def test_a_collective_mismatch_is_named_with_glooes_words(tmp_path):
    r = run(tmp_path, STEPS + ("--fault", "mismatch", "--fault-rank", "0", "--fault-step", "30"),
            run_name="mismatch")
    s = r.summary()
    v = s["verdict"]
    assert v["kind"] == "run_failed" and v["culprit"]["rank"] == 0, (v, r.err[-3000:])
    ev = v["evidence"]
    assert ev["cause"] == "collective_mismatch" and ev["signal"] == "SIGABRT", ev
    assert ev["library"]["library"] == "gloo" and ev["library"]["kind"] == "mismatch", ev
    # gloo's own sentence, quoted in the headline and the run's reason
    said = "Is there a distributed collective mismatch in your code?"
    assert said in v["why"] and said in s["run"]["reason"], v["why"]
    assert "segfault" not in v["next_step"] and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in v["next_step"], v
    assert ev["consequence_ranks"] == [1], ev
    ranks = {x["rank"]: x for x in s["ranks"]}
    assert said in ranks[0]["exit"]["stderr"], ranks[0]["exit"]
    # the worker's stderr still reached the terminal, unchanged
    assert said in r.err and "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in r.err


def _did_not_start(s: dict) -> None:
    v = s["verdict"]
    assert v["kind"] == "did_not_start" and v["severity"] == "critical", v
    assert s["run"]["status"] == "failed" and not (s.get("partial") or {}), s.get("partial")
    assert "exited with sys.exit(2) after printing" in v["why"], v["why"]
    assert "error: unrecognized arguments: --stpes 3" in v["why"], v["why"]
    assert s["other_verdicts"] == [], s["other_verdicts"]


def test_an_argparse_exit_did_not_start_on_every_path(tmp_path):
    r = run(tmp_path, ("--stpes", "3"), run_name="typo")
    assert r.code == 1, (r.code, r.err[-3000:])
    assert "error: unrecognized arguments: --stpes 3" in r.err   # the script's own words, as printed
    _did_not_start(r.summary())
    assert "Verdict: DID-NOT-START (critical)" in r.out and "PARTIAL" not in r.out, r.out
    assert (r.run_dir / "final_summary.html").is_file()
    env = base_env(tmp_path)
    for sub in ("summarize", "report"):
        for f in ("final_summary.json", "final_summary.html"):  # each path builds them again
            (r.run_dir / f).unlink(missing_ok=True)
        p = subprocess.run([PY, "-m", "traceml_core.cli", sub, str(r.run_dir)], capture_output=True,
                           text=True, env=env, timeout=120, cwd=str(REPO))
        assert p.returncode == 0, (sub, p.stdout[-2000:], p.stderr[-2000:])
        _did_not_start(r.summary())
        if sub == "summarize":
            assert "Verdict: DID-NOT-START (critical)" in p.stdout, p.stdout
        else:
            assert (r.run_dir / "final_summary.html").is_file(), p.stdout
