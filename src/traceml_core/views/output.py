"""Carry the training processes' output to the terminal while a live view owns the bottom of it.

With ``--mode cli`` on a terminal, torchrun and the workers write into a pipe instead of the
terminal (an interleaved write straight to the terminal would tear the redrawn view); one thread
reads the pipe and prints whole lines above the live view. Rules that keep training safe:

* the reader never waits on anything but the pipe and the print, so the pipe (64 KiB) never stays
  full for long; a training process blocks on ``print`` only as long as it would on a slow
  terminal;
* a line still without its newline (a progress bar, a prompt) is shown after
  :data:`PARTIAL_FLUSH_S`; carriage returns keep only the text after the last one, as a terminal
  would;
* if printing through the view fails, the bytes go straight to our stdout from then on.
"""

from __future__ import annotations

import codecs
import os
import select
import threading
from typing import Callable, Optional

PARTIAL_FLUSH_S = 0.5
READ_SIZE = 65536


class OutputPump:
    def __init__(self, write: Callable[[str], None], fallback_fd: int = 1) -> None:
        self._write = write
        self._fallback_fd = fallback_fd
        self._r, self._w = os.pipe()
        self._thread: Optional[threading.Thread] = None
        self._broken = False
        self.lines = 0

    def popen_kwargs(self) -> dict[str, int]:
        """stdout and stderr of the training command (both into the one pipe, order kept)."""
        return {"stdout": self._w, "stderr": self._w}

    def start(self) -> None:
        """After the child started: drop our copy of the write end (EOF when the children exit)."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        self._thread = threading.Thread(target=self._run, name="traceml-output-pump", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for EOF (all writers gone) up to ``timeout``; True when everything was carried."""
        if self._thread is None:
            if self._w >= 0:
                os.close(self._w)
                self._w = -1
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _emit(self, text: str) -> None:
        if not text:
            return
        if not self._broken:
            try:
                self._write(text)
                return
            except Exception:
                self._broken = True
        try:
            os.write(self._fallback_fd, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def _run(self) -> None:
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        partial = ""
        try:
            while True:
                ready, _, _ = select.select([self._r], [], [], PARTIAL_FLUSH_S)
                if not ready:
                    if partial:  # a line without newline for a while: show what a terminal shows
                        self._emit(partial + "\n")
                        partial = ""
                    continue
                data = os.read(self._r, READ_SIZE)
                if not data:
                    break
                text = partial + dec.decode(data)
                head, sep, partial = text.rpartition("\n")
                if sep:
                    lines = [_as_shown(seg) for seg in head.split("\n")]
                    self.lines += len(lines)
                    self._emit("\n".join(lines) + "\n")
                if "\r" in partial:
                    partial = partial.rsplit("\r", 1)[-1]
            rest = partial + dec.decode(b"", final=True)
            if rest:
                self._emit(rest + "\n")
        except Exception:
            pass
        finally:
            try:
                os.close(self._r)
            except OSError:
                pass


def _as_shown(line: str) -> str:
    """What a terminal leaves of a line with carriage returns: the text after the last one."""
    line = line.rstrip("\r")
    return line.rsplit("\r", 1)[-1] if "\r" in line else line
