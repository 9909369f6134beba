"""Issue 34, finding 6: checkpoint saves a rank reports count in the goodput ledger only where its
own step records confirm them (report/goodput/spans.py). A real ``traceml run`` of
tests/faults/checkpoint_spans.py: a rank that reports six 2-second saves it never made, between
steps that follow each other without a gap (before the fix: "6 checkpoint(s) seen" and 12 s of
checkpoint time), and the control, a rank that really saves six times for about 300 ms each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinyrun import REPO, env_for, traceml_cmd

SCRIPT = Path(__file__).with_name("checkpoint_spans.py")


def ledger_of(tmp_path: Path, mode: str) -> dict:
    import subprocess

    out = subprocess.run(traceml_cmd(tmp_path / "logs", mode, nproc=1, script=SCRIPT), env=env_for(SPAN_MODE=mode),
                         capture_output=True, text=True, timeout=180, cwd=str(REPO))
    assert out.returncode == 0 and "checkpoint_spans: done" in out.stdout, out.stderr[-3000:]
    summary = json.loads((tmp_path / "logs" / mode / "final_summary.json").read_text())
    return summary["goodput"]["attempts"][-1], summary


@pytest.mark.parametrize("mode", ["forged", "real"])
def test_checkpoint_saves_count_only_where_the_ranks_timing_confirms_them(tmp_path, mode):
    a, summary = ledger_of(tmp_path, mode)
    ck_s = a["buckets"]["checkpoint"]
    if mode == "forged":
        assert a["progress"]["checkpoints"] == 0, a["progress"]
        assert ck_s < 0.1, a
        assert "6 checkpoint save(s) rank 0 reported" in a["notes"]["checkpoint"], a["notes"]
    else:
        assert a["progress"]["checkpoints"] == 6, a["progress"]
        assert 6 * 0.25 <= ck_s <= 6 * 0.6, a
        assert "checkpoint" not in a["notes"], a["notes"]
