"""The aggregator: one process on node 0 that every rank and node launcher reports to.

``process`` (start it, talk to it: the launcher's API), ``settings`` (what it is told),
``server`` + ``poller`` (the network loop), ``handshake`` (who may talk), ``rankstate`` /
``system`` / ``state`` (bounded per-rank state; the statistics are :mod:`traceml_core.statistics`'
mergeable value), ``resume`` (going on after a restart), ``persist``
(checkpoints, run directory and its fallback), ``control`` (the launchers' client side).
See docs/aggregator.md.
"""
