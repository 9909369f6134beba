"""One running run per run directory: the aggregator claims ``<logs-dir>/<run-name>`` at its start.

Why: two jobs given the same ``--run-name`` and logs directory (a copied sbatch script, two
sweeps with one name) used to share one directory: their checkpoints and summaries overwrote each
other, and an aggregator restarted mid-run could go on from the *other* job's checkpoint. Now
the first run to claim a directory owns it for as long as it is alive; a second one that finds it
owned by a live run writes to the first free sibling, ``<run-name>.<job-id>`` (``<run-name>.2``,
``.3`` ... without a job id or when that is taken too), and says so in one line: in the
launcher's log at the start and in the summary's notes. (Checkpoints also carry their run's
identity, so a restarted aggregator never resumes another run's: aggregator/server.py.)

The claim is a small file, :data:`OWNER_NAME`, created with ``O_EXCL`` (atomic on local disks and
on NFS and Lustre alike, unlike ``flock``, which some mounts keep per node). It names the owner
(run id, job, host, aggregator pid, start) and the owner touches it every :data:`HEARTBEAT_S`
seconds while it runs and marks it ended when it writes the final summary. A claim counts as live
unless it is marked ended, its file was not touched for :data:`STALE_S` seconds (the owner died
without ending it: SIGKILL, a lost node), its aggregator's pid is gone on this very host, or it is
an earlier attempt of this very job (the same job id, a lower ``SLURM_RESTART_COUNT``: Slurm starts
a requeued job's next attempt only once the one before has ended on every node, so a requeue that
restarts on other nodes seconds after losing node 0 continues the same run directory). An
aggregator restarted by its launcher has its run's id and takes its own claim back.

The claim is read like every file of the run directory (traceml_core/safeio.py: ours, regular,
never a link or a FIFO, at most 4 KiB), and the siblings are made like the run directory
(rundir.own_dir: a link or another user's entry planted there is skipped, never used).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ..rundir import own_dir, siblings
from ..safeio import read_file

#: the claim file in a run directory
OWNER_NAME = ".traceml-owner"
#: how often a running aggregator touches its claim
HEARTBEAT_S = 10.0
#: a claim not touched for this long belongs to a run that is gone
STALE_S = 4 * HEARTBEAT_S + 5.0
#: the most a claim file holds
MAX_CLAIM_BYTES = 4096


@dataclass
class Owner:
    """Who claims a run directory."""

    run_id: str
    job_id: Optional[str]
    run_name: str
    host: str
    pid: int
    started_at: float
    ended: bool = False
    #: the attempt of its job (SLURM_RESTART_COUNT; None where there is none)
    restart: Optional[int] = None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self)) + "\n").encode()

    @classmethod
    def read(cls, path: Path) -> Optional["Owner"]:
        """The claim in ``path``; None when it cannot be read as one (then it is taken over)."""
        try:
            raw = json.loads(read_file(path, MAX_CLAIM_BYTES))
            restart = raw.get("restart")
            return cls(run_id=str(raw["run_id"]), job_id=None if raw.get("job_id") is None else str(raw["job_id"]),
                       run_name=str(raw.get("run_name", "")), host=str(raw.get("host", "")),
                       pid=int(raw.get("pid", 0)), started_at=float(raw.get("started_at", 0.0)),
                       ended=bool(raw.get("ended")), restart=None if restart is None else int(restart))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        job = f"job {self.job_id}" if self.job_id else f"run {self.run_id}"
        when = time.strftime("%H:%M:%S", time.localtime(self.started_at))
        return f"{job}, whose aggregator (pid {self.pid} on {self.host or '?'}) started at {when}"


def me(run_id: str, job_id: Optional[str], run_name: str, restart: Optional[int] = None) -> Owner:
    return Owner(run_id=run_id, job_id=job_id, run_name=run_name, host=socket.gethostname(),
                 pid=os.getpid(), started_at=time.time(), restart=restart)


def superseded(theirs: Owner, mine: Owner) -> bool:
    """``theirs`` is an earlier attempt of ``mine``'s own job (requeued): it has ended, wherever
    it ran, however recently it touched its claim."""
    return (bool(theirs.job_id) and theirs.job_id == mine.job_id and theirs.restart is not None
            and mine.restart is not None and theirs.restart < mine.restart)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: it exists
        return False
    return False


def live(path: Path, owner: Owner, now: Optional[float] = None) -> bool:
    """Whether the run that wrote the claim ``path`` is still going (see the module's rules)."""
    if owner.ended:
        return False
    try:
        touched = os.lstat(path).st_mtime
    except OSError:
        return False
    if (time.time() if now is None else now) - touched > STALE_S:
        return False
    if owner.host == socket.gethostname() and owner.pid > 0 and _pid_gone(owner.pid):
        return False
    return True


def _write(path: Path, owner: Owner) -> None:
    from ..rundir import atomic_write

    atomic_write(path, owner.to_bytes())


def take(run_dir: Path, mine: Owner) -> Optional[Owner]:
    """Claim ``run_dir`` (it must exist) for ``mine``. Returns None when it is ours now, else the
    live run that owns it. Raises OSError when the directory cannot be written."""
    path = run_dir / OWNER_NAME
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        cur = Owner.read(path)
        if cur is not None and cur.run_id != mine.run_id and not superseded(cur, mine) and live(path, cur):
            return cur
        _write(path, mine)  # ours (a restarted aggregator), ended, stale or unreadable: take it
        # two runs taking over one stale claim at once: the last writer owns it
        cur = Owner.read(path)
        return None if cur is None or cur.run_id == mine.run_id else cur
    with os.fdopen(fd, "wb") as f:
        f.write(mine.to_bytes())
    return None


@dataclass
class Claim:
    """This run's claim of its directory: refreshed while the run goes on, ended with it."""

    path: Path
    owner: Owner
    #: why the run does not write where it was asked to (None when it does)
    note: Optional[str] = None
    _next: float = 0.0

    def refresh(self, now: float) -> None:
        """Touch the claim (at most every HEARTBEAT_S; from the aggregator's loop). Never raises."""
        if now < self._next:
            return
        self._next = now + HEARTBEAT_S
        try:
            os.utime(self.path / OWNER_NAME)
        except OSError:
            pass

    def end(self) -> None:
        """The run wrote its final summary: a later run may use the directory. Never raises."""
        path = self.path / OWNER_NAME
        cur = Owner.read(path)
        if cur is None or cur.run_id != self.owner.run_id:
            return
        self.owner.ended = True
        try:
            _write(path, self.owner)
        except OSError:
            pass


def claim(wanted: Path, mine: Owner) -> Claim:
    """``wanted`` when no live run owns it, else the first free sibling, with the note that says
    why. Raises OSError when ``wanted`` cannot be written at all (the caller falls back)."""
    wanted.parent.mkdir(parents=True, exist_ok=True)
    own_dir(wanted)  # UnsafeFileError (an OSError) when it is not ours: not claimed
    other = take(wanted, mine)
    if other is None:
        return Claim(wanted, mine)
    for cand in siblings(wanted, mine.job_id):
        try:
            try:
                own_dir(cand)
            except OSError:  # a link or another user's entry planted there: never used
                continue
            if take(cand, mine) is None:
                return Claim(cand, mine, note=(
                    f"{wanted} belongs to another run that is still going ({other.describe()}); this "
                    f"run's files are in {cand} instead. Give runs that share a logs directory "
                    "distinct --run-name values (under Slurm the default name includes the job id)"))
        except OSError:
            break
    return Claim(wanted, mine, note=(
        f"{wanted} belongs to another run that is still going ({other.describe()}) and no free "
        f"directory beside it could be claimed, so both runs write there: their files overwrite "
        "each other. Give runs that share a logs directory distinct --run-name values"))
