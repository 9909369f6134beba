"""The scripts a new user runs first: ``--help`` answers and does nothing else, and ``scripts/setup``
never goes 10 s without a line.

Each script runs from a scratch copy of ``scripts/`` (it ``cd``s to the copy's root), with every
command that would install or start something (apt-get, dpkg, debootstrap, python3, pip, ip,
nsenter, unshare, the Slurm and munge daemons...) shadowed on ``PATH`` by a stand-in that records
its call: a help flag that reached any of them, or left a file behind, fails. As root (CI) this is
the case the first-hour report hit: ``scripts/test --help`` installed Debian packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what a script could use to change the machine; each is replaced by a recorder
SIDE_EFFECTS = ("apt-get", "apt", "dpkg", "debootstrap", "python3", "python", "pip", "ip", "nsenter", "unshare",
                "chroot", "mount", "munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun", "systemctl",
                "flock", "git")
SCRIPTS = sorted(p.name for p in (REPO / "scripts").iterdir() if p.is_file() and os.access(p, os.X_OK))


def _recorders(bin_dir: Path, log: Path) -> None:
    bin_dir.mkdir()
    for name in SIDE_EFFECTS:
        f = bin_dir / name
        f.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 0\n')
        f.chmod(0o755)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture()
def scratch(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", repo / "scripts")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    log = tmp_path / "calls.log"
    _recorders(tmp_path / "bin", log)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "SLURM_"))}
    env["PATH"] = f"{tmp_path / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return repo, log, env


@pytest.mark.parametrize("script", [s for s in SCRIPTS if not s.endswith(".py")])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_does_nothing_else(scratch, script, flag):
    repo, log, env = scratch
    before = _files(repo)
    p = subprocess.run([str(repo / "scripts" / script), flag], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, (script, p.returncode, p.stderr[-2000:])
    assert f"scripts/{script}" in p.stdout and len(p.stdout.splitlines()) >= 3, p.stdout
    assert not log.exists(), f"{script} {flag} ran: {log.read_text()}"
    assert _files(repo) == before, f"{script} {flag} left files: {_files(repo) - before}"


def test_gen_docs_help_writes_nothing(tmp_path):
    docs = {p: p.stat().st_mtime_ns for p in (REPO / "docs").rglob("*.md")}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--check" in p.stdout, p.stderr
    assert {q: q.stat().st_mtime_ns for q in docs} == docs


def test_setup_never_goes_ten_seconds_without_a_line(scratch, tmp_path):
    """A pip that works 14 s in silence (a stand-in for a fresh install's download and unpack:
    the real one takes ~2 min and needs the index): setup still says something at least every
    10 s, and what pip is doing."""
    repo, _log, env = scratch
    py = tmp_path / "bin" / "python3"
    # `python3 -m venv .venv` makes a .venv whose python fails the "what is installed" check
    # once (so setup installs) and whose pip prints one line and then works silently
    py.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\n[ -f {tmp_path}/installed ] && exit 0\\nexit 1\\n' > "$3/bin/python"
  printf '#!/bin/sh\\necho "Collecting torch==2.13.0"\\nsleep 14\\ntouch {tmp_path}/installed\\necho "Successfully installed torch"\\n' > "$3/bin/pip"
  chmod +x "$3/bin/python" "$3/bin/pip"
  exit 0
fi
echo "Python 3.11.0"
""")
    p = subprocess.Popen([str(repo / "scripts" / "setup")], stderr=subprocess.PIPE, text=True, env=env)
    assert p.stderr is not None
    t0 = time.monotonic()
    stamps, lines = [t0], []
    for line in p.stderr:
        stamps.append(time.monotonic())
        lines.append(line.rstrip())
    assert p.wait(timeout=60) == 0, lines
    stamps.append(time.monotonic())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert stamps[-1] - t0 >= 14, lines            # pip's silence happened
    assert max(gaps) < 10.0, list(zip(gaps, lines))
    assert any("pip: Collecting torch==2.13.0" in ln for ln in lines), lines
    assert lines[-1].startswith("scripts/setup: done"), lines
