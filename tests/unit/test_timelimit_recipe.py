"""One time-limit recipe (issue 26): the template writes it, the doctor advises it, and the README,
the docs and the example batch scripts show the same line. Whether it works is tested on a real
Slurm job with a one-minute limit (tests/slurm/test_template_job.py)."""

from __future__ import annotations

import re
from pathlib import Path

from traceml_slurm.timelimit import MARGIN_S, SBATCH_LINE, directive

ROOT = Path(__file__).resolve().parents[2]
#: every `#SBATCH --signal=...` line a user may copy
SBATCH_SIGNAL = re.compile(r"^#SBATCH\s+--signal[= ](\S+)", re.MULTILINE)


def test_the_recipe_is_term_to_the_steps_120_s_before_the_limit():
    assert SBATCH_LINE == "#SBATCH --signal=TERM@120" and directive(MARGIN_S) == "--signal=TERM@120"


def test_every_batch_script_line_users_copy_is_the_recipe():
    places = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples" / "slurm").glob("*"))]
    seen = {}
    for path in places:
        for spec in SBATCH_SIGNAL.findall(path.read_text()):
            seen.setdefault(spec, []).append(path.relative_to(ROOT).as_posix())
    assert set(seen) == {"TERM@120"}, seen
    for must in ("README.md", "docs/slurm.md", "examples/slurm/traceml_ddp.sbatch",
                 "examples/slurm/traceml_per_gpu.sbatch"):
        assert must in seen["TERM@120"], (must, seen)


def test_the_template_writes_it():
    """(The doctor's advice: tests/unit/test_doctor_controller.py, the short-KillWait check.)"""
    from traceml_slurm.template.options import TEMPLATE_OPTIONS

    margin = next(o for o in TEMPLATE_OPTIONS if o.key == "signal_margin")
    assert margin.default == MARGIN_S
    golden = (ROOT / "tests" / "golden" / "template" / "minimal" / "traceml-train.sbatch").read_text()
    assert SBATCH_SIGNAL.findall(golden) == ["TERM@120"] and "trap" not in golden
