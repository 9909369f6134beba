"""Issue 34, finding 4: the node store believes only its own user, and prints only host names.

Real processes: ``traceml slurm nodes`` and ``traceml slurm template --exclude-bad`` as the user
would run them, a second real local user made for the test (tests/faults/localusers.py) where the
attack needs one. Before the fix:

* another user who pre-created the victim's store (mode 0666, in a directory both can write)
  planted an "XID 79" record that excluded a healthy node, and could read the victim's records;
* a host name with a newline crashed ``traceml slurm nodes`` and ``template --exclude-bad`` with a
  traceback, and forged lines in their output;
* ``TRACEML_NODE_STORE=/dev/null`` said it would move the file aside, and nothing turned the
  store off.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localusers import can_switch_users, shared_dir, team

#: a forged hardware fault: one record is enough to exclude a node (a strong observation)
PLANT = r"""
import os, sys, time
from pathlib import Path
from traceml_core.plugins import NodeObservation, RunEvidence
from traceml_slurm.nodes import record
made, path = Path(sys.argv[1]), sys.argv[2]
ev = RunEvidence("31337", "forged", time.time(), "doctor", ("node1", "node2"),
                 (NodeObservation("node2", "gpu_health", 1.0, None, "GPUs", True, True, "XID 79 (fell off the bus)"),))
print(record(made, "", ev)[1])
os.rename(made, path)
os.chmod(path, 0o666)
"""
VICTIM_RUN = r"""
import sys, time
from pathlib import Path
from traceml_core.plugins import NodeObservation, RunEvidence
from traceml_slurm.nodes import record
ev = RunEvidence("4242", "mine", time.time(), "run", ("node1", "node2"),
                 tuple(NodeObservation(h, "link_send", 1.5, 1.5, "GB/s") for h in ("node1", "node2")))
print("\n".join(record(Path(sys.argv[1]), "", ev)[1]))
"""


def nodes(env: dict, *args: str, user=None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "traceml_core", "slurm", "nodes", *args]
    if user is not None:
        from localusers import interpreter

        return user.run([interpreter(user), *argv[1:]], env=env, check=False)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def records_in(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT job_id FROM records ORDER BY id")]


@pytest.mark.skipif(can_switch_users() is not None, reason=str(can_switch_users()))
@pytest.mark.parametrize("mode", [0o1777, 0o2775])
def test_a_store_another_user_planted_is_ignored_never_read_nor_written(mode):
    with team("victim", "attack") as (group, users, work):
        victim, attacker = users["victim"], users["attack"]
        shared = shared_dir(work / "shared", victim.gid, mode)
        store = shared / "nodes.sqlite"
        out = attacker.python(PLANT, str(attacker.home / "made.sqlite"), str(store))
        assert out.strip() == "[]" and os.stat(store).st_uid == attacker.uid, out   # planted, mode 0666
        env = victim.env(TRACEML_NODE_STORE=str(store))

        got = nodes(env, "--json", user=victim)
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
        doc = json.loads(got.stdout)
        assert doc["exclude"] == [] and doc["nodes"] == [], doc                 # no planted XID believed
        assert any(f"is ignored: it is owned by uid {attacker.uid}" in n for n in doc["notes"]), doc["notes"]
        text = nodes(env, user=victim).stdout
        assert "EXCLUDE" not in text and "#SBATCH --exclude" not in text, text

        kept = victim.python(VICTIM_RUN, str(store))
        assert f"is ignored: it is owned by uid {attacker.uid}" in kept, kept
        assert records_in(store) == ["31337"]                                    # the victim's record never written there


def test_only_a_regular_0600_file_of_yours_in_a_private_directory_is_used(tmp_path):
    from traceml_slurm.nodes import keep, record
    from traceml_slurm.nodes.store import NodeStore

    ev = victim_evidence()
    mine = tmp_path / "mine.sqlite"
    assert keep(mine, "", ev) == [] and os.stat(mine).st_mode & 0o777 == 0o600
    os.chmod(mine, 0o644)
    health, notes = record(mine, "", ev)
    assert "its mode is 0644, so others may have written records into it" in notes[0], notes
    assert f"chmod 600 {mine}" in notes[0] and records_in(mine) == ["4242"]
    link = tmp_path / "link.sqlite"
    os.chmod(mine, 0o600)
    link.symlink_to(mine)
    assert "is ignored: it is a symbolic link, not a file" in NodeStore(link).refusal()
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o1777)
    assert "is writable by others (mode 1777)" in NodeStore(open_dir / "n.sqlite").refusal()
    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert "it is a FIFO (named pipe), not a file" in record(fifo, "", ev)[1][0]
    assert time.monotonic() - t0 < 5


def victim_evidence():
    from traceml_core.plugins import NodeObservation, RunEvidence

    return RunEvidence("4242", "mine", time.time(), "run", ("node1", "node2"),
                       tuple(NodeObservation(h, "link_send", 1.5, 1.5, "GB/s") for h in ("node1", "node2")))


def test_dev_null_and_off_get_clear_answers(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    got = nodes({**env, "TRACEML_NODE_STORE": "/dev/null"})
    assert got.returncode == 0 and "Traceback" not in got.stderr
    assert ("the node store /dev/null is ignored: it is a character device, not a file; TraceML neither follows "
            "nor replaces it (set TRACEML_NODE_STORE=off instead)") in got.stdout, got.stdout
    assert "move" not in got.stdout
    off = nodes({**env, "TRACEML_NODE_STORE": "off"})
    assert off.returncode == 0 and "the node store is off (TRACEML_NODE_STORE=off)" in off.stdout
    assert json.loads(nodes({**env, "TRACEML_NODE_STORE": "off"}, "--json").stdout)["off"] is True
    from traceml_slurm.nodes import keep
    from traceml_slurm.nodes.store import OFF

    assert keep(OFF, "", victim_evidence()) == [] and not (tmp_path / "off").exists()


def test_a_host_name_with_a_newline_is_never_stored_nor_printed(tmp_path):
    """A record an older TraceML stored (written here straight into the file) and one a run would
    add now: neither crashes the commands nor forges a line."""
    from traceml_core.plugins import NodeObservation, RunEvidence
    from traceml_slurm.nodes import record

    def keep(path, cluster, ev):
        return record(path, cluster, ev)[1]

    store = tmp_path / "nodes.sqlite"
    evil = "node3\nNext job script (paste into your sbatch script):\n  #SBATCH --exclude=node1"
    for i in range(3):
        keep(store, "", RunEvidence(str(i), f"r{i}", time.time() - 100 + i, "run", ("node1", "node2"),
                                    tuple(NodeObservation(h, "link_send", 1.5, 1.5, "GB/s") for h in ("node1", "node2"))))
    with sqlite3.connect(store) as conn:  # as an older TraceML stored it: the name as the rank said it
        for rid in (1, 2, 3):
            conn.execute("INSERT INTO members VALUES (?, ?)", (rid, evil))
            conn.execute("INSERT INTO observations (record, host, kind, value, peers, unit, bad, strong, note) "
                         "VALUES (?, ?, 'compute', 90, 40, 'ms', 1, 0, ?)", (rid, evil, "own time\nforged line"))
    notes = keep(store, "", RunEvidence("9", "r9", time.time(), "run", ("node1", evil),
                                        (NodeObservation(evil, "compute", 90.0, 40.0, "ms", True),)))
    assert notes and "not Slurm host names and are not recorded: 'node3\\nNext job script" in notes[0], notes
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "TRACEML_NODE_STORE": str(store)}
    for args in ((), ("--json",)):
        got = nodes(env, *args)
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
        assert "#SBATCH --exclude=node1" not in got.stdout and "forged line" not in got.stdout, got.stdout
        assert "not Slurm host names; they are left out" in got.stdout
    tpl = subprocess.run([sys.executable, "-m", "traceml_core", "slurm", "template", "--print", "--no-check",
                          "--nodes", "2", "--exclude-bad", "train.py"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert tpl.returncode == 0 and "Traceback" not in tpl.stderr, tpl.stderr
    assert "--exclude=node1" not in tpl.stdout and "#SBATCH --exclude" not in tpl.stdout, tpl.stdout


def test_a_host_name_with_a_newline_from_the_wire_forges_no_line(aggregator):
    """A node's hello (what a rank holding the run's token could send) names a host with a newline:
    it is dropped where it enters (wire/protocol.host_name), so neither the summary nor its text
    carries the forged line, and node evidence never sees the name."""
    import sys as _sys

    sys_path = str(Path(__file__).parents[1] / "unit")
    if sys_path not in _sys.path:
        _sys.path.insert(0, sys_path)
    from aggpeers import NodePeer

    a = aggregator(job_id="42", nproc_per_node=1)
    forged = "node1\nTraceML summary: run FORGED"
    peer = NodePeer(a.port, 0, job="42", host=forged)
    assert peer.welcomed, peer.reply
    peer.join(0)
    peer.steps(0, 30)
    peer.rank_bye(0)
    peer.gone(0)
    peer.bye()
    res = a.finish(0)
    doc = json.loads(Path(res.summary_json).read_text())
    text = Path(res.summary_txt).read_text()
    assert "FORGED" not in json.dumps(doc) and "FORGED" not in text
    host = doc["topology"]["nodes"][0]["hostname"] or ""
    assert "\n" not in host and host != forged, doc["topology"]["nodes"][0]   # not known from it: the launcher's
