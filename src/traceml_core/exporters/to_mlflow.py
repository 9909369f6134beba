"""``--export mlflow``: the run as an MLflow run, live.

One MLflow run per TraceML run (``mlflow`` extra: ``mlflow-skinny``, the client without the
server), and the SAME MLflow run for every attempt of it (a requeued job): the run carries the
tag ``traceml.run_key`` (:attr:`~.batch.RunIdentity.key`), and a later attempt finds it and
continues it (status back to RUNNING, tag ``traceml.attempt``) instead of creating another. Made by
node 0's aggregator with MLflow's own client: the tracking URI ``--mlflow-tracking-uri``
(``TRACEML_MLFLOW_TRACKING_URI``, else MLflow's own ``MLFLOW_TRACKING_URI``: a server
``http://...``, or ``databricks``), else a local file store in ``<run-dir>/mlruns`` (``mlflow ui
--backend-store-uri <run-dir>/mlruns`` shows it; MLflow 3 keeps that store in maintenance mode, so
the exporter sets ``MLFLOW_ALLOW_FILE_STORE=true`` for it). Experiment ``--mlflow-experiment``
(``TRACEML_MLFLOW_EXPERIMENT``, else ``MLFLOW_EXPERIMENT_NAME``; default ``traceml``), run name =
the run name.

* the launch as parameters (``nnodes``, ``nproc_per_node``, ``world_size``, ``job_id``, ``script``:
  the first attempt's; each attempt's own as tags ``traceml.attempt.<n>.<key>``);
* each rank's complete step buckets as metrics ``rank_0003/step_ms``, ``rank_0003/<phase>_ms``, ...
  at step = the bucket's last step (the run's global step, continuing across attempts), each node's
  (``node_00/cpu_pct``, ...) at step = seconds since the attempt's start; the timestamp of each is
  when it was written (so the run shows it live);
* the verdict as it forms as tags ``traceml.verdict``, ``traceml.verdict.severity``,
  ``traceml.verdict.why``, ``traceml.verdict.next_step``, and the rank it names with its node and
  host (``traceml.verdict.rank``, ``.node``, ``.host``; empty when it names none);
* at the end the summary's files as artifacts and the run ended FINISHED (completed), FAILED or
  KILLED (interrupted); a later attempt sets it RUNNING again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..optionrow import Option, nonempty

if TYPE_CHECKING:
    from ..report.document import Summary
    from .batch import Batch, RunIdentity
    from .hub import Exporter

#: MLflow's limit of metrics per log_batch call
BATCH_METRICS = 1000
_END = {"completed": "FINISHED", "interrupted": "KILLED"}
#: the tag that ties an MLflow run to the TraceML run across its attempts
KEY_TAG = "traceml.run_key"

TRACKING_URI = Option("mlflow_tracking_uri", nonempty, None,
                      "--export mlflow: MLflow's tracking URI (a server http://..., databricks, or a "
                      "local store).", "URI", also_env="MLFLOW_TRACKING_URI",
                      default_doc="$MLFLOW_TRACKING_URI, else a file store in <run-dir>/mlruns")
EXPERIMENT = Option("mlflow_experiment", nonempty, "traceml",
                    "--export mlflow: the MLflow experiment of the run.", "NAME",
                    also_env="MLFLOW_EXPERIMENT_NAME", default_doc="$MLFLOW_EXPERIMENT_NAME, else traceml")


class MlflowOutput:
    """The output (exporters/output.py): plain class attributes, no dataclass: the registry
    is read by every `traceml` command, and each dataclass costs its generated methods."""

    kind: str = "mlflow"
    live: bool = True
    where: str = "an MLflow run (one across a job's requeues)"
    extra: str = "mlflow"
    #: the default file store ``<run-dir>/mlruns`` is the run's, not an attempt's: it stays at the
    #: top when the next attempt begins, so the next attempt finds the run and continues it
    leaves: tuple[str, ...] = ()
    options: tuple[Option, ...] = (TRACKING_URI, EXPERIMENT)

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        return MlflowExporter(settings.get(TRACKING_URI.key), str(settings.get(EXPERIMENT.key) or EXPERIMENT.default))

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        raise NotImplementedError("mlflow is written during the run")


OUTPUT = MlflowOutput()


class MlflowExporter:
    def __init__(self, tracking_uri: Optional[str] = None, experiment: str = EXPERIMENT.default) -> None:
        self.target = ""
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self._client: Any = None
        self._run_id: Optional[str] = None

    def open(self, run: RunIdentity) -> None:
        uri = self.tracking_uri or (Path(run.run_dir) / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri and ":" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the library reads only this
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        exp = self._client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(self.experiment)
        found = self._client.search_runs([exp_id], filter_string=f"tags.`{KEY_TAG}` = '{run.key}'",
                                         max_results=1)
        if found:  # an earlier attempt's run: continue it
            self._run_id = found[0].info.run_id
            self._client.update_run(self._run_id, status="RUNNING")
        else:
            tags = {"traceml.run_name": run.run_name, KEY_TAG: run.key}
            if run.job_id:
                tags["traceml.job_id"] = run.job_id
            self._run_id = self._client.create_run(exp_id, run_name=run.run_name, tags=tags).info.run_id
            for k, v in (("nnodes", run.nnodes), ("nproc_per_node", run.nproc_per_node),
                         ("world_size", run.world_size), ("job_id", run.job_id or ""), ("script", run.script)):
                self._client.log_param(self._run_id, k, v)
        self._client.set_tag(self._run_id, "traceml.attempt", str(run.attempt))
        for k, v in (("job_id", run.job_id or ""), ("nnodes", run.nnodes), ("nproc_per_node", run.nproc_per_node)):
            self._client.set_tag(self._run_id, f"traceml.attempt.{run.attempt}.{k}", str(v))
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
                               ("traceml.verdict.why", v.why), ("traceml.verdict.next_step", v.next_step),
                               ("traceml.verdict.rank", "" if v.rank is None else str(v.rank)),
                               ("traceml.verdict.node", "" if v.node is None else str(v.node)),
                               ("traceml.verdict.host", v.host or "")):
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
