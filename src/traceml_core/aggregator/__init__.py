"""The aggregator: one process on node 0 that every rank and node launcher reports to.

``process`` (start it, talk to it: the launcher's API), ``settings`` (what it is told),
``server`` + ``poller`` (the network loop), ``handshake`` (who may talk), ``rankstate`` /
``system`` / ``state`` (bounded per-rank state; the statistics are :mod:`traceml_core.statistics`'
mergeable value), ``resume`` (going on after a restart), ``adapter`` (the state as typed run
data, ``traceml_core.rundata``, for the report), ``snapshot`` (the live views' frames),
``control`` (the launchers' client side). Its files (checkpoints, the run directory and its
fallback) are ``traceml_core.rundir``'s. See docs/aggregator.md.
"""
