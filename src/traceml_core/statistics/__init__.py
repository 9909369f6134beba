"""The statistics of step records, as one mergeable value; depends on nothing else of traceml.

``columns`` (the step record's columns and how each is aggregated; the wire protocol re-exports
them), ``window`` (:class:`~.window.WindowStats`: counts, sums, extremes, the warm-up split, the
time outside the steps, the quantile sketches and the per-step-bucket series of a window of one
rank's records: built from the records once, at the node's relay, then only merged, by group
relays, node 0, a restarted aggregator and the summary), ``sketch`` (the quantile sketch),
``series`` (the per-step-bucket series). See docs/aggregator.md.
"""
