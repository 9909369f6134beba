"""Two real local users in one team: a victim and an attacker, made with ``useradd`` for a test and
removed after it (root only: CI runs as root). Their processes are started through ``setpriv``
with their uid, their group and their supplementary groups, so the kernel's permission checks
are the real ones (not root's, which passes every check).

The team is a real group both belong to; a shared logs directory is a directory of that group,
group-writable (``2775``: setgid, as teams make them) or sticky as well (``3775``), or
world-writable and sticky like ``/tmp`` (``1777``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

REPO = Path(__file__).resolve().parents[2]


def can_switch_users() -> Optional[str]:
    """None when this process can make users and run processes as them; else why not."""
    if os.geteuid() != 0:
        return "making local users and switching to them needs root"
    missing = [t for t in ("useradd", "userdel", "groupadd", "groupdel", "setpriv") if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def argv(self) -> list[str]:
        """The command prefix that runs a program as this user (its groups too)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups"]

    def run(self, argv: list[str], *, env: Optional[dict[str, str]] = None, timeout: float = 60,
            check: bool = True, cwd: Optional[Path] = None, umask: str = "022") -> subprocess.CompletedProcess:
        """Run ``argv`` as this user (``umask`` set first) and wait for it."""
        cmd = self.argv() + ["sh", "-c", f'umask {umask} && exec "$@"', "sh"] + argv
        return subprocess.run(cmd, env=env or self.env(), cwd=str(cwd or self.home), capture_output=True,
                              text=True, timeout=timeout, check=check)

    def python(self, code: str, *args: str, timeout: float = 60, umask: str = "022") -> str:
        """Run Python ``code`` (with ``args`` as ``sys.argv[1:]``) as this user; its stdout."""
        return self.run([interpreter(self), "-c", code, *args], timeout=timeout, umask=umask).stdout

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "SLURM_", "VIRTUAL_ENV"))}
        env.update(HOME=str(self.home), USER=self.name, LOGNAME=self.name, OMP_NUM_THREADS="1",
                   XDG_CACHE_HOME=str(self.home / ".cache"), PATH="/usr/local/bin:/usr/bin:/bin",
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), _site_packages()]))
        env.update(extra)
        return env


def _site_packages() -> str:
    import site

    return os.pathsep.join(site.getsitepackages())


_INTERPRETER: dict[str, str] = {}


def interpreter(user: User) -> str:
    """A Python this user can run with this environment's packages: the test's own may sit under
    a directory only root can enter (a venv made from a Python under /root); the launcher starts
    ``sys.executable`` again, so that nested start is what is checked."""
    if "py" in _INTERPRETER:
        return _INTERPRETER["py"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import torch, traceml_core'], check=True)"
    for cand in (os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        out = subprocess.run(user.argv() + [cand, "-c", probe], env=user.env(), cwd="/", capture_output=True,
                             timeout=180)
        if out.returncode == 0:
            _INTERPRETER["py"] = cand
            return cand
    import pytest

    pytest.skip("no Python that another uid can run with this environment's packages")


def _retry(argv: list[str]) -> None:
    """useradd and its kin lock /etc/passwd; another test session on this machine may hold it."""
    for attempt in range(20):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return
        if "lock" not in out.stderr.lower() or attempt == 19:
            raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()}")
        time.sleep(0.5)


@contextmanager
def team(*roles: str) -> Iterator[tuple[str, dict[str, User], Path]]:
    """``(group, {role: User}, workdir)``: a new group and one new user per role, all in it, each
    with a home of its own (0700) under ``workdir``; removed afterwards."""
    tag = f"{os.getpid() % 100000}{int(time.time() * 1000) % 1000:03d}"
    group = f"tmteam{tag}"
    work = Path(tempfile.mkdtemp(prefix="traceml-users-", dir="/tmp"))
    os.chmod(work, 0o755)
    users: dict[str, User] = {}
    _retry(["groupadd", group])
    try:
        for role in roles:
            name = f"tm{role[:6]}{tag}"
            home = work / name
            _retry(["useradd", "-M", "-N", "-g", group, "-d", str(home), "-s", "/bin/sh", name])
            import pwd

            pw = pwd.getpwnam(name)
            home.mkdir(mode=0o700)
            os.chown(home, pw.pw_uid, pw.pw_gid)
            users[role] = User(name, pw.pw_uid, pw.pw_gid, home)
        yield group, users, work
    finally:
        for u in users.values():
            subprocess.run(["userdel", u.name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", group], capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def shared_dir(path: Path, gid: int, mode: int) -> Path:
    """A team's shared directory: root's, of the team's group, with ``mode`` (2775, 3775, 1777)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 0, gid)
    os.chmod(path, mode)
    return path
