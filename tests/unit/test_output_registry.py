"""An output is one module and one entry point: a third party's, installed beside traceml, is found
through the ``traceml.outputs`` group and is then everywhere the built-in ones are (issue 35).

The third party here is a real distribution on ``sys.path``: a ``*.dist-info`` directory with its
``entry_points.txt`` and a module, as pip would install it. Its output goes out live; its setting
is an option row. Checked as a user meets it: ``--export mydest`` accepted, ``--mydest-dir`` in
``traceml run --help``, ``TRACEML_MYDEST_DIR`` in ``--print-config`` with its source, its row in
docs' tables, and a real run whose batches and final batch reach it through the same hub as W&B's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MODULE = '''
"""A third-party output: every batch's points as JSON lines in --mydest-dir."""
import json, os
from traceml_core.optionrow import Option, path

DIRECTORY = Option("mydest_dir", path, None, "--export mydest: where mydest writes.", "DIR")


class MydestOutput:
    kind = "mydest"
    live = True
    where = "points.jsonl in --mydest-dir"
    extra = ""
    leaves = ()
    options = (DIRECTORY,)

    def start(self, settings):
        return Exporter(settings[DIRECTORY.key])

    def write(self, summary, run_dir, settings):
        raise NotImplementedError


class Exporter:
    def __init__(self, directory):
        self.directory, self.target = directory, directory

    def open(self, run):
        os.makedirs(self.directory, exist_ok=True)
        self._f = open(os.path.join(self.directory, "points.jsonl"), "a")
        self._f.write(json.dumps({"open": run.run_name}) + "\\n")

    def write(self, batch):
        for p in batch.points:
            self._f.write(json.dumps({"series": p.series, "x": p.x}) + "\\n")
        self._f.flush()

    def close(self, final):
        self.write(final)
        self._f.write(json.dumps({"closed": final.status}) + "\\n")
        self._f.close()


OUTPUT = MydestOutput()
'''

TRAIN = '''
import time, torch
import traceml_core as traceml
traceml.init()
model = torch.nn.Linear(4, 1)
for _ in range(40):
    with traceml.trace_step(model):
        model(torch.randn(2, 4)).sum().backward()
        time.sleep(0.02)
'''


@pytest.fixture(scope="module")
def third_party(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    (site / "mydest_out.py").write_text(MODULE)
    info = site / "mydest-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mydest\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[traceml.outputs]\nmydest = mydest_out:OUTPUT\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(site)])
    return env


def _traceml(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_core.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_its_kind_flag_variable_and_docs_row_come_from_its_entry_point(third_party, tmp_path):
    helped = _traceml(third_party, "run", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--mydest-dir" in helped.stdout, helped.stderr
    env = dict(third_party, TRACEML_MYDEST_DIR=str(tmp_path / "out"))
    cfg = _traceml(env, "run", "--print-config", "--json", "--export", "wandb,mydest", "x.py", cwd=tmp_path)
    assert cfg.returncode == 0, cfg.stderr
    config = json.loads(cfg.stdout)["config"]
    assert config["export"]["value"] == "wandb,mydest"
    assert config["mydest_dir"] == {"value": str(tmp_path / "out"), "source": "env:TRACEML_MYDEST_DIR"}
    table = subprocess.run([sys.executable, "-c", "from traceml_core.exporters.output import docs_table; print(docs_table())"],
                           env=third_party, capture_output=True, text=True, timeout=60)
    assert "| `mydest` | during the run | points.jsonl in --mydest-dir | `--mydest-dir` | none |" in table.stdout
    # without it, the kind is refused with the list of those installed
    bad = _traceml({k: v for k, v in third_party.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(REPO / "src")},
                   "run", "--print-config", "--export", "mydest", "x.py", cwd=tmp_path)
    assert bad.returncode == 2 and "--export='mydest'" in bad.stderr and "wandb, mlflow" in bad.stderr, bad.stderr


def test_a_run_sends_its_batches_to_it_through_the_hub(third_party, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    out = tmp_path / "out"
    p = _traceml(third_party, "run", "--nproc-per-node=1", f"--logs-dir={tmp_path / 'logs'}", "--run-name=third",
                 "--export=mydest", f"--mydest-dir={out}", "--export-interval=1", "train.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(ln) for ln in (out / "points.jsonl").read_text().splitlines()]
    assert lines[0] == {"open": "third"} and lines[-1] == {"closed": "completed"}, lines[-3:]
    xs = [ln["x"] for ln in lines if ln.get("series") == "rank_0000"]
    assert xs and xs == sorted(xs), xs
    (stats,) = json.loads((tmp_path / "logs" / "third" / "exports.json").read_text())["exports"]
    assert stats["kind"] == "mydest" and stats["finished"] and stats["error"] is None, stats
    assert f"export mydest: {stats['points_written']:,} points written to {out}" in p.stderr
