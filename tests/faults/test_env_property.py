"""Broken environments: every malformed ``SLURM_*`` value, flag and ``TRACEML_*`` value gives one
clear ConfigError naming it (one paragraph, the value seen, no traceback) -- property tests over
generated environments built on REAL environment dumps from the local cluster, then a sample
through the real CLI in a subprocess to prove the user sees one line and no traceback.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from harness import PY, base_env
from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_core.options import OPTIONS
from traceml_slurm.environment import SlurmEnvironment
from traceml_slurm.settings import SlurmVars

DUMPS = Path(__file__).parents[1] / "fixtures" / "slurm_env"
SLURM = [SlurmEnvironment]


def dump(name: str, gen: str = "22.05") -> dict[str, str]:
    env = json.loads((DUMPS / gen / f"{name}.json").read_text())
    env.pop("_meta", None)
    return env


STEP = dump("gres_step_node1")        # node 1 of a 2-node srun step
BATCH = dump("single_batch")          # the batch shell of a one-node job
# the same situations on the other Slurm generation, when its dumps are committed
BASES = [STEP, BATCH] + [dump(n, "24.11") for n in ("gres_step_node1", "single_batch")
                         if (DUMPS / "24.11" / f"{n}.json").is_file()]

# real environment values never hold NUL (they are C strings)
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=24)


def check(env: dict[str, str], cli: dict[str, str], name: str, value: str, *, must_fail: bool) -> None:
    try:
        resolve(cli, env, SLURM)
    except ConfigError as exc:
        msg = str(exc)
        assert name in msg, (name, msg)
        assert "\n" not in msg and "Traceback" not in msg, msg
        assert len(msg) < 1200
        if len(value.strip()) > 80:   # long values are shortened: the start and the length
            assert f"characters)" in msg and repr(value.strip()[:40]) in msg, msg
        elif value.strip():
            assert repr(value.strip()) in msg or repr(value) in msg, msg
        return
    assert not must_fail, f"{name}={value!r} was accepted"


# ---- SLURM_* ---------------------------------------------------------------------------------

INT_VARS = {SlurmVars.variable(name): SlurmVars.limit(name)
            for name in SlurmVars.model_fields if SlurmVars.limit(name) is not None}


def malformed_int(limit) -> st.SearchStrategy[str]:
    return st.one_of(
        text.filter(lambda t: t.strip() != "" and not re.search(r"\d", t)),      # no digits at all
        st.integers(1, 10**6).map(lambda n: f"{n}x"),                              # junk suffix
        st.integers(1, 99).map(lambda n: f"{n}(x2)"),                              # a count list
        st.integers(1, 99).map(lambda n: f"{n}.5"),                                # a fraction
        st.integers(-10**6, limit.lo - 1).map(str),                                # below the minimum
        st.integers(limit.hi + 1, 10**30).map(str),                                # above the maximum
        st.integers(1, 40).map(lambda n: f"1e{n}"),                                # scientific notation
        st.integers(5_000, 200_000).map(lambda n: "9" * n),                        # absurdly long
    )


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_malformed_integer_slurm_variables(data):
    name = data.draw(st.sampled_from(sorted(INT_VARS)))
    value = data.draw(malformed_int(INT_VARS[name]))
    env = dict(data.draw(st.sampled_from(BASES)), **{name: value})
    check(env, {}, name, value, must_fail=True)


bad_nodelist = st.one_of(
    st.sampled_from(["node[1-", "node]1[", "node[x-y]", "node[5-2]", "node[1-99999999]", "[]", "a[]"]),
    st.builds(lambda a, b: f"node[{a}-{b}", st.integers(0, 99), st.integers(0, 99)),
    st.builds(lambda a, b: f"node[{b}-{a}]", st.integers(0, 50), st.integers(51, 99)),
    st.text(" \t", min_size=1, max_size=3),                                      # blank
)


@settings(max_examples=80, deadline=None)
@given(value=bad_nodelist, step=st.booleans())
def test_malformed_node_lists(value, step):
    # the list the resolver uses: the step's inside a step, the job's in a batch shell
    name = "SLURM_STEP_NODELIST" if step else "SLURM_JOB_NODELIST"
    env = dict(STEP if step else BATCH, **{name: value})
    check(env, {}, name, value, must_fail=True)


@settings(max_examples=80, deadline=None)
@given(value=text.filter(lambda t: t.strip() and not re.fullmatch(r"(\s*\d+\s*(\(x\s*\d+\s*\))?\s*)(,\s*\d+\s*(\(x\s*\d+\s*\))?\s*)*", t)))
def test_malformed_step_tasks_per_node(value):
    check(dict(STEP, SLURM_STEP_TASKS_PER_NODE=value), {}, "SLURM_STEP_TASKS_PER_NODE", value,
          must_fail=True)


@settings(max_examples=60, deadline=None)
@given(value=text.filter(lambda t: t.strip() and not t.strip().isdigit()))
def test_malformed_job_id(value):
    check(dict(STEP, SLURM_JOB_ID=value), {}, "SLURM_JOB_ID", value, must_fail=True)


FREE_TEXT = ["SLURM_JOB_NAME", "SLURM_SUBMIT_DIR", "SLURMD_NODENAME", "SLURM_STEP_GPUS",
             "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"]


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(FREE_TEXT), value=text, base=st.sampled_from(["step", "batch"]))
def test_any_free_text_slurm_value_resolves_or_is_named(name, value, base):
    """Names and paths may hold anything: never a crash, and a run name that is a valid name."""
    env = dict(STEP if base == "step" else BATCH, **{name: value})
    try:
        c = resolve({}, env, SLURM)
    except ConfigError as exc:
        assert name in str(exc) and "\n" not in str(exc)
        return
    assert re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", c.run_name), c.run_name


# ---- flags and TRACEML_* ---------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_flag_or_traceml_value_is_valid_or_named(data):
    """For every option and ANY value, as a flag or a variable: either it resolves to a value its
    option accepts, or a ConfigError names the flag/variable and the value."""
    opt = data.draw(st.sampled_from(OPTIONS))
    value = data.draw(st.one_of(text, st.integers(-10**6, 10**6).map(str)))
    as_flag = data.draw(st.booleans())
    name = opt.flag if as_flag else opt.env
    cli = {opt.key: value} if as_flag else {}
    env = {} if as_flag else {opt.env: value}
    try:
        c = resolve(cli, env, SLURM)
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and "Traceback" not in msg
        # the value's own error names it; a valid value may still break a cross-check (which
        # then names what it contradicts)
        if name in msg:
            return
        opt.parse(value)  # must not raise: the value is valid, a cross-check refused the whole
        return
    # an output's settings are the launch config's ``outputs`` (exporters/output.py)
    got = c.outputs.get(opt.key) if opt.key in c.outputs else getattr(c, opt.key, None)
    if value.strip():
        assert got == opt.parse(value) or opt.key == "cluster", (opt.key, value, got)


MALFORMED_OPTION = {
    "nnodes": ["0", "two", "-1", "1.5"], "node_rank": ["-1", "first"], "nproc_per_node": ["0", "4gpus"],
    "master_addr": ["node 1", "a/b"], "master_port": ["0", "65536", "http"],
    "run_name": ["a/b", "..", "x" * 129, "run name"], "mode": ["fancy", "tui"],
    "aggregator_port": ["70000", "-5"], "aggregator_host": ["two words"],
    "aggregator_bind_host": ["eth0", "node1"], "aggregator_wait": ["soon", "-1", "nan"],
    "hang_timeout": ["-3", "never", "nan"], "cluster": ["pbs"], "logs_dir": [" "],
    "status_interval": ["0", "soon", "inf"], "live_refresh": ["0", "-1"],
    "dashboard_host": ["my laptop", "node1"], "dashboard_port": ["65536", "-1"], "export": ["csv", ",", "wandb,csv"], "export_interval": ["0", "soon", "nan", "7200"], "hang_report_after": ["soon", "0", "nan"], "link_probe": ["fast", "5000", "-1"],
    "auto_steps": ["maybe", "2"], "layout": ["gpu", "per-task"], "relay_fan_in": ["1", "many", "-2"],
    # the outputs' settings (exporters/: option rows of their own)
    "wandb_project": [" "], "mlflow_tracking_uri": [" "], "mlflow_experiment": [" "], "prometheus_dir": [" "],
}


def test_every_option_has_malformed_examples_and_each_is_named():
    assert set(MALFORMED_OPTION) == {o.key for o in OPTIONS}, "add malformed examples for new options"
    for opt in OPTIONS:
        for value in MALFORMED_OPTION[opt.key]:
            check({}, {opt.key: value}, opt.flag, value, must_fail=True)
            check({opt.env: value}, {}, opt.env, value, must_fail=True)


# ---- what the user sees: the real CLI, in a subprocess -----------------------------------------

CLI_CASES = [
    (STEP, {"SLURM_NNODES": "two"}, [], "SLURM_NNODES='two'"),
    (STEP, {"SLURM_STEP_NODELIST": "node[1-"}, [], "SLURM_STEP_NODELIST='node[1-'"),
    (STEP, {"SLURM_STEP_TASKS_PER_NODE": "1(x"}, [], "SLURM_STEP_TASKS_PER_NODE='1(x'"),
    (STEP, {"SLURM_JOB_ID": "job1"}, [], "SLURM_JOB_ID='job1'"),
    (STEP, {"SLURM_NODEID": "-1"}, [], "SLURM_NODEID='-1'"),
    (STEP, {"SLURM_GPUS_ON_NODE": "x"}, [], "SLURM_GPUS_ON_NODE='x'"),
    ({}, {"TRACEML_MASTER_PORT": "99999"}, [], "TRACEML_MASTER_PORT='99999'"),
    ({}, {"TRACEML_HANG_TIMEOUT": "never"}, [], "TRACEML_HANG_TIMEOUT='never'"),
    ({}, {}, ["--nproc-per-node=0"], "--nproc-per-node='0'"),
    ({}, {}, ["--aggregator-wait=soon"], "--aggregator-wait='soon'"),
]


@pytest.mark.parametrize("base,extra,flags,needle", CLI_CASES, ids=[c[3] for c in CLI_CASES])
def test_the_cli_prints_one_line_and_no_traceback(tmp_path, base, extra, flags, needle):
    env = base_env(tmp_path)
    env.update(base)
    env.update(extra)
    out = subprocess.run([PY, "-m", "traceml_core.cli", "run", *flags, "train.py"], env=env,
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 2, out
    assert out.stderr.startswith("traceml: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""
