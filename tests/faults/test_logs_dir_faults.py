"""The logs directory read-only or full: the run goes on and its summary goes to the fallback
directory (``$TMPDIR/traceml-<uid>/<run>``), which the launcher's messages and the summary name.

Real filesystems: a tmpfs mounted read-only, and a 1 MiB tmpfs filled up mid-run (root only: the
test skips elsewhere). ``TMPDIR`` points the fallback into the test's own directory.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness import Launch, assert_no_leftovers, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def mount(tmp_path):
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
        mounted.append(d)
        return d

    yield make
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _fill(d: Path) -> None:
    chunk = b"\0" * 65536
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_read_only_logs_dir_falls_back_and_says_where(tmp_path, mount):
    ro = mount("ro", "ro,size=1m")
    fb = tmp_path / "tmp"
    fb.mkdir()
    r = run(tmp_path, ("--steps", "30"), nproc=1, logs=ro / "logs", run_name="rofs",
            env={"TMPDIR": str(fb)})
    assert r.code == 0 and r.progress.result is not None
    where = fb / f"traceml-{os.getuid()}" / "rofs"
    assert f"could not write to {ro / 'logs' / 'rofs'} (Read-only file system)" in r.err
    assert f"[traceml] summary: {where / 'final_summary.json'}" in r.err
    s = r.summary(where)
    assert s["files"]["json"] == str(where / "final_summary.json")
    assert any("Read-only file system" in n and str(where) in n for n in s["notes"])
    assert s["telemetry"]["records_received"] == 30 and s["telemetry"]["complete"]
    assert f"Note: could not write to {ro / 'logs' / 'rofs'}" in r.out


def test_disk_full_mid_run_moves_the_files_and_says_why(tmp_path, mount):
    small = mount("full", "size=1m")
    fb = tmp_path / "tmp"
    fb.mkdir()
    launch = Launch(tmp_path, ("--steps", "150", "--step-ms", "15"), nproc=1, logs=small / "logs",
                    run_name="full", env={"TMPDIR": str(fb)})
    deadline = time.monotonic() + 180
    while not (small / "logs" / "full" / "aggregate.state").exists():
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.stderr_now()
        time.sleep(0.05)
    _fill(small)  # the disk is full from now on
    r = launch.wait(180)
    assert r.code == 0 and r.progress.result is not None
    where = fb / f"traceml-{os.getuid()}" / "full"
    s = r.summary(where)
    assert any("No space left on device" in n and str(where) in n for n in s["notes"]), s["notes"]
    assert f"[traceml] summary: {where / 'final_summary.json'}" in r.err
    assert "No space left on device" in r.out  # the printed summary's note
    # said when it happened, in the job's log (issue 27, finding 7), not only in the summary
    moved = f"traceml-aggregator: could not write to {small / 'logs' / 'full'} (No space left on device)"
    assert moved in r.err and r.err.index(moved) < r.err.index("[traceml] workers ended"), r.err[-3000:]
    assert s["telemetry"]["records_received"] == 150 and s["telemetry"]["complete"]
    assert_no_leftovers(r)
    # `traceml summarize` of the original RUN_DIR finds the newer checkpoint in the fallback
    from traceml_core.report.summarize import find_checkpoint
    from traceml_core import rundir as persist
    old_tmp = persist.tempfile.tempdir
    persist.tempfile.tempdir = str(fb)
    try:
        assert find_checkpoint(small / "logs" / "full").parent == where
    finally:
        persist.tempfile.tempdir = old_tmp

