"""Files the aggregator writes: the run directory (with a fallback), atomic writes, checkpoints.

Nothing here may lose a run: every write goes to a temporary file in the same directory and is
renamed over the target (readers see the old or the new file, never half of one), and when the
logs directory cannot be written (read-only, disk full, no permission) the files go to
``$TMPDIR/traceml-<uid>/<run>`` instead and the reason is kept, so the summary and the launcher's
message can say where they are and why.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import msgpack

CHECKPOINT_NAME = "aggregate.state"
SUMMARY_JSON = "final_summary.json"
SUMMARY_TXT = "final_summary.txt"
SUMMARY_HTML = "final_summary.html"
CHECKPOINT_FORMAT = "traceml-aggregate"
CHECKPOINT_VERSION = 1


def fallback_dir(run_name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"traceml-{os.getuid()}" / run_name


@dataclass
class RunDir:
    """Where this run's files go: ``path`` (may be the fallback) and why, when it is not ``wanted``."""

    wanted: Path
    path: Path
    note: Optional[str] = None

    @property
    def is_fallback(self) -> bool:
        return self.path != self.wanted

    def switch_to_fallback(self, run_name: str, reason: str) -> None:
        fb = fallback_dir(run_name)
        fb.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.note = (f"could not write to {self.wanted} ({reason}); the files are in {fb} instead "
                     "(fix the permissions or free space of --logs-dir, or set it to a writable "
                     "directory)")
        self.path = fb


def _probe(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".traceml-write-test.{os.getpid()}"
    with open(probe, "wb") as f:
        f.write(b"ok")
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
        with open(tmp, "wb") as f:
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


def pack_checkpoint(data: dict[str, Any], *, final: bool) -> bytes:
    doc = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
           "taken_at": time.time(), "final": final, "state": data}
    return msgpack.packb(doc, use_bin_type=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint document; raises ValueError with a readable reason when it is not one."""
    raw = Path(path).read_bytes()
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a TraceML checkpoint ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a TraceML checkpoint")
    if doc.get("format_version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path} has checkpoint format {doc.get('format_version')!r}; this "
                         f"traceml reads version {CHECKPOINT_VERSION}")
    return doc
