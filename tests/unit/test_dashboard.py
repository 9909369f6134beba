"""``traceml run --mode dashboard`` in headless Chromium (Debian's ``chromium`` package).

One real run: two ranks of tests/unit/scripts/tiny_train.py; when the test says, rank 1 freezes
itself (SIGSTOP: its connection stays open and silent, and torchrun does not notice a stopped worker),
so the page must show live numbers for rank 0 and a stale rank 1 for as long as the test looks. Then
the test SIGKILLs rank 1 by pid and torchrun ends the run. (Rank 1 used to SIGKILL itself with
torchrun's worker check every 15 s; when that check came a moment after the death, torchrun stopped
rank 0 too and there was no moment with a dead rank 1 beside a live rank 0: a flaky test.) The
"connection lost" state of a dead rank is covered by tests/unit/test_live_snapshot.py. The browser
is driven over the DevTools protocol on a pipe (tests/unit/chromium.py). A screenshot is saved to ``artifacts/dashboard.png``.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest

from chromium import Chromium, chromium_path
from tinyrun import REPO, kill_frozen, start_tiny, stop

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="needs chromium (apt-get install chromium)")
ARTIFACTS = REPO / "artifacts"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def outward_ip():
    """An address of this machine that is not loopback (None when there is none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 9))  # no packet is sent for a UDP connect
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


@pytest.fixture
def run(tmp_path):
    # rank 1 freezes when the test says (the file below), after the charts were seen growing: on a
    # loaded machine the browser may take longer to start than a fixed step count lasts
    p = start_tiny(tmp_path, "dash", mode="dashboard", TINY_STEPS="40000", TINY_SLEEP_MS="5",
                   TINY_KILL_RANK="1", TINY_KILL_AT="100", TINY_KILL_WHEN=str(tmp_path / "kill-rank-1"),
                   TINY_KILL_SIGNAL="STOP", TINY_PIDFILE=str(tmp_path / "rank-1.pid"),
                   PET_MONITOR_INTERVAL="5")
    err_lines: list[str] = []
    out_chunks: list[str] = []
    url_seen = threading.Event()

    def drain_err():
        for line in p.stderr:
            err_lines.append(line)
            if "ssh -L " in line:  # the last of the dashboard lines
                url_seen.set()

    threads = [threading.Thread(target=drain_err, daemon=True),
               threading.Thread(target=lambda: out_chunks.append(p.stdout.read()), daemon=True)]
    for t in threads:
        t.start()
    assert url_seen.wait(60), "".join(err_lines)
    yield p, err_lines, out_chunks
    kill_frozen(tmp_path / "rank-1.pid")  # a stopped rank would not heed the launcher's SIGTERM
    stop(p)


def test_dashboard_needs_the_token_and_stays_on_loopback(run):
    p, err, _ = run
    text = "".join(err)
    url = re.search(r"dashboard: (http://127\.0\.0\.1:(\d+)/\?token=([\w-]+))", text)
    assert url, text
    full, port, token = url.group(1), int(url.group(2)), url.group(3)
    assert f"ssh -L {port}:127.0.0.1:{port} " in text, "the tunnel command is printed"
    base = f"http://127.0.0.1:{port}"
    for bad in ("/", "/?token=", f"/?token={token[:-1]}", f"/?token={token}x", "/api/live",
                f"/api/live?tok={token}"):
        code, body = get(base + bad)
        assert code == 403, (bad, code)
        assert b"token" in body and token.encode() not in body
    code, page = get(full)
    assert code == 200 and b"TraceML live" in page and b"uPlot" in page
    assert b"<script src=" not in page and b"https://" not in page.replace(b"https://github.com", b""), \
        "nothing is loaded from elsewhere at runtime"
    code, body = get(f"{base}/api/live?token={token}")
    assert code == 200 and "history" in json.loads(body)
    ip = outward_ip()
    if ip is not None:
        with pytest.raises(OSError):
            socket.create_connection((ip, port), timeout=2).close()


def test_dashboard_in_chromium_updates_and_shows_a_dead_rank(run, tmp_path):
    p, err, out = run
    url = re.search(r"dashboard: (http://\S+)", "".join(err)).group(1)
    browser = Chromium(tmp_path / "chromium-profile")
    try:
        browser.open(url)
        browser.wait_for("document.querySelectorAll('#ranks tbody tr').length == 2", 30)
        points = "Number(document.getElementById('c-step').dataset.points)"
        first = browser.wait_for(f"{points} > 0 && {points}", 30)
        updates = browser.eval("Number(document.body.dataset.updates)")
        browser.wait_for(f"{points} > {first} + 20", 20)  # charts grow as telemetry arrives
        assert browser.eval("Number(document.body.dataset.updates)") > updates
        (tmp_path / "kill-rank-1").touch()
        assert browser.eval("document.querySelectorAll('#c-step canvas, #c-rate canvas').length") >= 2
        assert browser.eval("document.querySelectorAll('#c-own canvas, #c-phases canvas').length") == 2
        # phases over time: one line per measured phase; memory and time axes start at 0
        assert browser.eval("Number(document.getElementById('c-phases').dataset.series)") >= 4
        for cid in ("c-mem", "c-step", "c-own"):
            assert browser.eval(f"TraceCharts.registry['{cid}'].plot.scales.y.min") == 0, cid
        # rank 1 froze at step >= 100: its row turns stale and the count of its silence grows,
        # while rank 0 is still live (one look at the page, so both hold at the same moment)
        stale = browser.wait_for(
            "(() => { const t = document.getElementById('stale').textContent;"
            " const m = t.match(/rank 1: no data for ([\\d.]+) s/);"
            " const r0 = document.querySelector(\"tr[data-rank='0']\").dataset.state;"
            " const r1 = document.querySelector(\"tr[data-rank='1']\").className;"
            " return m && Number(m[1]) >= 5 && r0 === 'ok' && r1 === 'stale' && t; })()", 60)
        assert "rank 0" not in stale
        shot = browser.screenshot(ARTIFACTS / "dashboard.png")
        assert shot.stat().st_size > 20_000
        # rank 1 dies; the run ends (torchrun notices): the page says so instead of freezing
        assert kill_frozen(tmp_path / "rank-1.pid"), "rank 1 never froze itself"
        p.wait(timeout=60)
        browser.wait_for("document.getElementById('banner').textContent.includes('Lost contact')", 15)
    finally:
        browser.close()
    assert p.returncode != 0
    assert "TraceML summary:" in "".join(out)


def test_dashboard_shows_the_straggler_above_the_others(tmp_path):
    """examples/straggler.py with rank 2 30 ms slower: under DDP the step-time lines overlap,
    the own-time chart puts rank 2 above the others and names it the culprit."""
    from tinyrun import env_for, traceml_cmd
    import subprocess

    script = REPO / "examples" / "straggler.py"
    cmd = traceml_cmd(tmp_path, "dash-strag", mode="dashboard", nproc=3, script=script,
                      args=["--steps", "700"])
    p = subprocess.Popen(cmd, env=env_for(STRAGGLER_RANK="2", STRAGGLER_DELAY_MS="30"), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO))
    err_lines: list[str] = []
    seen = threading.Event()

    def drain():
        for line in p.stderr:
            err_lines.append(line)
            if "ssh -L " in line:
                seen.set()

    threading.Thread(target=drain, daemon=True).start()
    threading.Thread(target=lambda: p.stdout.read(), daemon=True).start()
    browser = None
    try:
        assert seen.wait(90), "".join(err_lines)
        url = re.search(r"dashboard: (http://\S+)", "".join(err_lines)).group(1)
        browser = Chromium(tmp_path / "chromium-strag")
        browser.open(url)
        labels = browser.wait_for(
            "(() => { const c = TraceCharts.registry['c-own']; return c && c.labels.length === 3 &&"
            " c.labels.includes('rank 2 (culprit)') && c.labels; })()", 90)
        assert labels == ["rank 0", "rank 1", "rank 2 (culprit)"]
        means = browser.eval("TraceCharts.seriesMeans('c-own')")
        assert means[2] > 3 * max(means[0], means[1]), means
        step = browser.eval("TraceCharts.seriesMeans('c-step')")
        assert max(step) < 1.5 * min(step), step  # lockstep: the step time cannot show it
        browser.screenshot(ARTIFACTS / "dashboard-straggler.png")
    finally:
        if browser is not None:
            browser.close()
        stop(p)
