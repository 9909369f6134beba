"""The hang report's reading of ranks whose stack could not be taken (report/hang.py); the real
runs are tests/slurm/test_headline_slurm.py (a SIGSTOPped rank on node 2) and
tests/faults/test_hang_autopsy.py."""

from __future__ import annotations

from traceml_core.launcher.stacks import STOPPED
from traceml_core.report.hang import build

BACKWARD = ('Current thread 0x1 (most recent call first):\n'
            '  File "/v/site-packages/torch/autograd/graph.py", line 9 in _engine_run_backward\n'
            '  File "/v/site-packages/torch/autograd/__init__.py", line 3 in backward\n'
            '  File "/home/u/train.py", line 61 in main\n'
            '  File "/home/u/train.py", line 88 in <module>\n')


def _report(last: dict) -> dict:
    rows = [{"rank": r, "node": r // 2, "host": f"n{r // 2}", "step": 40,
             "dump": {"ok": True, "text": BACKWARD, "error": None}} for r in range(3)]
    rows.append({"rank": 3, "node": 1, "host": "n1", "step": 40, "dump": last})
    return build(rows, world=4, silent_s=61.0, threshold_s=60.0, threshold_source="auto", at=0.0)


def test_a_stopped_rank_is_the_one_the_others_wait_for():
    """Issue 27, finding 6: it said "no rank's stack could be read" (ranks 0-2 were read)."""
    h = _report({"ok": False, "text": "", "stopped": True, "error": STOPPED})
    assert h["culprits"] == [3]
    assert h["finding"] == ("rank 3 (node 1, n1) never arrived at the collective the others wait in (the "
                            "gradient all-reduce (DDP backward)): its process is stopped (SIGSTOP, Ctrl-Z, "
                            "or a debugger holds it), so it runs nothing"), h["finding"]
    assert [a["state"] for a in h["ranks"]] == ["collective"] * 3 + ["stopped"]


def test_a_rank_without_a_stack_beside_ranks_waiting_in_one_collective_never_arrived():
    h = _report({"ok": False, "text": "", "error": "no dump within 3 s"})
    assert h["culprits"] == [3]
    assert h["finding"] == ("ranks 0-2 wait in the gradient all-reduce (DDP backward); rank 3 (node 1, n1) "
                            "never arrived at it, and no stack could be read from it"), h["finding"]


def test_a_stopped_rank_is_reported_and_not_left_a_dump_signal_to_run_when_continued():
    """A signal sent to a stopped process waits; the dump would run the moment it is continued,
    with all its threads resuming at once (CI: a rank SIGSTOPped, reported, continued, crashed with
    SIGSEGV in faulthandler's all-threads dump). So a stopped rank is reported without one."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from traceml_core.launcher.stacks import StackCollector, stopped
    from traceml_core.sdk.stackdump import dump_signal, stack_file

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    col = StackCollector()
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not stopped(proc.pid):
            assert time.monotonic() < deadline, "the child never read as stopped"
            time.sleep(0.05)
        stack_file(col.dir, 0).write_bytes(b"")   # as a rank that registered its dump has
        got = col.collect({0: proc.pid}, timeout=1.0)[0]
        assert got["stopped"] and got["error"] == STOPPED and not got["ok"], got
        status = dict(line.split(":", 1) for line in open(f"/proc/{proc.pid}/status").read().splitlines() if ":" in line)
        pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
        assert not pending & (1 << (dump_signal() - 1)), f"a dump signal waits: {pending:#x}"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)
        col.close()
