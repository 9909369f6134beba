"""Exports: the run where users already look (W&B, MLflow, Prometheus live; TensorBoard and JSON
lines at the end), and any output a third party registers (:mod:`.output`).

``--export KINDS``: each kind is an :class:`~.output.Output` found through the ``traceml.outputs``
entry-point group. A live one: node 0's aggregator, every ``--export-interval`` seconds, builds a
provisional summary of the run so far and turns its new complete step buckets into one
:class:`~.batch.Batch` (:mod:`.batch`: the same rows as ``steps.jsonl``, the verdict as it forms);
:class:`~.hub.ExportHub` hands the batch to one thread per destination through a bounded queue
(16 batches). At the end, after the summary is written, each destination gets the rest of the
series, the final summary and the HTML report, within a deadline. An at-the-end one writes from the
final summary (``traceml report --export KIND`` later).

The split is the OpenTelemetry SDK's: the aggregator produces, an exporter only ships
(:class:`~.hub.Exporter`: ``open``/``write``/``close``), and nothing a destination does reaches
training or the summary:

* each destination's library is imported in its own thread, only when asked for (the extras
  ``wandb``, ``mlflow``, ``prometheus``); a missing one is one logged line;
* the aggregator never waits for an exporter: a batch that finds the queue full is dropped, and
  its points are counted (``exports.json`` in the run directory and the aggregator's log say how
  many); an exporter that raises stops, and its error is reported the same way; one that hangs is
  named at the end with what it was doing and what was still queued, and the helper processes of
  its library are stopped;
* building the batches is paced like the checkpoints: never more than 5 % of the wall clock;
* a run's attempts (a requeued job) are one run in every destination (:attr:`.batch.RunIdentity.key`).
"""

from __future__ import annotations


def live_kinds() -> tuple[str, ...]:
    """The kinds written during the run (the registry's live outputs)."""
    from .output import registry

    return registry().live_kinds()


def end_kinds() -> tuple[str, ...]:
    """The kinds written at the end, from the summary."""
    from .output import registry

    return registry().end_kinds()
