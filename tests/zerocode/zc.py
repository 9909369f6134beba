"""Running an unmodified script under `traceml run` and reading what the user gets back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
TRACEML = str(Path(sys.executable).parent / "traceml")
PHASES = ("input", "forward", "backward", "optimizer")
_port = [31200]


def traceml_run(tmp_path: Path, script: str, *, nproc: int = 2, env: Optional[dict[str, str]] = None,
                flags: tuple[str, ...] = (), run_name: str = "r", timeout: float = 300) -> dict[str, Any]:
    """Run ``tests/zerocode/scripts/<script>`` with ``nproc`` ranks; returns exit code, output and
    the summary (json and text)."""
    _port[0] += 4
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    e.update({"OMP_NUM_THREADS": "1", "ZC_OUT": str(tmp_path / "out"), "PYTHONWARNINGS": "ignore"})
    e.update(env or {})
    cmd = [TRACEML, "run", f"--nproc-per-node={nproc}", f"--logs-dir={tmp_path}", f"--run-name={run_name}",
           f"--master-port={_port[0]}", f"--aggregator-port={_port[0] + 1}", *flags, str(SCRIPTS / script)]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    run_dir = tmp_path / run_name
    data = json.loads((run_dir / "final_summary.json").read_text()) if (run_dir / "final_summary.json").exists() else None
    text = (run_dir / "final_summary.txt").read_text() if (run_dir / "final_summary.txt").exists() else ""
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr, "summary": data, "text": text}


def optimizer_steps(out: str, framework: str) -> int:
    """What the script itself printed: `<framework>: optimizer steps N`."""
    for line in out.splitlines():
        if line.startswith(f"{framework}: optimizer steps "):
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"the script did not report its optimizer steps:\n{out[-2000:]}")


def assert_real_steps(res: dict[str, Any], *, steps: int, source: str, world: int = 2) -> dict[str, Any]:
    """Every rank recorded exactly ``steps`` steps found by ``source``, each rank's phases add up
    to at most its step, and the run has a real verdict."""
    assert res["code"] == 0, res["err"][-3000:]
    data = res["summary"]
    assert data is not None, res["err"][-3000:]
    assert data["steps"]["source"] == source, data["steps"]
    assert [r["steps"] for r in data["ranks"]] == [steps] * world, [r["steps"] for r in data["ranks"]]
    for r in data["ranks"]:
        step = r["phases"]["step"]["mean_ms"]
        parts = {p: r["phases"][p]["mean_ms"] for p in PHASES if r["phases"][p]}
        assert sum(parts.values()) <= step * 1.001 + 0.001, (r["rank"], step, parts)
        for p in ("backward", "optimizer"):
            # the median, not just the mean: a phase zeroed in most steps (a wait charged to it
            # that happened elsewhere) would still have a mean above 0 from a few steps
            assert parts.get(p, 0) > 0 and r["phases"][p]["p50_ms"] > 0, (r["rank"], p, r["phases"][p])
    assert data["verdict"]["kind"] not in ("no_steps",), data["verdict"]
    assert data["verdict"]["why"], data["verdict"]
    assert "never joined" not in res["text"]
    return data
