"""``--export wandb``: the run as a Weights & Biases run, live.

One W&B run per TraceML run (``wandb`` extra), created by node 0's aggregator: project
``WANDB_PROJECT`` (default ``traceml``), name = the run name, group = the Slurm job id, config = the
launch (nodes, workers, script). W&B's own variables apply (``WANDB_MODE=offline`` writes under
``<run-dir>/wandb`` for ``wandb sync`` later, ``WANDB_API_KEY``, ``WANDB_ENTITY``, ...).

* each rank's complete step buckets: ``rank_0003/step_ms``, ``rank_0003/own_ms``,
  ``rank_0003/<phase>_ms``, ``rank_0003/mem_peak_bytes`` against ``step`` (the bucket's last step);
  large runs: the featured ranks and ``all_ranks/step_{min,median,max}_ms``;
* each node's: ``node_00/cpu_pct``, ``node_00/gpu0_util_pct``, ... against ``elapsed_s``;
* the verdict as it forms, in the run's summary (``verdict/kind``, ``verdict/severity``,
  ``verdict/why``, ``verdict/next_step``), and the run's status at the end;
* at the end, ``final_summary.json``, ``.txt`` and ``.html`` as one artifact (type ``traceml-report``).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .batch import Batch, RunIdentity


class WandbExporter:
    def __init__(self) -> None:
        self.target = ""
        self._run: Any = None
        self._identity: Optional[RunIdentity] = None

    def open(self, run: RunIdentity) -> None:
        import wandb

        self._identity = run
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "traceml", name=run.run_name,
            group=run.job_id or None, dir=run.run_dir, job_type="training",
            config={"nnodes": run.nnodes, "nproc_per_node": run.nproc_per_node,
                    "world_size": run.world_size, "job_id": run.job_id, "script": run.script,
                    "hosts": list(run.hostnames)},
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
        for p in batch.points:
            axis = "step" if p.by_step else "elapsed_s"
            row = rows.setdefault((axis, p.x), {axis: int(p.x) if p.by_step else p.x})
            row.update({f"{p.series}/{k}": v for k, v in p.values.items()})
        for (_axis, _x), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            self._run.log(row)
        if batch.verdict is not None:
            v = batch.verdict
            self._run.summary.update({"verdict/kind": v.kind, "verdict/severity": v.severity,
                                      "verdict/why": v.why, "verdict/next_step": v.next_step})

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
