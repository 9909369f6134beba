"""``--export wandb``: the run as a Weights & Biases run, live.

One W&B run per TraceML run, created by node 0's aggregator, and the SAME W&B run for every
attempt of it (a requeued job, or a job continuing the run under the same run name): its id is the
run's identity across attempts (:attr:`~.batch.RunIdentity.key`) and each attempt resumes it
(``resume="allow"``), so a requeued job's dashboard is one run, not one per attempt. Project
``--wandb-project`` (``TRACEML_WANDB_PROJECT``, else W&B's own ``WANDB_PROJECT``; default
``traceml``), name = the run name, group = the Slurm job id, config = the launch (nodes, workers,
script) and the attempt. W&B's own variables apply (``WANDB_MODE=offline`` writes under
``<run-dir>/wandb`` for ``wandb sync`` later, ``WANDB_API_KEY``, ``WANDB_ENTITY``, ...).

* each rank's complete step buckets: ``rank_0003/step_ms``, ``rank_0003/own_ms``,
  ``rank_0003/<phase>_ms``, ``rank_0003/mem_peak_bytes`` against ``step`` (the bucket's last step:
  the run's global step, continuing across attempts), with ``attempt`` in every row;
  large runs: the featured ranks and ``all_ranks/step_{min,median,max}_ms``;
* each node's: ``node_00/cpu_pct``, ``node_00/gpu0_util_pct``, ... against ``elapsed_s``;
* the verdict as it forms, in the run's summary (``verdict/kind``, ``verdict/severity``,
  ``verdict/why``, ``verdict/next_step``), and the run's status at the end;
* at the end, ``final_summary.json``, ``.txt`` and ``.html`` as one artifact (type ``traceml-report``),
  then W&B's ``wandb-core`` service is stopped (``wandb.teardown``): it must not outlive the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..optionrow import Option, nonempty

if TYPE_CHECKING:
    from ..report.document import Summary
    from .batch import Batch, RunIdentity
    from .hub import Exporter

PROJECT = Option("wandb_project", nonempty, "traceml",
                 "--export wandb: the W&B project of the run.", "NAME", also_env="WANDB_PROJECT",
                 default_doc="$WANDB_PROJECT, else traceml")


class WandbOutput:
    """The output (exporters/output.py): plain class attributes, no dataclass: the registry
    is read by every `traceml` command, and each dataclass costs its generated methods."""

    kind: str = "wandb"
    live: bool = True
    where: str = "a Weights & Biases run (one across a job's requeues)"
    extra: str = "wandb"
    #: ``<run-dir>/wandb`` (offline runs) holds every attempt's part of the one run: it stays
    leaves: tuple[str, ...] = ()
    options: tuple[Option, ...] = (PROJECT,)

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        return WandbExporter(str(settings.get(PROJECT.key) or PROJECT.default))

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        raise NotImplementedError("wandb is written during the run")


OUTPUT = WandbOutput()


class WandbExporter:
    def __init__(self, project: str = PROJECT.default) -> None:
        self.target = ""
        self.project = project
        self._run: Any = None
        self._identity: Optional[RunIdentity] = None

    def open(self, run: RunIdentity) -> None:
        import wandb

        self._identity = run
        self._run = wandb.init(
            project=self.project, name=run.run_name, id=run.key, resume="allow",
            group=run.job_id or None, dir=run.run_dir, job_type="training",
            config={"nnodes": run.nnodes, "nproc_per_node": run.nproc_per_node,
                    "world_size": run.world_size, "job_id": run.job_id, "script": run.script,
                    "hosts": list(run.hostnames), "attempt": run.attempt},
            # a resumed run's launch may differ (a requeue on fewer nodes): the latest is kept
            allow_val_change=True,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                    x_disable_machine_info=True),
            reinit="create_new")
        self._run.define_metric("step")
        self._run.define_metric("elapsed_s")
        self._run.define_metric("rank_*", step_metric="step")
        self._run.define_metric("all_ranks/*", step_metric="step")
        self._run.define_metric("node_*", step_metric="elapsed_s")
        self.target = str(getattr(self._run, "dir", "") or run.run_dir)

    def write(self, batch: Batch) -> None:
        rows: dict[tuple[str, float], dict[str, Any]] = {}
        attempt = self._identity.attempt if self._identity is not None else 0
        for p in batch.points:
            axis = "step" if p.by_step else "elapsed_s"
            row = rows.setdefault((axis, p.x), {axis: int(p.x) if p.by_step else p.x, "attempt": attempt})
            row.update({f"{p.series}/{k}": v for k, v in p.values.items()})
        for (_axis, _x), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            self._run.log(row)
        if batch.verdict is not None:
            v = batch.verdict
            self._run.summary.update({"verdict/kind": v.kind, "verdict/severity": v.severity,
                                      "verdict/why": v.why, "verdict/next_step": v.next_step,
                                      "verdict/rank": v.rank, "verdict/node": v.node,
                                      "verdict/host": v.host})

    def close(self, final: Batch) -> None:
        import wandb

        self.write(final)
        files = final.final
        if files is not None:
            self._run.summary["status"] = files.status
            paths = [p for p in files.paths() if os.path.isfile(p)]
            if paths:
                art = wandb.Artifact(f"traceml-report-{self._run.id}", type="traceml-report")
                for p in paths:
                    art.add_file(p)
                self._run.log_artifact(art)
        self._run.finish(exit_code=0 if files is None or files.status == "completed" else 1)
        # the wandb-core service process otherwise lives on after the run (55 s seen); what a
        # hung exporter leaves is stopped by the hub (hub.stop_helpers)
        wandb.teardown()
