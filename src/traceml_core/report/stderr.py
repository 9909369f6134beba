"""What a failed worker's stderr says: the collective library's own message, and the script's
last words.

A native library that gives up does not raise a Python exception: gloo's transport thread throws
an uncaught C++ exception (``terminate called after throwing an instance of 'gloo::EnforceNotMet'
... Is there a distributed collective mismatch in your code?``) and the process dies of SIGABRT;
NCCL's watchdog does the same after a timeout; MPI prints and calls ``MPI_Abort``. A script that
exits in ``argparse`` (a typo in a flag, a ``traceml run`` flag placed after the script) prints
its usage and ``prog: error: ...``, then ``sys.exit(2)``. In both cases the words that explain the
failure were only ever on the worker's stderr. The torchrun process of ``traceml run`` keeps the
last lines of each worker's stderr (``launcher/stderrtee.py``) and sends them with torchrun's
record of a failed worker (``ranks[].exit.stderr``); these pure readers pick the sentence out.

:data:`LIBRARY_MESSAGES` is the one table of what the libraries say: each row names the library
(by the line's own words: a gloo source path or type, ``NCCL``, ``MPI_``), what kind of failure
it reports (:data:`KINDS`) and the pattern. A *mismatch* (the ranks called different collectives,
or the same one with different sizes) is a cause; a *closed* connection and a *timeout* are what
a rank sees when a peer died or stopped, so they are consequences (``report/tracebacks.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

#: what a collective library's message can report, most telling first
KINDS = ("mismatch", "timeout", "error", "closed")
#: words each kind is said in, for a sentence: "gloo reported a collective mismatch"
KIND_WORDS = {"mismatch": "a collective mismatch (the ranks called different collectives, or the same "
                          "one with different sizes)",
              "timeout": "a collective that timed out waiting for a peer",
              "error": "an error",
              "closed": "a lost connection to a peer"}

#: (library, how a line of that library is recognised, ((kind, pattern), ...)); the first kind
#: whose pattern matches a line of the library is its kind; a line of the library that matches
#: none (a warning, a note) is not a message
LIBRARY_MESSAGES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("gloo", r"gloo",
     (("mismatch", r"collective mismatch|size doesn't match|does not match|mismatch"),
      ("timeout", r"[Tt]imed? ?out"),
      ("closed", r"Connection (closed|reset)|Broken pipe|Read error|Write error|peer"),
      ("error", r"EnforceNotMet|enforce fail|[Ee]rror"))),
    ("NCCL", r"NCCL|nccl",
     (("mismatch", r"mismatch"),
      ("timeout", r"[Tt]imed? ?out|Timeout\(ms\)|ran for \d+ milliseconds"),
      ("closed", r"remote process exited|network error|Connection (closed|reset)|ncclRemoteError"),
      ("error", r"ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclInvalid|NCCL error|"
                r"NCCL WARN"))),
    ("MPI", r"\bMPI_|Open MPI|MPICH|\bPMPI",
     (("mismatch", r"MPI_ERR_TRUNCATE|truncat|MPI_ERR_COUNT|MPI_ERR_TYPE"),
      ("timeout", r"[Tt]imed? ?out"),
      ("closed", r"MPI_ERR_PROC_FAILED|process.*(exited|failed)|Connection (closed|reset)"),
      ("error", r"MPI_ABORT|MPI_ERR"))),
    # torch's own check of the ranks' collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL), any backend
    ("torch.distributed", r"Detected mismatch between collectives", (("mismatch", r"."),)),
)
_LIBRARIES = [(lib, re.compile(who), [(kind, re.compile(p)) for kind, p in kinds])
              for lib, who, kinds in LIBRARY_MESSAGES]

#: decorations around a library's sentence that say nothing to the user: torch's rank prefix, the
#: C++ runtime's words for an uncaught exception, the Python exception type carrying it, source locations of the library's build, log
#: prefixes (glog's ``E1207 13:32:28.511000 9479 file.cpp:12]``)
_NOISE = [re.compile(p) for p in (
    r"^\s*\[(default|rank)\d+\]:\s*",
    r"^\s*terminate called after throwing an instance of '[^']*'\s*",
    r"^\s*what\(\):\s*",
    r"^\s*[\w.]*(Error|Exception):\s*",
    r"^\s*\[?[EWI]\d{4} [\d:.]+ \d+ [^\]]*\]\s*",
    r"\[(enforce fail at )?[^\]\s]*\.(cc|cpp|cu|c|h|hpp):\d+\]\s*",
    r"\s*GLHF!.*$",
)]
#: lines that are TraceML's or torch's own logging, not the script's words
_NOT_THE_SCRIPTS = re.compile(r"^\s*(\[traceml\]|traceml[-:]|\[?[EWI]\d{4} [\d:.]+ |\[W[\d:. ]|"
                              r"\[rank\d+\]:\s*$|Warning:|.*UserWarning:)")
_ERROR_WORDS = re.compile(r"\berror\b|Error\b|[Ee]xception\b|[Ff]atal|[Ff]ailed\b|not found|[Nn]o such|"
                          r"[Ii]nvalid|required|unrecognized")
#: characters a quoted sentence keeps
QUOTE_MAX = 300


@dataclass(frozen=True)
class LibraryMessage:
    """One sentence a collective library wrote on a worker's stderr."""

    #: ``gloo``, ``NCCL``, ``MPI`` or ``torch.distributed``
    library: str
    #: one of :data:`KINDS`
    kind: str
    #: the sentence, without its decorations (:data:`_NOISE`), at most :data:`QUOTE_MAX` characters
    text: str

    @property
    def is_consequence(self) -> bool:
        """A lost connection or a timeout is what a rank sees when a peer died or stopped."""
        return self.kind in ("closed", "timeout")


def clean(line: str) -> str:
    """``line`` without the decorations of :data:`_NOISE`, its spaces collapsed, shortened."""
    text = line
    for rx in _NOISE:
        text = rx.sub("", text)
    text = " ".join(text.split())
    return text if len(text) <= QUOTE_MAX else text[:QUOTE_MAX - 3].rstrip() + "..."


#: a library's warnings (c10d's ``[W socket.cpp:207] ...``, ``Warning: TORCH_NCCL_...``) are no failure
_WARNING = re.compile(r"^\s*(\[(default|rank)\d+\]:)?\s*\[W[\d ]|Warning:|UserWarning")


def _library_of(line: str) -> Optional[tuple[str, str]]:
    if _WARNING.search(line):
        return None
    for lib, who, kinds in _LIBRARIES:
        if who.search(line):
            kind = next((kind for kind, rx in kinds if rx.search(line)), None)
            return (lib, kind) if kind is not None else None
    return None


def library_message(stderr: Optional[str]) -> Optional[LibraryMessage]:
    """The collective library's message in a worker's stderr, or None: of the lines a library
    wrote, the first of the most telling kind (:data:`KINDS`: a mismatch explains more than the
    lost connections that follow it). Lines of a Python traceback (``File "..."``) are not
    messages."""
    if not stderr:
        return None
    best: Optional[tuple[int, LibraryMessage]] = None
    for line in stderr.splitlines():
        if re.match(r"^\s*(\[rank\d+\]:\s*)?(File \"|Traceback \(|frame #\d+|Exception raised from)", line):
            continue
        found = _library_of(line)
        if found is None:
            continue
        text = clean(line)
        if len(text) < 12:   # a bare "terminate called..." or a prefix: no sentence
            continue
        lib, kind = found
        order = KINDS.index(kind)
        if best is None or order < best[0]:
            best = (order, LibraryMessage(lib, kind, text))
    return best[1] if best else None


def script_message(stderr: Optional[str]) -> Optional[str]:
    """The script's last words on stderr (``train.py: error: unrecognized arguments: --stpes 3``),
    or None: of its last non-empty lines that are not TraceML's or torch's logging, the last that
    reads as an error, else the last one."""
    if not stderr:
        return None
    lines = [ln.rstrip() for ln in stderr.splitlines()
             if ln.strip() and not _NOT_THE_SCRIPTS.match(ln)]
    if not lines:
        return None
    tail = lines[-5:]
    pick = next((ln for ln in reversed(tail) if _ERROR_WORDS.search(ln)), tail[-1])
    text = " ".join(re.sub(r"^\s*\[(default|rank)\d+\]:\s*", "", pick).split())
    return text if len(text) <= QUOTE_MAX else text[:QUOTE_MAX - 3].rstrip() + "..."
