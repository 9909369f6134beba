"""Golden files for `traceml slurm template`: presets and option combinations.

Each case writes its files into a fresh directory (holding the training script, so no "missing
script" note depends on where the test runs) and compares them, the `--print` output and the
`--json` description with tests/golden/template/<case>/. Every generated file must pass `bash -n`.
Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/unit/test_template_golden.py`
and review the diff.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from traceml_slurm.cli import main as slurm_main

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "template"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

CASES = {
    "minimal": ["train.py"],
    "two-node-gres": ["--nodes", "2", "--gpus-per-node", "4", "--time", "2:00:00", "train.py", "--epochs", "3"],
    "all-resources": [
        "--nodes", "4", "--gpus-per-node", "8", "--gpu-type", "h100", "--gpu-request", "gpus-per-node",
        "--cpus-per-task", "32", "--mem", "0", "--partition", "gpu", "--account", "proj1", "--qos", "high",
        "--constraint", "ib&h100", "--exclusive", "--output-pattern", "logs/%x-%j.out", "--time", "1-00:00:00",
        "--requeue", "--signal-margin", "300", "--logs-dir", "/scratch/me/traceml", "--job-name", "big-run",
        "train.py", "--config", "configs/a b.yaml", "--nodes", "9"],
    "wrapper-node-setup": [
        "--nodes", "2", "--gpus-per-node", "2", "--setup", "source ~/venv/bin/activate",
        "--node-setup", "module load cuda/12.4", "-o", "jobs", "train.py"],
    "cpu-workers": [
        "--nodes", "2", "--workers-per-node", "2", "--nccl-ifname", "^docker0,lo", "--env", "MSG=it's here",
        "--env", "NCCL_DEBUG=INFO", "--no-requeue", "--signal-margin", "0", "--time", "45", "train.py"],
    "preset-generic": ["--preset", "generic", "--nodes", "2", "train.py"],
    "task-layout": ["--layout", "task", "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "8",
                    "--time", "1:00:00", "--wrapper", "train.py"],
    "preset-pyxis": ["--preset", "pyxis", "--container-image", "nvcr.io#me/train:1", "--container-mount",
                     "/scratch:/scratch", "--nodes", "2", "--time", "4:00:00", "train.py"],
    "preset-apptainer-wrapper": ["--preset", "apptainer", "--apptainer-image", "/images/train.sif", "--wrapper",
                                 "--container-mount", "/data", "--nodes", "2", "--gpu-type", "a100", "train.py"],
}


def _run(args, cwd: Path, capsys) -> tuple[int, str, str]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        code = slurm_main(["template", *args])
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return code, out, err


def _compare(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing; run with UPDATE_GOLDEN=1 to create it"
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{path.name} differs from the golden file {path}; if intended, UPDATE_GOLDEN=1"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case, tmp_path, capsys):
    args = CASES[case]
    (tmp_path / "train.py").write_text("print('train')\n")
    code, out, err = _run(["--no-check", *args], tmp_path, capsys)
    assert code == 0, err
    written = [line for line in out.splitlines() if line.startswith("wrote ")]
    assert written, out
    paths = [tmp_path / p for p in written[0][len("wrote "):].split(", ")]
    golden_dir = GOLDEN / case
    for path in paths:
        content = path.read_text()
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name} fails bash -n: {proc.stderr}"
        _compare(golden_dir / path.name, content)
        if path.name == "launch.sh":
            assert os.access(path, os.X_OK)

    code, shown, _ = _run(["--no-check", "--force", "--print", *args], tmp_path, capsys)
    assert code == 0
    _compare(golden_dir / "print.txt", shown)
    code, described, _ = _run(["--no-check", "--force", "--json", *args], tmp_path, capsys)
    assert code == 0
    data = json.loads(described)  # stdout is exactly one JSON document
    _compare(golden_dir / "describe.json", described)
    assert [f["name"] for f in data["files"]] == [p.name for p in paths]
    if not UPDATE:
        assert sorted(p.name for p in golden_dir.iterdir()) == sorted([p.name for p in paths] + ["print.txt",
                                                                                              "describe.json"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_header_regenerates_the_same_job(case, tmp_path, capsys):
    """The command in the header, run again elsewhere, writes byte-identical files."""
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        (d / "train.py").write_text("")
    code, out, err = _run(["--no-check", *CASES[case]], first, capsys)
    assert code == 0, err
    sbatch = next(p for p in first.rglob("*.sbatch"))
    header = [line for line in sbatch.read_text().splitlines() if line.startswith("#   traceml slurm template")]
    assert len(header) == 1
    argv = shlex.split(header[0][len("#   "):])
    assert argv[:3] == ["traceml", "slurm", "template"]
    code, _, err = _run(["--no-check", *argv[3:]], second, capsys)
    assert code == 0, err
    for path in first.rglob("*"):
        if path.is_file() and path.name != "train.py":
            assert (second / path.relative_to(first)).read_text() == path.read_text()


def test_golden_dirs_match_cases():
    """No stale golden directory survives a renamed or removed case."""
    if GOLDEN.exists():
        assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == sorted(CASES)
