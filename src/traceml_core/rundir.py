"""A run's directory and its files: the directory (with a fallback), atomic writes, checkpoints.

The aggregator writes them (checkpoints, the summary at the end), the report reads and rewrites
them (``traceml summarize``, ``traceml report``, exports), the launcher finds them; all through
this one module, which depends on neither.

Nothing here may lose a run: every write goes to a temporary file in the same directory and is
renamed over the target (readers see the old or the new file, never half of one), and when the
logs directory cannot be written (read-only, disk full, no permission) the files go to
``$TMPDIR/traceml-<uid>/<run>`` instead and the reason is kept, so the summary and the launcher's
message can say where they are and why.

``$TMPDIR`` is shared with every user of the machine, so the fallback is made safely: each of
``traceml-<uid>`` and ``<run>`` is created with mode 0700, and an existing one is used only when it
is a real directory (not a symlink) owned by this user (its mode is then tightened to 0700). One
that someone else made (a planted directory or symlink) is refused, named in the note, and a fresh
private directory (``mkdtemp``) is used instead. Files are created with ``O_EXCL | O_NOFOLLOW`` and
renamed into place, so a planted symlink is replaced, never written through. Checkpoints are read
only from directories this user owns (:func:`owned_problem`): a checkpoint planted by another user
cannot forge a summary.

The logs directory itself may be a team's, shared (group-writable, sticky or not): anyone of the
team can leave an entry named like the run's directory there first. So the run directory must be
a real directory of this user's: a symbolic link, another user's directory or a file where it
belongs is never used (it cannot be removed either: it is not ours); the run takes the first
sibling it can make its own (``<run>.<job>``, ``<run>.2`` ...; the fallback after those), and
the note says which and why. Made by the run, it is ``0755`` (a teammate reads the summary, never
adds a file to it). Its identity (device, inode) is kept, and every write opens it anew without
following a link and checks that identity: a directory renamed away and replaced by a link
between two writes (possible where others may rename entries of the logs directory) is noticed,
and the files move to the fallback, said in the note. Every read of a file in it goes through
:mod:`traceml_core.safeio` (ours, regular, never a link, never blocking, bounded).
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import msgpack

from .safeio import UnsafeFileError, entry_problem, open_dir, read_file, writable_by_others

CHECKPOINT_NAME = "aggregate.state"
SUMMARY_JSON = "final_summary.json"
SUMMARY_TXT = "final_summary.txt"
SUMMARY_HTML = "final_summary.html"
CHECKPOINT_FORMAT = "traceml-aggregate"
CHECKPOINT_VERSION = 1
#: the largest checkpoint read back (16,384 ranks write about 640 MB: aggregator/server.py)
MAX_CHECKPOINT_BYTES = 4 << 30
#: siblings tried when the run directory is not ours, or belongs to a live run (aggregator/claim.py)
MAX_SIBLINGS = 50


def fallback_root() -> Path:
    return Path(tempfile.gettempdir()) / f"traceml-{os.getuid()}"


def fallback_dir(run_name: str) -> Path:
    return fallback_root() / run_name


def owned_problem(path: Path, *, directory: bool = True) -> Optional[str]:
    """None when ``path`` is a real directory (or regular file) owned by this user; else why not.
    Never follows a symlink."""
    return entry_problem(path, directory=directory)


def siblings(wanted: Path, job_id: Optional[str]):
    """The directories tried after ``wanted``: ``<name>.<job>``, then ``<name>.2``, ``.3`` ..."""
    if job_id:
        yield wanted.with_name(f"{wanted.name}.{job_id}")
    for i in range(2, MAX_SIBLINGS + 2):
        yield wanted.with_name(f"{wanted.name}.{i}")


def own_dir(path: Path) -> tuple[int, int]:
    """Make ``path`` (mode 0755), or accept an existing directory of this user's; its (device,
    inode). :class:`UnsafeFileError` when the entry is not ours or not a real directory (a link
    someone planted: never followed, never removed); other ``OSError`` when it cannot be made."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    fd = open_dir(path)
    try:
        st = os.fstat(fd)
        if writable_by_others(st):  # ours: nobody else adds a file to a run's directory
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700, or accept an existing one that is ours; raise
    :class:`UnsafeDirError` for one that is not (planted by someone else, or a symlink)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    problem = owned_problem(path)
    if problem is not None:
        raise UnsafeDirError(f"{path} cannot be trusted: {problem}")
    if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours and a real directory (checked above): a symlink is never chmod-ed


class UnsafeDirError(OSError):
    """A directory in the shared temporary directory that this user does not own."""


def make_fallback(run_name: str) -> tuple[Path, Optional[str]]:
    """The fallback run directory, made safely; and, when the usual one was refused, why."""
    path = fallback_dir(run_name)
    try:
        private_dir(path.parent)
        private_dir(path)
        return path, None
    except UnsafeDirError as exc:
        fresh = Path(tempfile.mkdtemp(prefix=f"traceml-{os.getuid()}-{run_name[:64]}-"))
        return fresh, f"{exc}, so a fresh private directory is used"


def make_private() -> tuple[Path, Optional[str]]:
    """A directory only this user can use (0700, never a link, never another user's) for a
    private file (the dashboard's token): ``$TMPDIR/traceml-<uid>``, else (someone else made it)
    a fresh one in ``$TMPDIR``, else ``~/.cache/traceml``; and why the usual one was not used
    (None when it was). ``OSError`` naming each place when none can be made."""
    def home_cache() -> Path:
        d = Path(os.path.expanduser("~")) / ".cache" / "traceml"
        d.parent.mkdir(parents=True, exist_ok=True)
        private_dir(d)
        return d

    def usual() -> Path:
        private_dir(fallback_root())
        return fallback_root()

    why: list[str] = []
    for make in (usual, lambda: Path(tempfile.mkdtemp(prefix=f"traceml-{os.getuid()}-")), home_cache):
        try:
            made = make()
        except OSError as exc:
            why.append(str(exc) if isinstance(exc, UnsafeDirError) else (exc.strerror or str(exc)))
            continue
        return made, ("; ".join(why) + f", so {made} is used") if why else None
    raise OSError(0, "; ".join(why))


@dataclass
class RunDir:
    """Where this run's files go: ``path`` (may be the fallback) and why, when it is not ``wanted``."""

    wanted: Path
    path: Path
    note: Optional[str] = None
    #: told the note when the files move (the aggregator logs it: the move is said when it happens)
    on_move: Optional[Callable[[str], None]] = field(default=None, repr=False, compare=False)
    #: (device, inode) of ``path`` as this run made or checked it; every write checks it again
    ident: Optional[tuple[int, int]] = field(default=None, repr=False, compare=False)

    @property
    def is_fallback(self) -> bool:
        return self.path != self.wanted

    def switch_to_fallback(self, run_name: str, reason: str) -> None:
        run_name = self.wanted.name  # the run's directory name (a claimed sibling's: claim.py)
        fb, refused = make_fallback(run_name)
        moved = (f"could not write to {self.wanted} ({reason}); the files are in {fb} instead "
                 "(fix the permissions or free space of --logs-dir, or set it to a writable "
                 "directory)" + (f". The usual fallback {fallback_dir(run_name)} was refused: {refused}"
                                 if refused else ""))
        self.note = "; ".join(n for n in (self.note, moved) if n)  # (a claim's note stays)
        self.path = fb
        self.ident = _ident(fb)
        if self.on_move is not None:
            self.on_move(moved)

    def open(self) -> int:
        """A descriptor of ``path``, checked to be the directory this run made (see the module's
        docstring); :class:`UnsafeFileError` when it is not any more. The caller closes it."""
        fd = open_dir(self.path)
        if self.ident is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.ident:
                os.close(fd)
                raise UnsafeFileError(0, f"{self.path} is no longer the directory this run made (it was "
                                         "renamed or replaced while the run wrote to it)")
        return fd


def _ident(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _create(path: Path | str, dir_fd: Optional[int] = None) -> int:
    """A new file at ``path`` for writing: never through a symlink, never someone else's file (a
    stale one of ours is replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(path, dir_fd=dir_fd)  # removes a symlink itself, never its target
        return os.open(path, flags, 0o644, dir_fd=dir_fd)


def _probe(rd: RunDir) -> None:
    fd = rd.open()
    try:
        probe = f".traceml-write-test.{os.getpid()}"
        os.close(_create(probe, fd))
        os.unlink(probe, dir_fd=fd)
    finally:
        os.close(fd)


def _make(path: Path) -> tuple[int, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return own_dir(path)


def prepare_run_dir(wanted: Path, run_name: str, job_id: Optional[str] = None) -> RunDir:
    """Make the run directory, or fall back; raises OSError only when the fallback fails too.
    ``wanted`` when it is (or can be made) a real directory of this user's; else the first
    sibling that can (see the module's docstring), with the note that says why."""
    rd = RunDir(wanted=Path(wanted), path=Path(wanted))
    try:
        try:
            rd.ident = _make(rd.path)
        except UnsafeFileError as exc:
            rd.path, rd.ident, rd.note = _sibling(rd.wanted, job_id, exc)
            rd.wanted = rd.path
        _probe(rd)
    except OSError as exc:
        rd.switch_to_fallback(run_name, exc.strerror or type(exc).__name__)
        _probe(rd)
    return rd


def _sibling(wanted: Path, job_id: Optional[str], why: UnsafeFileError) -> tuple[Path, tuple[int, int], str]:
    """The first sibling of ``wanted`` that is (or can be made) ours, and the note that says why.
    Raises the last error when none can (then the run falls back to ``$TMPDIR``)."""
    err: OSError = why
    for cand in siblings(wanted, job_id):
        try:
            ident = own_dir(cand)
        except UnsafeFileError as exc:
            err = exc
            continue
        return cand, ident, (
            f"{why.strerror} (another user's entry in a shared logs directory?), so this run's files "
            f"are in {cand} instead. TraceML never writes through a link or into a directory that is "
            f"not yours; remove {wanted} if it is yours to remove, or give the run another --run-name")
    raise err


def atomic_write(path: Path, data: bytes, *, sync: bool = False, dir_fd: Optional[int] = None) -> None:
    """``path`` replaced whole by ``data`` (a temporary file renamed over it). With ``dir_fd``,
    ``path`` is a name in that directory."""
    name = Path(path).name if dir_fd is not None else path
    tmp: Path | str = f".{Path(path).name}.tmp.{os.getpid()}"
    if dir_fd is None:
        tmp = Path(path).with_name(str(tmp))
    try:
        with os.fdopen(_create(tmp, dir_fd), "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _write_in(rd: RunDir, name: str, data: bytes, sync: bool) -> Path:
    fd = rd.open()
    try:
        atomic_write(Path(name), data, sync=sync, dir_fd=fd)
    finally:
        os.close(fd)
    return rd.path / name


def write_file(rd: RunDir, run_name: str, name: str, data: bytes, *, sync: bool = False) -> Path:
    """Write ``name`` into the run directory, switching to the fallback once if that fails."""
    try:
        return _write_in(rd, name, data, sync)
    except OSError as exc:
        if rd.is_fallback:
            raise
        rd.switch_to_fallback(run_name, exc.strerror or type(exc).__name__)
        return _write_in(rd, name, data, sync)


#: msgpack extension type of an integer past 64 bits, stored as its decimal digits. Node 0's sums
#: are Python integers: every value is within its physical bound (wire/frames.py), but a long run's
#: sum of them (a peak memory of 128 GiB over 2**27 steps) passes 2**64, where msgpack stops; a
#: checkpoint must never fail on that (every checkpoint failing cost the run its statistics)
BIG_INT = 1


def _pack_big(obj: Any) -> Any:
    if type(obj) is int:  # msgpack hands over only the integers it cannot hold itself
        return msgpack.ExtType(BIG_INT, str(obj).encode())
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _unpack_ext(code: int, data: bytes) -> Any:
    if code == BIG_INT:
        return int(data)
    return msgpack.ExtType(code, data)


def pack_checkpoint(data: dict[str, Any], *, final: bool) -> bytes:
    doc = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
           "taken_at": time.time(), "final": final, "state": data}
    return msgpack.packb(doc, use_bin_type=True, default=_pack_big)


def foreign_checkpoint(doc: dict[str, Any], settings: Any) -> Optional[str]:
    """None when the checkpoint ``doc`` is this run's (its settings carry the same run id, job id
    and run name as ``settings``: AggregatorSettings or their public dict); else whose it is."""
    theirs = (doc.get("state") or {}).get("settings") or {}
    ours = settings if isinstance(settings, dict) else settings.public()
    keys = ("run_id", "job_id", "run_name")
    if all(theirs.get(k) == ours.get(k) for k in keys):
        return None
    job = theirs.get("job_id")
    return (f"job {job}" if job and job != ours.get("job_id") else "another run") + \
        f" (run {theirs.get('run_name')!r}, id {theirs.get('run_id') or 'unknown'})"


def load_checkpoint(path: Path, *, owned: bool = True) -> dict[str, Any]:
    """The checkpoint document; raises ValueError with a readable reason when it is not one (not
    a regular file of this user's, a link, too large: :func:`traceml_core.safeio.read_file`).
    ``owned=False``: another user's may be read (a test that forges one from it)."""
    try:
        raw = read_file(path, MAX_CHECKPOINT_BYTES, owned=owned)
    except UnsafeFileError as exc:
        raise ValueError(exc.strerror) from None
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=_unpack_ext)
    except Exception as exc:
        raise ValueError(f"{path} is not a TraceML checkpoint ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a TraceML checkpoint")
    if doc.get("format_version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path} has checkpoint format {doc.get('format_version')!r}; this "
                         f"traceml reads version {CHECKPOINT_VERSION}")
    return doc
