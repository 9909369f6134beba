"""Live exports: the run, as it goes, where users already look (W&B, MLflow, Prometheus).

``--export wandb|mlflow|prometheus`` (beside the end-of-run ``tensorboard`` and ``jsonl`` of
:mod:`traceml_core.report.export`). Node 0's aggregator, every ``--export-interval`` seconds, builds
a provisional summary of the run so far and turns its new complete step buckets into one
:class:`~.batch.Batch` (:mod:`.batch`: the same rows as ``steps.jsonl``, the verdict as it forms);
:class:`~.hub.ExportHub` hands the batch to one thread per destination through a bounded queue
(16 batches). At the end, after the summary is written, each destination gets the rest of the series,
the final summary and the HTML report, within a deadline.

The split is the OpenTelemetry SDK's: the aggregator produces, an exporter only ships
(:class:`~.hub.Exporter`: ``open``/``write``/``close``), and nothing a destination does reaches
training or the summary:

* each destination's library is imported in its own thread, only when asked for (``pip install
  traceml-slurm[wandb]``, ``[mlflow]``, ``[prometheus]``); a missing one is one logged line;
* the aggregator never waits for an exporter: a batch that finds the queue full is dropped, and
  its points are counted (``exports.json`` in the run directory and the aggregator's log say how
  many); an exporter that raises stops, and its error is reported the same way;
* building the batches is paced like the checkpoints: never more than 5 % of the wall clock.
"""

from __future__ import annotations

#: the destinations written during the run (the end-of-run ones are in report/export.py)
LIVE_KINDS = ("wandb", "mlflow", "prometheus")
