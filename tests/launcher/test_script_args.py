"""Arguments after SCRIPT, as a user meets them: the real CLI in a subprocess, and a real run whose
script records the ``sys.argv`` it was given.

torchrun users expect everything after the script to reach the script; the seed guide's
``launch.sh`` writes TraceML's flags after it. Both readings exist, so the choice is never silent:
a TraceML flag read after the script is announced once on stderr, a refused value read there says
so and how to pass it on, and ``--`` hands everything after it to the script unread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: records what the script was given; no torch, no traceml calls (the bootstrap still runs it as rank 0)
ARGV_SCRIPT = "import json, os, sys\nopen(os.environ['ARGV_OUT'], 'w').write(json.dumps(sys.argv[1:]))\n"
ANNOUNCED = "after train.py was read as TraceML's"


def traceml(tmp: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", ARGV_OUT=str(tmp / "argv.json"))
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", "run", *args], cwd=tmp, text=True,
                          capture_output=True, env=env, timeout=timeout)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(ARGV_SCRIPT)
    return path


def announcements(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ANNOUNCED in line]


def test_flags_after_the_script_are_announced_and_dash_dash_passes_the_rest_on(tmp_path, script):
    """The issue's case: `train.py --run-name myexp --epochs 3`. The run is named myexp and says
    so once; after `--` the same flag reaches the script unread."""
    p = traceml(tmp_path, "--nproc-per-node=1", f"--logs-dir={tmp_path / 'logs'}", "train.py",
                "--run-name", "myexp", "--epochs", "3", "--", "--mode", "x", "--run-name", "theirs")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--epochs", "3", "--mode", "x",
                                                                "--run-name", "theirs"]
    assert (tmp_path / "logs" / "myexp" / "final_summary.json").exists()
    said = announcements(p.stderr)
    assert len(said) == 1, p.stderr[-3000:]
    assert "--run-name myexp after train.py was read as TraceML's" in said[0]
    assert "put `--` before the script's arguments" in said[0]


def test_dash_dash_alone_announces_nothing(tmp_path, script):
    p = traceml(tmp_path, "--print-config", "--json", "train.py", "--", "--run-name", "theirs", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["command"][-3:] == ["--run-name", "theirs", "--json"]
    assert data["config"]["run_name"]["value"] != "theirs"
    assert announcements(p.stderr) == []


def test_print_config_announces_each_flag_once(tmp_path, script):
    p = traceml(tmp_path, "--print-config", "--json", "train.py", "--run-name=a", "--epochs", "3",
                "--run-name", "b", "--logs-dir", "/tmp/x y")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["config"]["run_name"] == {"value": "b", "source": "cli"}
    assert data["command"][-3:] == ["train.py", "--epochs", "3"]
    said = announcements(p.stderr)
    assert len(said) == 2, p.stderr
    assert said[0].startswith("[traceml] --run-name b after") and "'/tmp/x y'" in said[1], said


@pytest.mark.parametrize("argv,needles", [
    (["train.py", "--mode", "train"], ["--mode='train' must be one of summary, cli, dashboard",
                                       "--mode train came after train.py and was read as TraceML's",
                                       "traceml run [flags] train.py -- --mode train"]),
    (["train.py", "--nnodes=1:4"], ["elastic node range", "--nnodes=1:4 came after train.py"]),
    (["train.py", "--epochs", "3", "--run-name"], ["--run-name needs a value",
                                                   "came after the script train.py", "`--`"]),
    (["train.py", "--aggregator-port", "80x"], ["--aggregator-port='80x' is not a whole number",
                                                "--aggregator-port 80x came after train.py"]),
])
def test_a_refused_value_after_the_script_says_it_was_read_as_traceml_s(tmp_path, script, argv, needles):
    p = traceml(tmp_path, f"--logs-dir={tmp_path / 'logs'}", *argv, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("traceml: error: ") and "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle in p.stderr, (needle, p.stderr)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "argv.json").exists()


def test_a_refused_value_before_the_script_gets_no_such_hint(tmp_path, script):
    p = traceml(tmp_path, "--mode", "train", "train.py", timeout=60)
    assert p.returncode == 2 and "--mode='train' must be one of" in p.stderr
    assert "read as TraceML's" not in p.stderr
