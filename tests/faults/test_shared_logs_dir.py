"""Issue 34, findings 2 and 5: a team's shared logs directory, attacked by a second real local user.

Two users made for the test (tests/faults/localusers.py: ``useradd``, run through ``setpriv``), in
one team group; the logs directory is the team's (group-writable and setgid, or sticky as well).
The attacker plants entries there before the victim's real ``traceml run``:

* a symbolic link named like the victim's run directory, pointing at a directory of the
  attacker's: before the fix the victim's summary, checkpoint and claim went into it;
* in the victim's run directory of an earlier run (made group-writable by an older TraceML under
  the team's umask 002), a forged ``attempt-<n>/`` of another job with 1,440,096 rank-seconds:
  before the fix it entered the victim's goodput ledger;
* a FIFO at ``aggregate.state`` (before: "aggregator did not start within 15 s", cause unnamed),
  a FIFO at ``attempt-0/final_summary.json`` (before: the run never ended) and a link to
  ``/dev/zero`` at ``attempt-1/final_summary.json`` (before: read until memory ran out); these
  the victim's own account can leave too (an accident), so they are the victim's files: only the
  non-blocking, regular-file checks stop them, not the owner check.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from harness import SCRIPT, free_ports
from localusers import can_switch_users, interpreter, shared_dir, team

pytestmark = pytest.mark.skipif(can_switch_users() is not None, reason=str(can_switch_users()))

#: a run of 5 steps takes 10-40 s on a loaded 2-core machine; a FIFO used to hold it for ever
RUN_TIMEOUT_S = 240


def victim_run(victim, logs: Path, run: str = "r1", umask: str = "022"):
    master, agg = free_ports(2)
    cmd = [interpreter(victim), "-m", "traceml_core.cli", "run", "--nproc-per-node=1", f"--logs-dir={logs}",
           f"--run-name={run}", f"--master-port={master}", f"--aggregator-port={agg}", SCRIPT, "--steps", "5"]
    env = victim.env(TMPDIR=str(victim.home), FAULT_PROGRESS_DIR=str(victim.home))
    t0 = time.monotonic()
    out = victim.run(cmd, env=env, timeout=RUN_TIMEOUT_S, check=False, umask=umask)
    return out, time.monotonic() - t0


@pytest.mark.parametrize("mode", [0o2775, 0o3775])
def test_a_link_planted_in_a_shared_logs_dir_never_becomes_the_run_directory(mode):
    with team("victim", "attack") as (group, users, work):
        victim, attacker = users["victim"], users["attack"]
        logs = shared_dir(work / "team-logs", victim.gid, mode)
        trap = attacker.home / "trap"
        attacker.python("import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777); "
                        "os.symlink(sys.argv[1], sys.argv[2])", str(trap), str(logs / "r1"))
        os.chmod(attacker.home, 0o755)  # the attacker lets the victim reach the trap

        out, _ = victim_run(victim, logs)
        assert out.returncode == 0, out.stderr[-3000:]
        assert list(trap.iterdir()) == [], list(trap.iterdir())      # nothing written through the link
        assert os.path.islink(logs / "r1")                             # the attacker's entry, untouched
        used = logs / "r1.2"
        summary = json.loads((used / "final_summary.json").read_text())
        st = os.lstat(used)
        assert st.st_uid == victim.uid and st.st_mode & 0o777 == 0o755
        note = f"{logs / 'r1'} is not used: it is a symbolic link"
        assert any(note in n and f"this run's files are in {used} instead" in n for n in summary["notes"]), \
            summary["notes"]
        assert note in out.stderr and "Traceback" not in out.stderr


def test_forged_and_unreadable_files_in_a_run_directory_never_stall_the_run_nor_enter_the_ledger():
    with team("victim", "attack") as (group, users, work):
        victim, attacker = users["victim"], users["attack"]
        logs = shared_dir(work / "team-logs", victim.gid, 0o2775)
        run = logs / "r1"
        # the victim's directory of an earlier run, as an older TraceML made it under umask 002
        victim.python(
            "import os, sys; r = sys.argv[1]; os.mkdir(r, 0o775)\n"
            "for n in ('attempt-0', 'attempt-1'): os.mkdir(os.path.join(r, n), 0o755)\n"
            "os.mkfifo(os.path.join(r, 'attempt-0', 'final_summary.json'))\n"
            "os.symlink('/dev/zero', os.path.join(r, 'attempt-1', 'final_summary.json'))\n"
            "os.mkfifo(os.path.join(r, 'aggregate.state'))\n", str(run), umask="002")
        assert os.lstat(run).st_mode & 0o777 == 0o775
        # the attacker's forged attempt of another job: 16 ranks for 90,006 s = 1,440,096 rank-seconds
        attacker.python(
            "import json, os, sys, time\n"
            "from traceml_core.codec import encode\n"
            "from traceml_core.report.goodput.ledger import AttemptLedger\n"
            "d = os.path.join(sys.argv[1], 'attempt-2'); os.mkdir(d, 0o755)\n"
            "end = time.time() - 600\n"
            "row = encode(AttemptLedger(job_id='424242', run_id='forged', start=end - 90006, end=end, slots=16,\n"
            "                    ended='completed'))\n"
            "json.dump({'schema_version': 1, 'run': {}, 'goodput': {'attempts': [row]}},\n"
            "          open(os.path.join(d, 'final_summary.json'), 'w'))\n", str(run))

        out, took = victim_run(victim, logs)
        assert out.returncode == 0, out.stderr[-3000:]
        err = out.stderr
        summary = json.loads((run / "final_summary.json").read_text())
        rows = summary["goodput"]["attempts"]
        assert all(r.get("job_id") != "424242" for r in rows), rows                      # not in the ledger
        assert len(rows) == 1 and summary["goodput"]["attempts"][-1]["run_id"] != "forged"
        # each refused file named, with what it is; the run neither waited on nor read any
        assert f"{run / 'aggregate.state'} is not read: it is a FIFO (named pipe)" in err, err[-3000:]
        assert len(list(run.glob("aggregate.state.refused-*"))) == 1
        assert f"{run / 'attempt-0' / 'final_summary.json'} is not read: it is a FIFO (named pipe)" in err
        assert f"{run / 'attempt-1' / 'final_summary.json'} is a symbolic link" in err
        assert f"{run / 'attempt-2'} is not read: it is owned by uid {attacker.uid}" in err
        assert "Traceback" not in err and "did not start" not in err
        # the run directory is the victim's alone from now on
        assert os.lstat(run).st_mode & 0o777 == 0o755
        print(f"run with 4 planted entries: {took:.1f} s")


def test_a_planted_tmpdir_never_leaves_the_dashboard_without_its_token():
    """Issue 34, finding 6: another user made ``$TMPDIR/traceml-<victim uid>`` first (the usual place
    of the dashboard's token file, in a shared ``/tmp``). Before the fix the log said "no file:
    TraceML could not write one" and the token was nowhere; now the file is in a fresh private
    directory, and the log says where and why."""
    import re
    import signal
    import subprocess
    import urllib.request

    from testports import free_port
    from tinyrun import TINY

    with team("victim", "attack") as (group, users, work):
        victim, attacker = users["victim"], users["attack"]
        tmp = shared_dir(work / "tmp", victim.gid, 0o1777)
        attacker.python("import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777)",
                        str(tmp / f"traceml-{victim.uid}"))
        log = victim.home / "job.out"
        with open(log, "w") as f:
            os.chown(log, victim.uid, victim.gid)
            os.chmod(log, 0o644)   # readable by others, as a job's output file usually is
            cmd = [interpreter(victim), "-m", "traceml_core.cli", "run", "--nproc-per-node=1", "--mode", "dashboard",
                   "--master-port", str(free_port()), "--aggregator-port", str(free_port()), "--logs-dir",
                   str(victim.home / "logs"), "--run-name", "dash", "--cluster", "none", str(TINY)]
            env = victim.env(TMPDIR=str(tmp), TINY_STEPS="100000", TINY_SLEEP_MS="5")
            p = subprocess.Popen(victim.argv() + cmd, env=env, stdout=f, stderr=f, cwd=str(victim.home))
        try:
            deadline = time.monotonic() + 120
            while "dashboard: " not in log.read_text():
                assert time.monotonic() < deadline and p.poll() is None, log.read_text()[-3000:]
                time.sleep(0.1)
            time.sleep(0.5)  # the note line after it
            text = log.read_text()
            m = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/) \(the address with its access token is in (\S+), "
                          r"readable only by you", text)
            assert m and "token=" not in text, text
            url_file = Path(m.group(2))
            assert not str(url_file).startswith(str(tmp / f"traceml-{victim.uid}") + "/"), url_file
            st = os.lstat(url_file)
            assert st.st_uid == victim.uid and stat.S_IMODE(st.st_mode) == 0o600
            assert os.lstat(url_file.parent).st_uid == victim.uid
            assert f"{tmp / f'traceml-{victim.uid}'} cannot be trusted: it is owned by uid {attacker.uid}" in text
            url = url_file.read_text().strip()
            assert url.startswith(m.group(1) + "?token=")
            with urllib.request.urlopen(url.replace("/?", "/api/live?"), timeout=10) as resp:
                assert resp.status == 200
            assert list((tmp / f"traceml-{victim.uid}").iterdir()) == []   # nothing left in the planted one
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
