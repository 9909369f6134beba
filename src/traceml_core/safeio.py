"""Open only what is ours and regular: the one place every run-directory file is read through.

A run directory may sit in a team's shared logs directory (group-writable, sticky or not), and the
private fallback in ``$TMPDIR``, which every user of the machine can write. Another user (or an
accident) can leave anything there: a symbolic link to ``/dev/zero`` or to someone's files, a FIFO
that blocks the first ``open()`` forever, a directory where a file belongs, a file of another
owner with forged contents. So every file TraceML reads back from those places (the summary of
an earlier attempt, the checkpoint, the run directory's claim, the dashboard's token file) goes
through :func:`read_file`, which

* never follows a symbolic link (``O_NOFOLLOW``: the link itself is refused, its target untouched);
* never blocks (``O_NONBLOCK``: a FIFO opens at once, and is then refused as what it is);
* reads only a regular file (``fstat`` of what was opened, not of a name someone may swap after);
* reads only a file of this user's (``st_uid``; where ``owned`` is asked, the default);
* reads at most ``limit`` bytes (a file that grows without end is refused, not read until memory
  runs out).

Everything refused raises :class:`UnsafeFileError` (an ``OSError``) whose message is one sentence
naming the path, what it is and why it is not read; callers add the consequence and the fix.
:func:`entry_problem` is the same check without opening (``lstat``), for directories too.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

#: flags of every read: no link followed, no blocking on a FIFO or device, no controlling tty
READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
              | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


class UnsafeFileError(OSError):
    """A file that is not ours, not regular, a link, or larger than the reader's bound."""


def kind_of(mode: int) -> str:
    """What an entry is, in words (``a FIFO``, ``a symbolic link``, ``a regular file`` ...)."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"


def stat_problem(st: os.stat_result, *, directory: bool, owned: bool = True) -> Optional[str]:
    """Why the entry described by ``st`` (an ``lstat`` or an ``fstat``) is not to be used; None
    when it is a regular file (``directory``: a directory) of this user's (``owned``)."""
    want = stat.S_ISDIR if directory else stat.S_ISREG
    if not want(st.st_mode):
        return f"it is {kind_of(st.st_mode)}, not {'a directory' if directory else 'a regular file'}"
    if owned and st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    return None


def entry_problem(path: PathLike, *, directory: bool = False, owned: bool = True,
                  dir_fd: Optional[int] = None) -> Optional[str]:
    """Why ``path`` is not to be used (never following a link); None when it is fine.
    ``"it does not exist"`` when it does not."""
    try:
        st = os.lstat(path, dir_fd=dir_fd) if dir_fd is not None else os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return stat_problem(st, directory=directory, owned=owned)


def read_file(path: PathLike, limit: int, *, owned: bool = True, dir_fd: Optional[int] = None,
              follow: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); :class:`UnsafeFileError` for
    anything else (see the module's rules), ``FileNotFoundError`` when there is none.
    ``follow``: a link is followed (a file the user named on the command line), and what it leads
    to must still be a regular file."""
    flags = READ_FLAGS & ~getattr(os, "O_NOFOLLOW", 0) if follow else READ_FLAGS
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(exc.errno, f"{path} is a symbolic link, which TraceML never follows "
                                             "here") from None
        raise
    try:
        st = os.fstat(fd)
        problem = stat_problem(st, directory=False, owned=owned)
        if problem is not None:
            raise UnsafeFileError(errno.EPERM, f"{path} is not read: {problem}")
        if st.st_size > limit:
            raise UnsafeFileError(errno.EFBIG, f"{path} is not read: it holds {st.st_size:,} bytes, more "
                                               f"than the {limit:,} such a file may")
        os.set_blocking(fd, True)  # a regular file: reads never block on it anyway
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFileError(errno.EFBIG, f"{path} is not read: it grew past the {limit:,} bytes "
                                               "such a file may hold while it was read")
        return data
    finally:
        os.close(fd)


def move_aside(path: Path, tag: str = "refused") -> Path:
    """Rename ``path`` (any kind of entry; a link itself, never its target) to
    ``<name>.<tag>-<time>-<pid>`` beside it; returns the new path. Raises ``OSError``."""
    aside = path.with_name(f"{path.name}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.rename(path, aside)
    return aside


def writable_by_others(st: os.stat_result) -> bool:
    """Group or others may create and remove entries in this directory."""
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))


def open_dir(path: PathLike, *, owned: bool = True, dir_fd: Optional[int] = None) -> int:
    """A file descriptor of the directory ``path`` (its last component never a link), checked to
    be this user's (``owned``); :class:`UnsafeFileError` otherwise. The caller closes it. Files
    are then opened relative to it (``dir_fd=``), so a name swapped afterwards changes nothing."""
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            problem = entry_problem(path, directory=True, owned=owned, dir_fd=dir_fd)
            raise UnsafeFileError(exc.errno, f"{path} is not used: {problem or exc.strerror}") from None
        raise
    try:
        problem = stat_problem(os.fstat(fd), directory=True, owned=owned)
    except OSError:
        os.close(fd)
        raise
    if problem is not None:
        os.close(fd)
        raise UnsafeFileError(errno.EPERM, f"{path} is not used: {problem}")
    return fd
