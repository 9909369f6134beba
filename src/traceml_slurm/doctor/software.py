"""Software checks: Python, torch (and its CUDA build), NCCL, traceml, the training script.

torch is only ever imported in a child process (:mod:`.torchprobe`): a broken torch is a failed
check with its error, never a crash of the doctor.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext
from .thresholds import IMPORT_RETRY_TIMEOUT_S, IMPORT_SLOW_S
from .torchprobe import IMPORT


def check_python(ctx: NodeContext) -> Outcome:
    return passed(f"{ctx.python_version} ({ctx.python})", version=ctx.python_version, executable=ctx.python)


def check_torch(ctx: NodeContext) -> Outcome:
    t = ctx.torch()
    if t.stalled == IMPORT:
        # slow is not broken: a first import from a cold shared filesystem can take a minute
        return warned(f"not measured: {t.stall_words} on {ctx.hostname}",
                      f"A first import from a cold or slow shared filesystem can take a minute: rerun with "
                      f"`--timeout {IMPORT_RETRY_TIMEOUT_S:.0f}` to measure it. Every rank pays this import at each "
                      f"start. If it never finishes, `python -c 'import torch'` hangs on this node.",
                      error=t.error, timeout_s=t.timeout_s)
    if not t.ok:
        fix = ("Install torch in this environment (`pip install torch`, the CUDA build matching your driver), or "
               "activate the environment that has it in the sbatch script before srun.")
        if t.error and "No module named 'torch'" not in t.error:
            fix = ("This torch is broken (see the error): reinstall it, and check that PYTHONPATH or a module load does "
                   "not put another torch first.")
        return failed(f"torch is not usable: {t.error}", fix, error=t.error)
    build = f"CUDA {t.cuda_build}" if t.cuda_build else "CPU build"
    data = {"version": t.version, "cuda_build": t.cuda_build, "path": t.path, "gloo": t.gloo, "import_s": t.import_s}
    if t.gloo is False:
        return failed(f"torch {t.version} ({build}) has no gloo backend in torch.distributed",
                      "Install a standard torch wheel (torch.distributed with gloo).", **data)
    seen = f"{t.version} ({build}) from {t.path}; import {t.import_s or 0:.1f} s"
    if t.stalled:
        seen += f"; then {t.stall_words}"
    if t.import_s is not None and t.import_s >= IMPORT_SLOW_S:
        return warned(f"{seen}: every rank pays this import at each start of the job",
                      "Put the Python environment on node-local disk or in a container image (a shared filesystem "
                      "serves thousands of small files slowly), or warm it before the job.", **data)
    return passed(seen, **data)


def check_nccl(ctx: NodeContext) -> Outcome:
    t = ctx.torch()
    if not t.ok:
        return skipped(f"{'not measured' if t.stalled else 'torch is not usable'} (see sw.torch)")
    if not t.cuda_build:
        return skipped(f"torch {t.version} is a CPU build: no NCCL (gloo only)")
    if not t.nccl_version:
        if ctx.gpus_on_node() > 0:
            return failed(f"torch {t.version} (CUDA {t.cuda_build}) has no usable NCCL",
                          "Install a torch wheel built with NCCL (the standard CUDA wheels are).")
        return skipped(f"no NCCL in torch {t.version} and no GPU here")
    return passed(f"{t.nccl_version} (in torch {t.version})", version=t.nccl_version)


def _traceml_on_path(ctx: NodeContext) -> tuple[str | None, str | None]:
    found = shutil.which("traceml", path=ctx.facts.env.path)
    if not found:
        return None, None
    try:
        with open(found, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return found, None
    return found, first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() else None


def check_traceml(ctx: NodeContext) -> Outcome:
    import traceml_core

    version = getattr(traceml_core, "__version__", "?")
    where = str(Path(traceml_core.__file__).resolve().parent.parent)
    data = {"version": version, "path": where}
    found, interp = _traceml_on_path(ctx)
    data["command"] = found
    if not found:
        return warned(f"{version} ({where}), but no `traceml` command on PATH here",
                      "Activate the environment with TraceML in the sbatch script before srun (module load / "
                      "source venv/bin/activate), so `srun traceml run` finds it on every node.", **data)
    if interp and os.path.realpath(interp) != os.path.realpath(ctx.python) and os.path.basename(interp) != "env":
        return warned(f"{version}, but the `traceml` on PATH ({found}) runs {interp}, not this Python "
                      f"({ctx.python})",
                      "Two environments are mixed: activate one environment (with torch and TraceML) before srun.", **data)
    return passed(f"{version} ({where}); `traceml` on PATH: {found}", **data)


def check_script(ctx: NodeContext) -> Outcome:
    script = ctx.options.script
    if not script:
        return skipped("no script given (`traceml slurm doctor train.py` checks it)")
    path = Path(script) if os.path.isabs(script) else Path(ctx.cwd) / script
    if not path.exists():
        return failed(f"{script} does not exist on {ctx.hostname} (looked in {path.parent})",
                      "Put the script on storage every node sees, and run from the directory srun starts in "
                      "(`cd $SLURM_SUBMIT_DIR`), or pass its absolute path.", path=str(path))
    if not path.is_file() or not os.access(path, os.R_OK):
        return failed(f"{path} is not a readable file", "Check the path and its permissions.", path=str(path))
    if path.suffix == ".py":
        try:
            compile(path.read_bytes(), str(path), "exec")
        except SyntaxError as exc:
            return failed(f"{path} has a syntax error at line {exc.lineno}: {exc.msg}",
                          "Fix the syntax error before spending GPU hours.", path=str(path))
        except (OSError, ValueError) as exc:
            return failed(f"{path} cannot be read: {exc}", "Check the file.", path=str(path))
    return passed(f"{path} exists and compiles", path=str(path))


CHECKS = (
    CheckSpec("sw.python", "Python", check_python),
    CheckSpec("sw.torch", "torch", check_torch),
    CheckSpec("sw.nccl", "NCCL", check_nccl),
    CheckSpec("sw.traceml", "traceml", check_traceml),
    CheckSpec("sw.script", "Training script", check_script),
)
