"""Issue 27, finding 4: two runs with one ``--run-name`` and logs directory, against real
aggregator processes on loopback (the whole case, with two Slurm jobs, is in
tests/slurm/test_faults_slurm.py).

Before the fix both runs wrote into one directory, and an aggregator restarted with the other
run's checkpoint went on from it ("9,037 of 9,037, none lost" for a run that produced 2,400).
"""

from __future__ import annotations

import json
from pathlib import Path

from aggpeers import RUN, NodePeer


def feed(h, job: str, records: int) -> None:
    """A node that sends ``records`` records of rank 0 and says goodbye."""
    peer = NodePeer(h.port, 0, job=job)
    assert peer.welcomed, peer.reply
    peer.join(0)
    peer.steps(0, records)
    peer.rank_bye(0)
    peer.gone(0)
    peer.bye()


def summary(result) -> dict:
    assert result.summary_json is not None, result
    return json.loads(Path(result.summary_json).read_text())


def test_a_restarted_aggregator_never_resumes_another_jobs_checkpoint(aggregator, tmp_path):
    a = aggregator(job_id="100", nproc_per_node=1)
    feed(a, "100", 50)
    assert summary(a.finish(0))["telemetry"]["records_received"] == 50
    ckpt = a.run_dir / "aggregate.state"
    # job 200, same run name and logs directory, restarted by its launcher with the checkpoint
    # it finds there: job 100's
    b = aggregator(job_id="200", nproc_per_node=1, resume_from=str(ckpt))
    feed(b, "200", 10)
    s = summary(b.finish(0))
    assert s["telemetry"]["records_received"] == 10, s["telemetry"]
    assert s["ranks"][0]["telemetry"]["received"] == 10 and s["run"]["job_id"] == "200"


def test_two_live_runs_with_one_name_get_two_directories(aggregator, tmp_path):
    wanted = tmp_path / "logs" / RUN
    a = aggregator(job_id="100", nproc_per_node=1)
    assert a.run_dir == wanted and a.run_dir_note is None
    b = aggregator(job_id="200", nproc_per_node=1)  # while job 100 runs
    assert b.run_dir == wanted.with_name(f"{RUN}.200"), b.run_dir
    assert b.run_dir_note and f"{wanted} belongs to another run that is still going (job 100" in b.run_dir_note
    assert f"this run's files are in {b.run_dir} instead" in b.run_dir_note
    feed(a, "100", 30)
    feed(b, "200", 20)
    sa, sb = summary(a.finish(0)), summary(b.finish(0))
    assert (sa["run"]["job_id"], sa["telemetry"]["records_received"]) == ("100", 30)
    assert (sb["run"]["job_id"], sb["telemetry"]["records_received"]) == ("200", 20)
    assert sa["files"]["json"] == str(wanted / "final_summary.json")
    assert sb["files"]["json"] == str(b.run_dir / "final_summary.json")
    assert any("belongs to another run that is still going (job 100" in n for n in sb["notes"]), sb["notes"]
    # both ended: a later run of that name writes where it is asked to, as before
    c = aggregator(job_id="300", nproc_per_node=1)
    assert c.run_dir == wanted and c.run_dir_note is None
    feed(c, "300", 5)
    assert summary(c.finish(0))["telemetry"]["records_received"] == 5


def test_a_dead_runs_claim_is_taken_over_and_a_restart_takes_its_own_back(aggregator, tmp_path):
    wanted = tmp_path / "logs" / RUN
    a = aggregator(job_id="100", nproc_per_node=1)
    a.kill()  # SIGKILL: its claim is never ended, but its process is gone
    b = aggregator(job_id="200", nproc_per_node=1)
    assert b.run_dir == wanted and b.run_dir_note is None
    b.kill()
    # job 200's launcher restarts its aggregator (the same run id): its own directory, no note
    again = aggregator(**{**b.settings.model_dump(), "port": 0,
                          "resume_from": str(wanted / "aggregate.state")})
    assert again.run_dir == wanted and again.run_dir_note is None


def test_a_requeue_that_restarts_on_other_nodes_at_once_continues_the_same_run(aggregator, tmp_path):
    """Issue 34, finding 6: node 0 of job 77 is lost (its aggregator SIGKILLed: its claim is never
    ended and was touched a moment ago), and Slurm requeues the job on other nodes, which start
    seconds later. The claim says the node it ran on (not this host), so its pid cannot be checked;
    before the fix the new attempt counted it live for 45 s and split the run into
    ``<run>.77/`` with a one-attempt ledger. An earlier restart of the very same job has ended
    wherever it ran: the new attempt takes the directory, and the ledger has both attempts."""
    import os
    import time

    wanted = tmp_path / "logs" / RUN
    a = aggregator(job_id="77", restart_count=0, nproc_per_node=1)
    peer = NodePeer(a.port, 0, job="77")
    peer.join(0)
    peer.steps(0, 40)
    ckpt = a.run_dir / "aggregate.state"
    deadline = time.monotonic() + 30
    while not ckpt.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    a.kill()                                    # node 0 lost: nothing ended the claim
    claim = wanted / ".traceml-owner"
    owner = json.loads(claim.read_text())
    assert owner["ended"] is False and owner["job_id"] == "77"
    owner["host"] = "node1"                     # where node 0 of restart 0 ran: another host
    claim.write_text(json.dumps(owner))
    os.utime(claim)                             # touched a moment ago
    b = aggregator(job_id="77", restart_count=1, nproc_per_node=1)
    assert b.run_dir == wanted and b.run_dir_note is None, (b.run_dir, b.run_dir_note)
    feed(b, "77", 20)
    s = summary(b.finish(0))
    rows = s["goodput"]["attempts"]
    assert [r["job_id"] for r in rows] == ["77", "77"] and [r["restart_count"] for r in rows] == [0, 1], rows
    assert not (tmp_path / "logs" / f"{RUN}.77").exists()


def test_a_live_run_of_the_same_job_at_the_same_restart_is_not_taken_over(aggregator, tmp_path):
    """The control: two runs with one name inside one job at once (two steps of one allocation)
    are the same job and restart: the second still gets its own directory."""
    wanted = tmp_path / "logs" / RUN
    a = aggregator(job_id="78", restart_count=0, nproc_per_node=1)
    b = aggregator(job_id="78", restart_count=0, nproc_per_node=1)
    assert a.run_dir == wanted and b.run_dir == wanted.with_name(f"{RUN}.78"), (a.run_dir, b.run_dir)
