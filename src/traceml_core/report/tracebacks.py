"""What a rank's error says: its exception, where it was raised, and whether it is only what a
rank sees after a peer died (a *consequence*).

Pure readers of text (a rank's error line and its traceback event). The run status
(``report/status.py``) asks whether a rank failed by itself; the failure headline
(``report/failure.py``) names the exception and where it was raised.
"""

from __future__ import annotations

import re
from typing import Optional

from .model import RankSummary
from .stderr import library_message

#: what a surviving rank's error looks like when a peer died or a link broke: the backend's own
#: words (gloo, NCCL, the c10d TCP store, DDP). Each entry: (pattern, what it means for the user)
CONSEQUENCE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"Connection closed by peer", "gloo lost the connection to a peer"),
    (r"Connection reset by peer", "a peer's connection was reset"),
    (r"Broken pipe", "a peer's connection broke"),
    (r"gloo/transport", "gloo transport error"),
    (r"Timed out waiting|[Tt]imeout.*(recv|send|collective|store)|Socket Timeout|timed out after",
     "a collective or the store timed out waiting for a peer"),
    (r"NCCL communicator was aborted|ncclRemoteError|remote process exited|Watchdog caught collective",
     "NCCL lost a peer"),
    (r"DistBackendError|DistNetworkError|DistStoreError", "the process group lost a peer"),
    (r"TCPStore|Connection refused", "the rendezvous store went away"),
    (r"ProcessGroup.*(abort|shut ?down)", "the process group was aborted"),
    (r"SIGTERMException|killed by signal: Terminated", "it was stopped with SIGTERM"),
)
_CONSEQUENCE_RE = [(re.compile(p), what) for p, what in CONSEQUENCE_PATTERNS]
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_LIB_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
#: TraceML's own frames: its package's files, and the timing wrappers it generates around
#: forward, backward and the optimizer step (sdk/codegen.py names them ``<traceml wrapper of X>``).
#: They sit between the user's call and the library that raised, and are never where it failed
_TRACEML_FRAME = re.compile(r"^<traceml\b|[/\\]traceml_(core|slurm)[/\\]")
_SYS_EXIT_RE = re.compile(r"^(sys\.exit|exit|quit)\((?P<code>.*)\)$")
#: torchrun's own words for a worker with no error file that a signal ended
_SIGNAL_RECORD_RE = re.compile(r"Signal \d+ \(")


def consequence_of(text: str) -> Optional[str]:
    """What a surviving rank's error text says happened to its peers, or None. A collective
    mismatch is never a consequence (the ranks' own calls differ), whatever error type carries it."""
    lib = library_message(text)
    if lib is not None and lib.kind == "mismatch":
        return None
    for rx, what in _CONSEQUENCE_RE:
        if rx.search(text):
            return what
    return None


def traceback_of(rank: RankSummary) -> str:
    """The rank's last traceback (its last ``exception`` event), or ``""``."""
    for ev in reversed(rank.last_events):
        if ev.kind == "exception":
            return ev.text
    return ""


def is_traceml_frame(filename: str) -> bool:
    """Whether a traceback's frame is TraceML's own (never named as where an error was raised)."""
    return bool(_TRACEML_FRAME.search(filename))


def raised_where(traceback_text: str) -> Optional[str]:
    """``file.py:LINE in func`` of the innermost frame in the user's own code (not Python's, a
    library's or TraceML's), else of the innermost frame that is not TraceML's; None when there
    is none."""
    frames = [m for m in (_FRAME_RE.match(ln) for ln in traceback_text.splitlines())
              if m and not is_traceml_frame(m.group("file"))]
    if not frames:
        return None
    own = [m for m in frames if not any(p in m.group("file") for p in _LIB_PARTS)]
    m = (own or frames)[-1]
    name = m.group("file").rsplit("/", 1)[-1]
    return f"{name}:{m.group('line')} in {m.group('func').strip()}"


def split_exception(line: str) -> tuple[Optional[str], str]:
    """``"RuntimeError: boom"`` -> ("RuntimeError", "boom"); a dotted type name is kept whole."""
    head, sep, rest = line.partition(":")
    if sep and re.fullmatch(r"[A-Za-z_][\w.]*", head.strip()):
        return head.strip(), rest.strip()
    return None, line.strip()


def error_text(rank: RankSummary) -> str:
    return (rank.error or "").strip()


def last_line(rank: RankSummary) -> str:
    """The last line of the rank's error (the exception, or ``sys.exit(n)``), or ``""``."""
    error = error_text(rank)
    return error.splitlines()[-1] if error else ""


def exit_call(line: str) -> Optional[str]:
    """``sys.exit(3)`` (or ``exit``/``quit``) when the error line is such a call, else None: a
    script's own exit status, not an exception."""
    m = _SYS_EXIT_RE.match(line)
    return f"{m.group(1)}({m.group('code')})" if m else None


def raised_an_exception(rank: RankSummary) -> bool:
    """Whether the rank's error is an exception (not ``sys.exit(n)``)."""
    last = last_line(rank)
    return rank.status == "error" and bool(last) and exit_call(last) is None


def peer_loss(rank: RankSummary) -> Optional[str]:
    """What the rank's error and traceback say happened to its peers (a consequence), or None."""
    return consequence_of(error_text(rank) + "\n" + traceback_of(rank))


def recorded_error(rank: RankSummary) -> Optional[tuple[str, str]]:
    """Python's error of the worker as torchrun recorded it (the worker bootstrap writes torchrun's
    error file: traceml_core/bootstrap.py): (its error text, its traceback); None without one, or when
    the record only says which signal ended the worker."""
    record = ((rank.exit.message if rank.exit else None) or "").strip()
    if not record or _SIGNAL_RECORD_RE.match(record):
        return None
    return record, str((rank.exit.traceback if rank.exit else None) or "")
