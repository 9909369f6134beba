"""The logs-dir fallback in a shared temporary directory, attacked by another user: two real uids.

The victim's logs dir is not writable, so its aggregator falls back to ``$TMPDIR/traceml-<uid>/<run>``.
Another user (the attacker) has planted that directory first: with symlinks to the victim's own
files, or with a forged checkpoint. Real processes under two uids (``setpriv``), a real
``traceml run`` and ``traceml summarize``; root only (the test switches uids).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import REPO, SCRIPT, free_ports

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="switching between two uids needs root and setpriv")

VICTIM, ATTACKER = 41001, 41002
PLANT = r"""
import os, sys
root, run, target, kind = sys.argv[1:5]
os.umask(0)
os.makedirs(root, 0o777, exist_ok=True)
os.chmod(root, 0o777)
d = os.path.join(root, run)
if kind == "dirlink":          # the run directory itself points into the victim's files
    os.symlink(target, d)
    sys.exit(0)
os.makedirs(d, 0o777, exist_ok=True)
if kind == "symlinks":
    for name in ("final_summary.json", "final_summary.txt", "final_summary.html", "aggregate.state"):
        os.symlink(target, os.path.join(d, name))
else:
    with open(os.path.join(d, "aggregate.state"), "wb") as f:
        f.write(open(target, "rb").read())
"""


def as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def _site_packages() -> str:
    import site

    return os.pathsep.join(site.getsitepackages())


@pytest.fixture(scope="module")
def python() -> str:
    """An interpreter the other uids may run, with this environment's packages (a venv made from
    a Python under /root is not reachable for them)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        # the launcher starts sys.executable again: check that nested start, not only the first
        probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import torch, traceml_core'], check=True)"
        ok = subprocess.run([*as_user(VICTIM), cand, "-c", probe], capture_output=True,
                            env={"PYTHONPATH": os.pathsep.join([str(REPO / "src"), _site_packages()]),
                                 "PATH": "/usr/bin:/bin"}, cwd="/", timeout=120)
        if ok.returncode == 0:
            return cand
    pytest.skip("no Python that another uid can run with this environment's packages")


@pytest.fixture
def shared():
    """A world-writable sticky directory like /tmp, with a private home for the victim."""
    d = Path(tempfile.mkdtemp(prefix="traceml-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    home = d / "home"
    home.mkdir(mode=0o700)
    os.chown(home, VICTIM, VICTIM)
    readonly = d / "ro"
    readonly.mkdir(mode=0o755)  # root's: the victim cannot write its logs there
    yield d
    shutil.rmtree(d, ignore_errors=True)


def victim_env(shared: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "SLURM_"))}
    env.update(TMPDIR=str(shared), HOME=str(shared / "home"), OMP_NUM_THREADS="1",
               FAULT_PROGRESS_DIR=str(shared / "home"),
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), _site_packages()]))
    return env


def victim_run(python: str, shared: Path, logs: Path, run: str = "r1") -> subprocess.CompletedProcess:
    master, agg = free_ports(2)
    cmd = [*as_user(VICTIM), python, "-m", "traceml_core.cli", "run", "--nproc-per-node=1",
           f"--logs-dir={logs}", f"--run-name={run}", f"--master-port={master}", f"--aggregator-port={agg}",
           SCRIPT, "--steps", "5"]
    return subprocess.run(cmd, env=victim_env(shared), cwd=shared / "home", capture_output=True, text=True,
                          timeout=180)


def plant(python: str, shared: Path, kind: str, target: Path, run: str = "r1") -> Path:
    root = shared / f"traceml-{VICTIM}"
    subprocess.run([*as_user(ATTACKER), python, "-c", PLANT, str(root), run, str(target), kind],
                   check=True, timeout=30)
    assert os.lstat(root).st_uid == ATTACKER
    return root / run


@pytest.mark.parametrize("kind", ["symlinks", "dirlink"])
def test_a_planted_fallback_with_symlinks_is_refused_and_the_victims_file_is_untouched(shared, python, kind):
    if kind == "symlinks":   # the summary's file names point at one of the victim's files
        precious = shared / "home" / "precious.txt"
    else:                    # the run directory points at a victim's directory with a summary in it
        (shared / "home" / "old").mkdir()
        os.chown(shared / "home" / "old", VICTIM, VICTIM)
        precious = shared / "home" / "old" / "final_summary.json"
    precious.write_text("the victim's work\n")
    os.chown(precious, VICTIM, VICTIM)
    plant(python, shared, kind, precious if kind == "symlinks" else precious.parent)

    out = victim_run(python, shared, shared / "ro" / "logs")
    assert out.returncode == 0, out.stderr[-3000:]
    assert precious.read_text() == "the victim's work\n"           # nothing written through a link
    assert f"owned by uid {ATTACKER}" in out.stderr and "fresh private directory" in out.stderr
    fresh = [p for p in shared.glob(f"traceml-{VICTIM}-r1-*") if (p / "final_summary.json").is_file()]
    assert len(fresh) == 1, list(shared.iterdir())
    st = os.lstat(fresh[0])
    assert st.st_uid == VICTIM and (st.st_mode & 0o777) == 0o700
    assert "TraceML summary: run r1" in out.stdout


def test_a_checkpoint_planted_by_another_user_cannot_forge_a_summary(shared, python):
    logs = shared / "home" / "logs"
    out = victim_run(python, shared, logs)
    assert out.returncode == 0, out.stderr[-3000:]
    own = logs / "r1" / "aggregate.state"
    # the attacker's copy of a real checkpoint, with a forged reason, newer than the victim's
    sys.path.insert(0, str(REPO / "src"))
    from traceml_core.rundir import load_checkpoint, pack_checkpoint

    doc = load_checkpoint(own, owned=False)   # the victim's: root reads it to forge one
    state = doc["state"]
    state["finish"] = dict(state.get("finish") or {}, reason="FORGED: rank 0 mined bitcoin", exit_code=1)
    forged = shared / "forged.state"
    forged.write_bytes(pack_checkpoint(state, final=True))
    os.chmod(forged, 0o644)
    plant(python, shared, "checkpoint", forged)

    summarize = [*as_user(VICTIM), python, "-m", "traceml_core.cli", "summarize", str(logs / "r1")]
    out = subprocess.run(summarize, env=victim_env(shared), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "FORGED" not in out.stdout + out.stderr and str(own) in out.stderr

    own.unlink()  # only the planted one is left: refused, naming why
    out = subprocess.run(summarize, env=victim_env(shared), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "FORGED" not in out.stdout + out.stderr
    assert f"owned by uid {ATTACKER}" in out.stderr and "Traceback" not in out.stderr
