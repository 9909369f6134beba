"""``--export mlflow``: the run as an MLflow run, live.

One MLflow run per TraceML run (``mlflow`` extra: ``mlflow-skinny``, the client without the
server), created by node 0's aggregator with MLflow's own client: the tracking URI from
``MLFLOW_TRACKING_URI`` (a server ``http://...``, or ``databricks``), else a local file store in
``<run-dir>/mlruns`` (``mlflow ui --backend-store-uri <run-dir>/mlruns`` shows it; MLflow 3 keeps
that store in maintenance mode, so the exporter sets ``MLFLOW_ALLOW_FILE_STORE=true`` for it).
Experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``traceml``), run name = the run name.

* the launch as parameters (``nnodes``, ``nproc_per_node``, ``world_size``, ``job_id``, ``script``);
* each rank's complete step buckets as metrics ``rank_0003/step_ms``, ``rank_0003/<phase>_ms``, ...
  at step = the bucket's last step, each node's (``node_00/cpu_pct``, ...) at step = seconds since
  the start; the timestamp of each is when it was written (so the run shows it live);
* the verdict as it forms as tags ``traceml.verdict``, ``traceml.verdict.severity``,
  ``traceml.verdict.why``, ``traceml.verdict.next_step``;
* at the end the summary's files as artifacts and the run ended FINISHED (completed), FAILED or
  KILLED (interrupted).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from .batch import Batch, RunIdentity

#: MLflow's limit of metrics per log_batch call
BATCH_METRICS = 1000
_END = {"completed": "FINISHED", "interrupted": "KILLED"}


class MlflowExporter:
    def __init__(self) -> None:
        self.target = ""
        self._client: Any = None
        self._run_id: Optional[str] = None

    def open(self, run: RunIdentity) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path(run.run_dir) / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri and ":" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "traceml"
        exp = self._client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(name)
        tags = {"traceml.run_name": run.run_name}
        if run.job_id:
            tags["traceml.job_id"] = run.job_id
        r = self._client.create_run(exp_id, run_name=run.run_name, tags=tags)
        self._run_id = r.info.run_id
        for k, v in (("nnodes", run.nnodes), ("nproc_per_node", run.nproc_per_node),
                     ("world_size", run.world_size), ("job_id", run.job_id or ""), ("script", run.script)):
            self._client.log_param(self._run_id, k, v)
        self.target = f"{uri} (run {self._run_id})"

    def write(self, batch: Batch) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{p.series}/{k}", v, now, int(round(p.x)))
                   for p in batch.points for k, v in p.values.items()]
        for i in range(0, len(metrics), BATCH_METRICS):
            self._client.log_batch(self._run_id, metrics=metrics[i:i + BATCH_METRICS])
        if batch.verdict is not None:
            v = batch.verdict
            for key, value in (("traceml.verdict", v.kind), ("traceml.verdict.severity", v.severity),
                               ("traceml.verdict.why", v.why), ("traceml.verdict.next_step", v.next_step)):
                self._client.set_tag(self._run_id, key, value[:5000])

    def close(self, final: Batch) -> None:
        self.write(final)
        files = final.final
        status = "FINISHED"
        if files is not None:
            self._client.set_tag(self._run_id, "traceml.status", files.status)
            for p in files.paths():
                if os.path.isfile(p):
                    self._client.log_artifact(self._run_id, p)
            status = _END.get(files.status, "FAILED")
        self._client.set_terminated(self._run_id, status)
