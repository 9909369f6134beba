"""Checkpoints are paced by what they cost: at most ~2 % of the wall clock and at most
CHECKPOINT_BYTES_PER_S written on average, so a run of thousands of ranks (checkpoints of
hundreds of MB) does not keep rewriting them on the usually shared logs directory. A real
aggregator server on loopback, its real checkpoint write; the rate is lowered so a few ranks'
state is "large"."""

from __future__ import annotations

import socket
import time

from aggpeers import columns, make_settings, relayed
from traceml_core.aggregator import server as srv_mod
from traceml_core.rundir import CHECKPOINT_NAME, prepare_run_dir


def _server(tmp_path, ranks: int):
    settings = make_settings(tmp_path, nproc_per_node=ranks, checkpoint_interval_s=0.5)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    srv = srv_mod.Server(settings, lsock, prepare_run_dir(settings.run_dir, settings.run_name),
                         lambda s, d, p: d)
    for r in range(ranks):
        rs = srv.state.rank(r)
        rs.ingest_fold(relayed({"t": "steps", "rank": r, "seq": 0, "n": 300, "dropped": 0, "cols": columns(300)}))
    srv.state.dirty = True
    return srv, lsock


def test_a_large_checkpoint_stretches_the_interval_to_the_byte_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(srv_mod, "CHECKPOINT_BYTES_PER_S", 2_000)
    srv, lsock = _server(tmp_path, 8)
    try:
        srv.checkpoint()
        size = (srv.run_dir.path / CHECKPOINT_NAME).stat().st_size
        wait = srv._next_checkpoint - time.monotonic()
        assert size > 10_000, size
        assert wait >= size / 2_000 - 1.0 and wait > 4 * 0.5, (size, wait)
    finally:
        lsock.close()
    # the control: the same state at the default rate keeps checkpoint_interval_s
    monkeypatch.setattr(srv_mod, "CHECKPOINT_BYTES_PER_S", 1_000_000)
    srv, lsock = _server(tmp_path / "control", 8)
    try:
        srv.checkpoint()
        wait = srv._next_checkpoint - time.monotonic()
        assert wait <= 0.5 + 0.01 or wait <= srv.checkpoint_seconds / srv_mod.CHECKPOINT_SHARE, wait
    finally:
        lsock.close()
