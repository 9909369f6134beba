"""One set of Slurm facts (traceml_slurm/facts.py): the resolver and the doctor decide from the same
reading of the environment, the doctor shows the resolver's own refusals, and nothing else in the
plugin reads the environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doctor_env import batch, gpus, make, step

from traceml_core.config import resolve
from traceml_core.errors import ConfigError
from traceml_slurm.context import Context
from traceml_slurm.doctor import context as C
from traceml_slurm.doctor import gpu as G
from traceml_slurm.doctor.model import Status
from traceml_slurm.facts import Facts

SRC = Path(__file__).resolve().parents[2] / "src" / "traceml_slurm"


def test_the_layout_check_shows_the_resolvers_own_refusal():
    env = step(SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_STEP_NUM_TASKS="3")
    with pytest.raises(ConfigError) as refused:
        resolve({}, env)
    o = C.check_tasks_per_node(make(env))
    assert o.status is Status.FAIL
    assert f"{o.observed}. {o.fix}" in str(refused.value)  # the very words `traceml run` gives


def test_the_jobs_layout_from_its_batch_shell_is_the_same_rule():
    o = C.check_tasks_per_node(make(batch(SLURM_TASKS_PER_NODE="2(x2),1")))
    assert o.status is Status.FAIL and "the job runs a different number of tasks on different nodes" in o.observed
    assert "srun --nodes=2 --ntasks-per-node=1 traceml run train.py" in o.fix


def test_gpus_on_the_node_are_one_rule_for_the_resolver_and_the_doctor():
    """Slurm < 21.08 has no SLURM_GPUS_ON_NODE: both count SLURM_STEP_GPUS (the doctor used to see 0)."""
    env = gpus(2, SLURM_GPUS_ON_NODE=None)
    cfg = resolve({}, env)
    assert (cfg.nproc_per_node, cfg.source("nproc_per_node")) == (2, "slurm:SLURM_STEP_GPUS(count)")
    ctx = make(env)
    assert ctx.gpus_on_node() == 2
    o = G.check_count(ctx)  # no NVML here: Slurm's 2 GPUs on a node without any
    assert o.status is Status.FAIL and "SLURM_STEP_GPUS(count)=2" in o.observed


def test_the_facts_are_read_once_from_the_mapping_only(monkeypatch):
    env = step()
    facts = Facts.of(env)
    assert Facts.of(dict(env)) is facts  # the resolver's contribute and validate, and the doctor, share it
    assert Facts.of({**env, "SLURM_NODEID": "1"}) is not facts
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert not Facts.of({"PATH": "/bin"}).in_job  # never os.environ
    assert facts.context is Context.STEP and facts.step_hosts == ("gpu07", "gpu08")


def test_the_emulated_step_of_node0_is_what_srun_gives_its_first_task():
    node0 = Facts.of(batch()).node0_step()
    assert node0.context is Context.STEP and node0.vars.nodeid == 0 and node0.node_name == "gpu07"
    assert node0.step_hosts == ("gpu07", "gpu08") and node0.layout.kind == "node"
    assert resolve({}, node0.environ).node_rank == 0
    assert Facts.of({"SLURM_JOB_ID": "5", "PATH": "/bin"}).node0_step() is None  # no node list: none


def test_the_process_environment_besides_slurm():
    env = step(MASTER_ADDR="127.0.0.1", NCCL_IB_DISABLE="1", CUDA_VISIBLE_DEVICES="NoDevFiles",
               TRACEML_LOGS_DIR="/x", TRACEML_TOKEN="secret-secret-secret", SBATCH_SIGNAL="TERM@60")
    e = Facts.of(env).env
    assert e.launcher_vars == {"MASTER_ADDR": "127.0.0.1"} and e.comm_vars["NCCL_IB_DISABLE"] == "1"
    assert e.cuda_visible_devices == () and e.sbatch_signal == "TERM@60"
    assert e.traceml_vars == {"TRACEML_LOGS_DIR": "/x"}  # never the token


#: the only places that may read the process environment: the facts, and the two entry points that
#: hand it over whole (the doctor's command line and its agent, `nodes` and the template's
#: --exclude-bad), and the torch child's environment
ALLOWED = {
    ("doctor/cli.py", "environ = dict(os.environ)"),
    ("doctor/agent.py", "env = dict(os.environ)"),
    ("doctor/torchprobe.py", "env=_child_env(os.environ if environ is None else environ),"),
    ("nodes/cli.py", "facts = Facts.of(os.environ)"),
    ("template/cli.py", "facts = Facts.of(os.environ)"),
}
RAW_READ = re.compile(r"os\.environ|os\.getenv|environ\.get\(|environ\[|\.environ\.")


def test_only_the_facts_read_the_environment():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel == "facts.py":
            continue
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            if RAW_READ.search(code) and not any(rel == f and snippet in code for f, snippet in ALLOWED):
                found.append(f"{rel}: {line.strip()}")
    assert not found, "read the environment through traceml_slurm.facts.Facts:\n" + "\n".join(found)


#: what the plugin may use of core: the launch config, the plugin interface, the self-test entry
#: point, the transport, and the shared basics (errors, limits, settings, the option table, the CLI,
#: safe reads of files others can write: safeio)
CORE_ALLOWED = {"traceml_core", "traceml_core.config", "traceml_core.plugins", "traceml_core.selftest",
                "traceml_core.errors", "traceml_core.limits", "traceml_core.settings", "traceml_core.options",
                "traceml_core.cli", "traceml_core.helpformat", "traceml_core.wire.auth", "traceml_core.wire.client",
                "traceml_core.wire.server", "traceml_core.safeio"}


def test_the_plugin_uses_only_cores_interfaces():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for m in re.finditer(r"^\s*(?:from|import) (traceml_core[\w.]*)", path.read_text(), re.M):
            if m.group(1) not in CORE_ALLOWED:
                found.append(f"{path.relative_to(SRC)}: {m.group(1)}")
    assert not found, "\n".join(found)
