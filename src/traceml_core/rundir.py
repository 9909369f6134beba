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

CHECKPOINT_NAME = "aggregate.state"
SUMMARY_JSON = "final_summary.json"
SUMMARY_TXT = "final_summary.txt"
SUMMARY_HTML = "final_summary.html"
CHECKPOINT_FORMAT = "traceml-aggregate"
CHECKPOINT_VERSION = 1


def fallback_root() -> Path:
    return Path(tempfile.gettempdir()) / f"traceml-{os.getuid()}"


def fallback_dir(run_name: str) -> Path:
    return fallback_root() / run_name


def owned_problem(path: Path, *, directory: bool = True) -> Optional[str]:
    """None when ``path`` is a real directory (or regular file) owned by this user; else why not.
    Never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if directory and not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if not directory and not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    return None


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


@dataclass
class RunDir:
    """Where this run's files go: ``path`` (may be the fallback) and why, when it is not ``wanted``."""

    wanted: Path
    path: Path
    note: Optional[str] = None
    #: told the note when the files move (the aggregator logs it: the move is said when it happens)
    on_move: Optional[Callable[[str], None]] = field(default=None, repr=False, compare=False)

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
        if self.on_move is not None:
            self.on_move(moved)


def _create(path: Path) -> int:
    """A new file at ``path`` for writing: never through a symlink, never someone else's file (a
    stale one of ours is replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)  # removes a symlink itself, never its target
        return os.open(path, flags, 0o644)


def _probe(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".traceml-write-test.{os.getpid()}"
    os.close(_create(probe))
    probe.unlink()


def prepare_run_dir(wanted: Path, run_name: str) -> RunDir:
    """Make the run directory, or fall back; raises OSError only when the fallback fails too."""
    rd = RunDir(wanted=Path(wanted), path=Path(wanted))
    try:
        _probe(rd.path)
    except OSError as exc:
        rd.switch_to_fallback(run_name, exc.strerror or type(exc).__name__)
        _probe(rd.path)
    return rd


def atomic_write(path: Path, data: bytes, *, sync: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with os.fdopen(_create(tmp), "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_file(rd: RunDir, run_name: str, name: str, data: bytes, *, sync: bool = False) -> Path:
    """Write ``name`` into the run directory, switching to the fallback once if that fails."""
    try:
        target = rd.path / name
        atomic_write(target, data, sync=sync)
        return target
    except OSError as exc:
        if rd.is_fallback:
            raise
        rd.switch_to_fallback(run_name, exc.strerror or type(exc).__name__)
        target = rd.path / name
        atomic_write(target, data, sync=sync)
        return target


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint document; raises ValueError with a readable reason when it is not one."""
    raw = Path(path).read_bytes()
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
