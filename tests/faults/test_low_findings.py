"""Issue 27, finding 7 (LOW), on loopback with the real aggregator, relay and launcher: a rank's
hello cannot rename its node's host; the dashboard's token is not written where others can read
it. (The move to the fallback logs directory, logged when it happens, is asserted in
test_logs_dir_faults.py, which fills a real tmpfs mid-run.)"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import time
import urllib.request
from pathlib import Path

from aggpeers import RUN, TOKEN, RankPeer
from traceml_core.wire.auth import make_hello, relay_aud

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from tinyrun import REPO, env_for, stop, traceml_cmd  # noqa: E402


def test_a_ranks_hello_cannot_rename_its_node(rig):
    r = rig(nnodes=1, nproc_per_node=2)
    liar = RankPeer(r.port, 0, hello=False)
    liar.send(make_hello(TOKEN, aud=relay_aud(0), run=RUN, job="42", node=0, rank=0, kind="rank",
                         host="someone-elses-node"))
    assert liar.recv()["t"] == "welcome"
    liar.rank = 0
    liar.steps(10)
    liar.bye("error", error="Traceback (most recent call last):\nRuntimeError: boom")
    honest = RankPeer(r.port, 1)
    honest.steps(10)
    honest.bye()
    s = json.loads(r.finish(1).summary_json.read_text())
    assert [x["host"] for x in s["ranks"]] == ["host0", "host0"], s["ranks"]
    assert s["topology"]["nodes"][0]["hostname"] == "host0"
    assert "someone-elses-node" not in json.dumps(s)
    assert s["verdict"]["culprit"] == {"rank": 0, "node": 0, "host": "host0"}, s["verdict"]


def test_the_dashboard_token_stays_out_of_a_log_others_can_read(tmp_path):
    """The launcher's log is a file readable by others (mode 0644, as a Slurm job's output file
    usually is): the address is printed without its token, which goes to a 0600 file instead,
    and that address works."""
    err = tmp_path / "job.out"
    with open(err, "w") as f:
        os.chmod(err, 0o644)
        p = __import__("subprocess").Popen(
            traceml_cmd(tmp_path / "logs", "dash", mode="dashboard", nproc=1),
            env=env_for(TINY_STEPS="100000", TINY_SLEEP_MS="5"), stdout=f, stderr=f, cwd=str(REPO))
        try:
            deadline = time.monotonic() + 90
            while "dashboard: " not in err.read_text():
                assert time.monotonic() < deadline and p.poll() is None, err.read_text()[-3000:]
                time.sleep(0.1)
            text = err.read_text()
            assert "token=" not in text, text
            m = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/) \(the address with its access token is "
                          r"in (\S+), readable only by you; it is not printed here because (\S+) is "
                          r"readable by others \(mode 0644", text)
            assert m and m.group(3) == str(err), text
            url_file = Path(m.group(2))
            assert stat.S_IMODE(url_file.stat().st_mode) == 0o600 and url_file.stat().st_uid == os.getuid()
            url = url_file.read_text().strip()
            assert url.startswith(m.group(1) + "?token=")
            with urllib.request.urlopen(url.replace("/?", "/api/live?"), timeout=10) as resp:
                assert resp.status == 200 and "history" in json.loads(resp.read())
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            stop(p)


def test_where_the_token_may_be_printed():
    from traceml_core.views.dashboard import token_exposure

    r, w = os.pipe()
    try:
        assert token_exposure(w, "none") is None            # the user's own pipe (| tee)
        assert "job's output file" in token_exposure(w, "slurm")  # srun's pipe to the output file
    finally:
        os.close(r)
        os.close(w)
