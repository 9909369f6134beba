"""Scripts that never call traceml, under `traceml run`: real DDP (gloo), real aggregator.

Steps are inferred from optimizer steps by the worker bootstrap; the summary says so and how to
get exact phases. Where nothing can be inferred it says that no rank called traceml and shows the
two lines to add -- never "never joined".
"""

from __future__ import annotations

from zc import SCRIPTS, assert_real_steps, optimizer_steps, traceml_run


def test_uninstrumented_ddp_script_gets_real_steps_and_says_they_were_inferred(tmp_path):
    res = traceml_run(tmp_path, "plain_ddp.py", env={"PLAIN_STEPS": "40"})
    assert optimizer_steps(res["out"], "plain") == 40
    data = assert_real_steps(res, steps=40, source="inferred")
    assert data["steps"]["forward_measured"] is True      # the DDP model's forward
    assert all(r["phases"]["forward"] for r in data["ranks"])
    text = res["text"]
    assert "Steps: inferred (no rank calls traceml): one step = one optimizer step" in text
    assert "`import traceml_core as traceml`" in text and "`with traceml.trace_step(model):`" in text
    assert data["verdict"]["kind"] != "input_bound"   # the control of the next test


def test_inferred_steps_fold_gradient_accumulation_and_find_a_slow_loader(tmp_path):
    res = traceml_run(tmp_path, "plain_ddp.py",
                      env={"PLAIN_STEPS": "30", "PLAIN_ACCUM": "2", "PLAIN_FETCH_MS": "25"})
    data = assert_real_steps(res, steps=30, source="inferred")
    assert data["steps"]["backward_per_step"] == 2
    assert "2 backward passes per step (gradient accumulation folded into the step)" in res["text"]
    # two 25 ms fetches per optimizer step: the inferred input phase carries them
    assert data["verdict"]["kind"] == "input_bound", data["verdict"]
    assert data["across_ranks"]["input"]["median_ms"] >= 45


def test_nothing_to_infer_says_no_rank_called_traceml_and_shows_the_two_lines(tmp_path):
    res = traceml_run(tmp_path, "plain_ddp.py", env={"PLAIN_STEPS": "10", "PLAIN_NO_OPTIMIZER": "1"})
    assert res["code"] == 0, res["err"][-3000:]
    data = res["summary"]
    v = data["verdict"]
    assert v["kind"] == "no_steps" and v["severity"] == "warning"
    assert "no rank calls traceml (init()/trace_step)" in v["why"]
    assert "import traceml_core as traceml" in v["next_step"] and "traceml.trace_step(model)" in v["next_step"]
    assert data["rank_endings"] == {"clean": 2}
    assert "never joined" not in res["text"] and "never connected" not in res["text"]
    assert "NO-STEPS" in res["text"]


def test_script_with_trace_step_keeps_its_own_steps(tmp_path):
    script = tmp_path / "traced.py"
    script.write_text((SCRIPTS / "plain_ddp.py").read_text().replace(
        "    for i, (x, y) in enumerate(loader):\n        loss =",
        "    import traceml_core as traceml\n"
        "    for i, (x, y) in enumerate(loader):\n      with traceml.trace_step(model):\n        loss =",
    ).replace("        loss.backward()\n        if", "        loss.backward()\n      if"))
    # (the body after the first line is re-indented by two: only `loss = ...; loss.backward()` is
    # inside trace_step, so a traced step is one micro-batch -- not an optimizer step)
    res = traceml_run(tmp_path, str(script), env={"PLAIN_STEPS": "12", "PLAIN_ACCUM": "2"})
    assert res["code"] == 0, res["err"][-3000:]
    data = res["summary"]
    assert data["steps"]["source"] == "trace_step"
    assert [r["steps"] for r in data["ranks"]] == [24, 24]
    assert "Steps: inferred" not in res["text"]


def test_auto_steps_off_still_joins_every_rank_and_says_why_there_are_no_steps(tmp_path):
    res = traceml_run(tmp_path, "plain_ddp.py", env={"PLAIN_STEPS": "5"}, flags=("--auto-steps=off",))
    data = res["summary"]
    assert res["code"] == 0 and data["rank_endings"] == {"clean": 2}
    assert data["verdict"]["kind"] == "no_steps"
    assert "never entered trace_step" in data["verdict"]["why"]


def _init_first(tmp_path, *, run_name_arg: bool) -> str:
    """plain_ddp.py with ``traceml.init(...)`` as its first lines, before ``import torch``."""
    script = tmp_path / "init_first.py"
    call = 'traceml.init(run_name="ignored-under-traceml-run")' if run_name_arg else "traceml.init()"
    body = (SCRIPTS / "plain_ddp.py").read_text()
    script.write_text(body.replace('import os\n', f"import os\nimport traceml_core as traceml\n{call}\n", 1))
    return str(script)


def test_init_before_import_torch_trains_and_infers_steps(tmp_path):
    # the attack finding: init() imports torch, the bootstrap's hook on that import called init()
    # again in the same thread while the first held its lock -- every rank hung before training
    res = traceml_run(tmp_path, _init_first(tmp_path, run_name_arg=False), env={"PLAIN_STEPS": "20"},
                      timeout=240)
    assert optimizer_steps(res["out"], "plain") == 20
    assert_real_steps(res, steps=20, source="inferred")


def test_init_before_import_torch_with_trace_step_keeps_the_scripts_steps(tmp_path):
    script = _init_first(tmp_path, run_name_arg=True)
    text = open(script).read().replace(
        "    for i, (x, y) in enumerate(loader):\n        loss =",
        "    for i, (x, y) in enumerate(loader):\n      with traceml.trace_step(model):\n        loss =",
    ).replace("        loss.backward()\n        if", "        loss.backward()\n      if")
    open(script, "w").write(text)
    res = traceml_run(tmp_path, script, env={"PLAIN_STEPS": "12"}, timeout=240)
    assert res["code"] == 0, res["err"][-3000:]
    data = res["summary"]
    assert data["steps"]["source"] == "trace_step"
    assert [r["steps"] for r in data["ranks"]] == [12, 12]
    # the script's own run name cannot rename a run the launcher named (its token is bound to
    # the launcher's name): ignored, and said once
    assert data["run"]["name"] == "r"
    assert "init(run_name='ignored-under-traceml-run') is ignored under `traceml run`" in res["err"]
