"""`traceml slurm doctor` as a user runs it: exit codes, JSON only on stdout, ASCII when not a TTY,
no torch in the doctor's own process, a broken torch reported as a failed check."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_slurm.doctor.model import CheckResult, JobInfo, Outcome, Report, Status
from traceml_slurm.doctor.render import render_text

SRC = str(Path(__file__).resolve().parents[2] / "src")
VENV_BIN = str(Path(sys.executable).parent)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "TRACEML_", "NCCL_", "SBATCH_"))}
    env.pop("NO_COLOR", None)
    env["PYTHONPATH"] = SRC
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


#: for the tests that are not about the bound: the child's `import torch` (bounded by --timeout,
#: 15 s by default) can take longer on a loaded 2-core CI machine
LOADED = ("--timeout", "90")


def doctor(*args: str, env=None, timeout=150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "doctor", *args], capture_output=True,
                          text=True, env=env or clean_env(), timeout=timeout)


def test_local_json_is_only_json_with_the_schema_and_exit_1_outside_slurm():
    p = doctor("--local", "--json", *LOADED)
    data = json.loads(p.stdout)  # the whole of stdout parses: no banner, no progress
    assert p.returncode == 1
    assert data["schema_version"] == 1 and data["exit_code"] == 1 and data["job"]["tier"] == "local"
    assert set(data["summary"]) == {"passed", "failed", "warnings", "skipped", "ignored"}
    checks = {c["id"]: c for c in data["checks"]}
    ctx = checks["slurm.context"]
    assert ctx["status"] == "fail" and ctx["fix"] and "salloc" in ctx["fix"]
    host = next(iter(ctx["nodes"]))
    assert ctx["nodes"][host]["observed"].startswith("not inside a Slurm allocation")
    assert checks["sw.torch"]["status"] == "pass" and checks["sw.torch"]["nodes"][host]["data"]["version"]
    assert all({"id", "status", "nodes", "fix", "title", "duration_s"} <= set(c) for c in data["checks"])
    assert "cross.answers" not in checks  # --local runs no cross-node check


def test_broken_torch_is_a_failed_check_not_a_crash(tmp_path):
    broken = tmp_path / "torch"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise OSError('libcudart.so.12: cannot open shared object file')\n")
    p = doctor("--local", "--json", env=clean_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{SRC}"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    checks = {c["id"]: c for c in json.loads(p.stdout)["checks"]}
    torch = checks["sw.torch"]
    assert torch["status"] == "fail" and "libcudart.so.12" in json.dumps(torch["nodes"])
    assert "PYTHONPATH" in torch["fix"]
    assert checks["sw.nccl"]["status"] == "skip" and checks["sw.python"]["status"] == "pass"


def test_the_doctor_process_never_imports_torch():
    code = ("import sys, io, contextlib\nfrom traceml_slurm.doctor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--local', '--json'])\n"
            "print('torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert p.stdout.strip().splitlines()[-1] == "False"


def test_text_is_ascii_when_not_a_tty_and_ends_with_the_counts():
    p = doctor("--local", "--ignore", "slurm.context", *LOADED, env=clean_env(NCCL_IB_DISABLE="1"))
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0  # a warning alone does not fail
    assert re.fullmatch(r"\d+ passed, 0 failed, 1 warning, \d+ skipped, 1 ignored in [\d.]+ s", lines[-1])
    assert all(ord(c) < 128 for c in p.stdout) and "[!!] No risky NCCL/CUDA variables" in p.stdout
    assert "fix: Unset NCCL_IB_DISABLE" in p.stdout
    strict = doctor("--local", "--strict", "--ignore", "slurm.context,gpu,sw.torch,sw.nccl", env=clean_env(NCCL_IB_DISABLE="1"))
    assert strict.returncode == 1 and "(--strict: warnings fail)" in strict.stdout


@pytest.mark.parametrize("args,needle", [
    (["--ignore", "gpu.cnt"], "--ignore names unknown check(s): gpu.cnt"),
    (["--timeout", "0"], "--timeout=0 must be more than 0"),
    (["--timeout", "soon"], "not a number of seconds"),
    (["--local", "--full"], "use one of them"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_usage_exits_2(args, needle):
    p = doctor(*args)
    assert p.returncode == 2 and needle in p.stderr and p.stdout == ""


def test_every_node_of_a_multinode_step_running_its_own_doctor_is_refused():
    env = clean_env(SLURM_JOB_ID="9", SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="2", SLURM_NODEID="1",
                    SLURM_JOB_NODELIST="n[1-2]", SLURM_STEP_NODELIST="n[1-2]")
    p = doctor("--json", env=env)
    assert p.returncode == 2 and "from the batch script" in p.stderr and "--local" in p.stderr


def test_no_srun_means_the_doctor_cannot_run_exit_3(tmp_path):
    env = clean_env(SLURM_JOB_ID="9", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_NUM_NODES="2", SLURM_NNODES="2",
                    SLURM_NODEID="0", SLURMD_NODENAME="n1", PATH=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "traceml_core.cli", "slurm", "doctor", "--json"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 3 and "`srun` is not on PATH" in p.stderr
    assert json.loads(p.stdout)["error"].startswith("`srun` is not on PATH")


# -- rendering ----------------------------------------------------------------------------------------

class _Tty(io.StringIO):
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


def _report() -> Report:
    ok = CheckResult("sw.python", "Python", "node", {"n1": Outcome(Status.PASS, "3.11.7"), "n2": Outcome(Status.PASS, "3.11.7")})
    bad = CheckResult("cross.ports-reachable", "Node 0's ports reachable", "cross", {
        "n1": Outcome(Status.PASS, "aggregator ok"), "n2": Outcome(Status.FAIL, "aggregator timed out", "Open the port."),
        "n3": Outcome(Status.PASS, "aggregator ok")})
    return Report(JobInfo("7", "ddp", ["n1", "n2", "n3"], "batch shell", "n1", "default"), [bad, ok], 1.0)


def test_terminal_gets_symbols_and_colour_and_no_color_gets_ascii():
    tty = _Tty()
    render_text(_report(), tty)
    assert "✓" in tty.getvalue() and "✗" in tty.getvalue() and "\033[" in tty.getvalue()
    plain = _Tty()
    render_text(_report(), plain, no_color=True)
    text = plain.getvalue()
    assert "✓" not in text and "\033[" not in text and "[XX] Node 0's ports reachable" in text


def test_grouped_and_problem_nodes_listed_with_the_fix():
    out = io.StringIO()
    render_text(_report(), out)
    text = out.getvalue()
    assert text.index("Software") < text.index("Across nodes")  # groups in order, whatever the result order
    assert "[ok] Python: 3.11.7 (n[1-2])" in text
    assert "      n2: [XX] aggregator timed out" in text and "      n[1,3]: [ok] ok" in text
    assert "      fix: Open the port." in text
    assert text.strip().splitlines()[-1].startswith("1 passed, 1 failed, 0 warnings, 0 skipped")
