"""Each worker's stderr through the torchrun process (launcher/stderrtee.py), with real child
processes: every byte reaches the real stderr unchanged, a terminal stays a terminal for the
worker, and the end of the stream (with a collective library's line that scrolled away) is kept
for the summary. torchrun's own worker start is wrapped for real (torch's SubprocessHandler).
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
import threading

from traceml_core.launcher.stderrtee import SEND_MAX, StderrTees, WorkerStderr

GLOO = ("  what():  [enforce fail at pair.cc:456] Received data size doesn't match expected size. "
        "Is there a distributed collective mismatch in your code?")
CHILD = f"""
import sys
w = sys.stderr.buffer
w.write({GLOO!r}.encode() + b"\\n")
for i in range(300):
    w.write(b"log line %d of the worker\\n" % i)
w.write(b"progress 10%\\rprogress 50%\\rprogress 100%\\n")
w.write(b"no newline at the end")
w.flush()
sys.exit(3)
"""


def _drain(fd: int, out: bytearray) -> threading.Thread:
    def run() -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            out.extend(data)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_every_byte_reaches_the_real_stderr_and_the_end_is_kept():
    r, w = os.pipe()
    seen = bytearray()
    reader = _drain(r, seen)
    tee = WorkerStderr(dest=w)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stderr=tee.writer)
    tee.started()
    assert child.wait(60) == 3
    assert tee.done.wait(30), "the copy did not reach the end of the worker's stderr"
    os.close(w)
    reader.join(30)
    expected = subprocess.run([sys.executable, "-c", CHILD], capture_output=True).stderr
    assert bytes(seen) == expected   # unchanged, in order, nothing lost or added
    text = tee.tail.text()
    assert len(text) <= SEND_MAX
    lines = text.splitlines()
    assert lines[0] == GLOO          # the library's line, long scrolled away, kept first
    assert lines[-1] == "no newline at the end" and lines[-2] == "progress 100%"
    assert lines[-3] == "log line 299 of the worker" and "log line 0 of the worker" not in text


def test_a_terminal_stays_a_terminal_for_the_worker():
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    seen = bytearray()
    reader = _drain(master, seen)
    tee = WorkerStderr(dest=slave)
    code = ("import os, sys; s = os.get_terminal_size(2); "
            "sys.stderr.write(f'tty={sys.stderr.isatty()} cols={s.columns} rows={s.lines}\\nnext\\n')")
    child = subprocess.Popen([sys.executable, "-c", code], stderr=tee.writer)
    tee.started()
    assert child.wait(60) == 0 and tee.done.wait(30)
    os.close(slave)
    reader.join(30)
    # the real terminal turns each \n into \r\n once, as it does for a worker writing to it directly
    assert b"tty=True cols=111 rows=33\r\nnext\r\n" in bytes(seen), bytes(seen)
    assert tee.tail.text() == "tty=True cols=111 rows=33\nnext"


def test_torchruns_worker_start_is_wrapped(monkeypatch, tmp_path):
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    monkeypatch.setattr(SubprocessHandler, "_popen", SubprocessHandler._popen)  # restored afterwards
    r, w = os.pipe()
    seen = bytearray()
    reader = _drain(r, seen)
    tees = StderrTees(dest=w)
    assert tees.install()
    code = "import sys; sys.stderr.write('train.py: error: unrecognized arguments: --stpes 3\\n'); sys.exit(2)"
    h = SubprocessHandler(sys.executable, ("-c", code), {}, None, None, 1, None)
    assert h.proc.wait(60) == 2
    assert tees.texts([0, 1]) == {1: "train.py: error: unrecognized arguments: --stpes 3"}
    # torchrun's own redirect (--redirects/--tee) is left as it is
    log = tmp_path / "stderr.log"
    h2 = SubprocessHandler(sys.executable, ("-c", code), {}, None, str(log), 2, None)
    assert h2.proc.wait(60) == 2 and 2 not in tees.workers
    h2._stderr.close()
    os.close(w)
    reader.join(30)
    assert bytes(seen) == b"train.py: error: unrecognized arguments: --stpes 3\n"
    assert "unrecognized arguments" in log.read_text()
