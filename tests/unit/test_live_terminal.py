"""``traceml run --mode cli`` in a real terminal (tmux) and with stdout piped (status lines).

tmux gives the launcher a real pseudo-terminal of 160x50; ``capture-pane`` reads the screen as a
user would see it. Each test uses its own tmux server (``-L`` socket named after this process)
and kills only that server. Needs the Debian package ``tmux``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time

import pytest

from tinyrun import REPO, env_for, kill_frozen, start_tiny, stop, traceml_cmd

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")


class Tmux:
    def __init__(self, tmp_path, name: str) -> None:
        self.sock = f"traceml-test-{os.getpid()}-{name}"
        self.name = name
        self.tmp = tmp_path

    def tmux(self, *args: str, check: bool = True) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              check=check, timeout=10).stdout

    def start(self, cmd: list[str], env: dict[str, str], size: tuple[int, int] = (160, 50)) -> None:
        # the pane keeps its screen after the command ends, so the end can be read too
        line = (f"cd {shlex.quote(str(REPO))} && env -i " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                + " " + shlex.join(cmd) + "; echo TRACEML-EXIT $?; sleep 600")
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", self.name, "-x", str(size[0]),
                  "-y", str(size[1]), line)

    def screen(self, history: int = 0) -> str:
        args = ["capture-pane", "-p", "-t", self.name]
        if history:
            args += ["-S", f"-{history}"]
        return self.tmux(*args, check=False)

    def wait(self, pred, timeout: float, what: str, history: int = 0):
        end = time.monotonic() + timeout
        text = ""
        while time.monotonic() < end:
            text = self.screen(history)
            got = pred(text)
            if got:
                return got
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{text}")

    def kill(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def tmux(tmp_path, request):
    # unique per test and parameter (a cut name made two parameters share one tmux server, and
    # under load the first's server was still going when the second asked for the same session)
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    t = Tmux(tmp_path, re.sub(r"\W", "", request.node.name)[:22] + digest)
    yield t
    t.kill()


ROW = re.compile(r"^\s+(\d+)\s+\S+:\d+\s+(.+?)\s{2,}(\d+|-)\s")


def rank_rows(screen: str) -> dict[int, tuple[str, int]]:
    """The live table's rows by rank: (status cell, step), from the last drawing on the screen."""
    rows: dict[int, tuple[str, int]] = {}
    for line in screen.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (m.group(2), -1 if m.group(3) == "-" else int(m.group(3)))
    return rows


def test_cli_view_shows_each_rank_updates_and_keeps_training_output(tmux, tmp_path):
    env = env_for(TINY_STEPS="500", TINY_SLEEP_MS="10", TINY_PRINT_EVERY="100", TERM="xterm-256color")
    tmux.start(traceml_cmd(tmp_path, "live-tmux", mode="cli"), env)

    def two_running_ranks(s):
        rows = rank_rows(s)
        return rows if "steps/s" in s and len(rows) == 2 and \
            all(st.startswith("ok ") and step > 0 for st, step in rows.values()) else None

    first = tmux.wait(two_running_ranks, 60, "both ranks running in the live table")
    later = tmux.wait(lambda s: (r := two_running_ranks(s)) and all(r[k][1] > first[k][1] + 20 for k in r) and r,
                      20, "the step counts to advance")
    assert later, "the table redraws with new numbers"
    screen = tmux.screen()
    assert "TraceML live" in screen and "run live-tmux" in screen
    assert re.search(r"node 0 \(\S+\):\s+cpu \d+%", screen), screen
    tmux.wait(lambda s: "tiny: rank 0 step 100" in s, 30, "training output above the view", history=300)

    end = tmux.wait(lambda s: "TRACEML-EXIT" in s and s, 60, "the run to end", history=400)
    assert "TRACEML-EXIT 0" in end
    final = rank_rows(end[:end.index("TraceML summary:")])
    assert final == {0: ("ended clean", 500), 1: ("ended clean", 500)}, "the last drawing shows the end"
    assert end.index("tiny: done 500 steps") < end.index("TraceML summary:")


NUMBER = re.compile(r"^(-|\d+|\d+\.\d+|\d+\.\d+s|\d+(\.\d)?[KMG]|\d+B)$")


def test_cli_view_fits_a_small_terminal_without_cutting_numbers(tmux, tmp_path):
    """At 100x30, and at 80x24 once the terminal is resized under the running view, the table
    drops whole columns by priority (and says which), never cuts a header or a number ("0..."),
    and every line fits the width. (One run for both sizes: the view reads the terminal's size
    at each redraw.)"""
    env = env_for(TINY_STEPS="3000", TINY_SLEEP_MS="5", TERM="xterm-256color")
    tmux.start(traceml_cmd(tmp_path, "narrow", mode="cli"), env, (100, 30))

    def table(width):
        def latest(s):
            lines = s.splitlines()
            head = [i for i, ln in enumerate(lines) if ln.split()[:1] == ["rank"] and "step" in ln]
            if not head:
                return None
            cols = lines[head[-1]].replace("step ms", "step_ms").split()
            rows = [dict(zip(cols, ln.split())) for ln in lines[head[-1] + 2:head[-1] + 4]]
            if len(rows) < 2 or [(r.get("rank"), r.get("status")) for r in rows] != [("0", "ok"), ("1", "ok")]:
                return None
            if any(len(ln.rstrip()) > width for ln in lines[head[-1]:]):
                return None
            return lines, head[-1], cols, [ln.split() for ln in lines[head[-1] + 2:head[-1] + 4]]
        return latest

    seen = {}
    for width, height in ((100, 30), (80, 24)):
        if width != 100:
            # the user shrinks the terminal; the pane is then cleared (as Ctrl-L would), so what is
            # read below is only what the view drew at the new size
            tmux.tmux("resize-window", "-t", tmux.name, "-x", str(width), "-y", str(height))
            tmux.tmux("send-keys", "-t", tmux.name, "-R")
            tmux.tmux("clear-history", "-t", tmux.name)
        lines, head, cols, rows = tmux.wait(table(width), 60, f"both ranks running in the {width}x{height} table")
        seen[width] = cols
        screen = "\n".join(lines)
        assert "\u2026" not in screen and "..." not in screen, screen
        assert all(len(ln.rstrip()) <= width for ln in lines), screen
        assert {"rank", "status", "step", "steps/s", "step_ms", "own", "input", "fwd", "bwd"} <= set(cols), cols
        for r in rows:  # every cell whole: the status word, a host:rank, or a whole number
            assert len(r) == len(cols), (cols, r)
            cell = dict(zip(cols, r))
            assert all(NUMBER.match(v) for k, v in cell.items() if k not in ("status", "where")), (cols, r)
            assert int(cell["step"]) > 0 and float(cell["step_ms"]) >= 5.0  # a step sleeps 5 ms
        below = "\n".join(lines[head:])   # this drawing's own note, under its table
        assert "too narrow for:" in below and "recent steps" in below.split("too narrow for:")[1], below
    print(f"columns at 100: {seen[100]}; at 80: {seen[80]}")
    assert set(seen[80]) <= set(seen[100])
    end = tmux.wait(lambda s: "TRACEML-EXIT" in s and s, 90, "the run to end", history=400)
    assert "TRACEML-EXIT 0" in end


def test_a_silent_rank_shows_as_stale_while_the_others_go_on_and_its_death_ends_the_run(tmux, tmp_path):
    # rank 1 freezes itself at step 60 (SIGSTOP: its connection stays open and silent, and torchrun
    # does not notice a stopped worker); rank 0 goes on (no collectives). That is a hung rank, which
    # the view must make visible for as long as it lasts. Then the test SIGKILLs rank 1 and
    # torchrun ends the run. (A rank that SIGKILLed itself raced torchrun's worker check: when the
    # check came soon after the death the run ended before the view could show it.)
    pidfile = tmp_path / "rank-1.pid"
    env = env_for(TINY_STEPS="6000", TINY_SLEEP_MS="5", TINY_KILL_RANK="1", TINY_KILL_AT="60",
                  TINY_KILL_SIGNAL="STOP", TINY_PIDFILE=str(pidfile), PET_MONITOR_INTERVAL="5",
                  TERM="xterm-256color")
    tmux.start(traceml_cmd(tmp_path, "live-kill", mode="cli"), env)
    try:
        def silent_rank_visible(s):
            rows = rank_rows(s)
            m = re.search(r"^rank 1: no data for ([\d.]+) s", s, re.M)
            if m and float(m.group(1)) >= 3 and rows.get(0, ("",))[0].startswith("ok ") and \
                    rows.get(1, ("",))[0].startswith("no data "):
                return rows
            return None

        rows = tmux.wait(silent_rank_visible, 90, "rank 1 to show as stale while rank 0 is ok")
        step0 = rows[0][1]
        assert rows[1][1] <= 60 < step0, rows
        # still redrawn, not frozen: rank 1's silence keeps growing while rank 0 advances
        tmux.wait(lambda s: (r := rank_rows(s)) and r.get(0, ("", 0))[1] > step0 and
                  re.search(r"^rank 1: .*no data for ([4-9]|\d\d)", s, re.M), 15, "the view to keep updating")
    finally:
        kill_frozen(pidfile)
    end = tmux.wait(lambda s: "TRACEML-EXIT" in s and s, 60, "torchrun to end the run", history=400)
    assert "TRACEML-EXIT 0" not in end
    assert re.search(r"rank 1 \(node 0, \S+\) crashed", end), end[-2500:]


def test_status_lines_when_stdout_is_not_a_terminal(tmp_path):
    p = start_tiny(tmp_path, "live-lines", mode="cli", TINY_STEPS="300", TINY_SLEEP_MS="10",
                   TINY_PRINT_EVERY="100", TRACEML_STATUS_INTERVAL="1")
    try:
        out, err = p.communicate(timeout=120)
    finally:
        stop(p)
    assert p.returncode == 0, err[-3000:]
    assert "\x1b[" not in out, "no terminal control codes in a log"
    lines = [ln for ln in out.splitlines() if ln.startswith("[traceml] ")]
    running = [ln for ln in lines if re.search(r"\| step \d+ \| ranks 2/2 running \| [\d.]+ ms/step \(worst rank \d", ln)]
    assert len(running) >= 2, out
    steps = [int(re.search(r"\| step (\d+) \|", ln).group(1)) for ln in running]
    assert steps == sorted(steps) and steps[-1] > steps[0], "each line reports progress"
    # speed per rank (~1 step per 10+ ms: under 100/s), never the sum over the two ranks
    # (a line written when each rank had sent one step has no rate yet: not measured, not shown)
    rates = [float(m.group(1)) for ln in running if (m := re.search(r"\| ([\d.]+) steps/s per rank", ln))]
    assert rates and all(0 < r < 100 for r in rates), running
    fields = [ln.split(" | ") for ln in lines if ln.count(" | ") >= 2]
    assert all(f[2].startswith("ranks ") and not f[2].endswith(" ok") for f in fields), \
        "each rank counted once, by what it is doing (no 'ranks 0/2 ok' after a clean end)"
    assert all(len(ln) < 300 for ln in lines), "compact"
    assert "tiny: rank 0 step 100" in out, "training output goes through untouched"
    assert out.index("tiny: done 300 steps") < out.index("TraceML summary:")
    assert "live status every 1 s" in err


def test_live_modes_are_refused_for_multi_node_runs():
    for mode in ("cli", "dashboard"):
        r = subprocess.run(
            [*traceml_cmd(REPO / "logs-unused", "x", mode=mode)[:4], "--mode", mode, "--nnodes", "2",
             "--node-rank", "0", "--master-addr", "10.11.12.13", "--cluster", "none", "train.py"],
            env=env_for(), capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (r.stdout, r.stderr)
        msg = r.stderr.strip()
        assert "Traceback" not in msg and "\n" not in msg, msg
        assert f"--mode={mode}" in msg and "single node" in msg and "2 nodes" in msg, msg
        assert "--mode=summary" in msg, "the message says what to use instead"
