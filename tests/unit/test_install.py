"""The install the docs give works: a wheel built from the checkout (`pip wheel --no-deps -w dist .`)
holds every module and data file the commands need, and installed on its own it runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-build-isolation: the setuptools of this environment (no index needed in the test)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (whl,) = out.glob("traceml_slurm-*.whl")
    return whl


def test_the_wheel_holds_the_data_files_and_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("traceml_slurm/template/presets/generic.toml", "traceml_core/views/static/dashboard.html",
                   "traceml_core/limits.py", "traceml_core/sdk/samplers/nvml.py"):
        assert needed in names, needed
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "traceml = traceml_core.cli:main" in text and "slurm = traceml_slurm.environment:SlurmEnvironment" in text


def test_the_installed_wheel_runs_its_commands(wheel, tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # the wheel's code first, the dependencies from this environment (never the checkout's src/)
    deps = [d for d in sys.path if d.endswith("site-packages")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(target)] + deps)
    run = lambda *a: subprocess.run([sys.executable, "-s", "-m", "traceml_core.cli", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    where = subprocess.run([sys.executable, "-s", "-c", "import traceml_core; print(traceml_core.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.stdout.startswith(str(target)), where
    assert run("--version").returncode == 0
    out = run("slurm", "template", "--preset", "generic", "--no-check", "--print", "train.py")
    assert out.returncode == 0 and "traceml-train" in out.stdout, out.stderr
    cfg = run("run", "--print-config", "--json", "train.py")
    assert cfg.returncode == 0 and '"nnodes"' in cfg.stdout, cfg.stderr
