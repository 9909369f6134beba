"""``--export prometheus``: node_exporter textfile-collector files, one per node, replaced atomically.

Written with ``prometheus_client`` (the ``prometheus`` extra) into ``--prometheus-dir``
(``TRACEML_PROMETHEUS_DIR``; default ``<run-dir>/prometheus``); ``{host}`` in it becomes each node's host name, so with a shared
file system every node's node_exporter (``--collector.textfile.directory``) reads only its own
node's file. One file per node, ``traceml_<run>_<host>.prom``, written whole and renamed into
place (``write_to_textfile``), so a scrape never sees half a file. Gauges, the latest complete
bucket of each series (a scrape wants now, not history):

* per rank (its node's file): ``traceml_step_seconds``, ``traceml_own_seconds``,
  ``traceml_phase_seconds{phase}``, ``traceml_memory_peak_bytes``, ``traceml_last_step``;
* per node: ``traceml_cpu_percent``, ``traceml_ram_used_bytes``, ``traceml_gpu_util_percent{gpu}``,
  ``traceml_gpu_memory_used_bytes{gpu}``;
* the run (node 0's file only, so one directory holding every node's file has no duplicates):
  ``traceml_run_info{status}``, ``traceml_verdict_info{kind,severity,rank,node,host}``, the minimum, median and
  maximum step time over all ranks (``traceml_all_ranks_step_seconds{stat}``, large runs), and
  ``traceml_last_update_timestamp_seconds``.

Every series has the labels ``run``, ``job_id`` (the Slurm job id), and where it applies ``rank``,
``node``, ``host`` and ``Hostname`` (the same host, under dcgm-exporter's name for it, so a query
joins our series with its GPU series: ``... * on(Hostname, gpu) group_left DCGM_FI_DEV_GPU_UTIL``),
``gpu`` (the GPU's index on its node, as dcgm-exporter's ``gpu``). The GPUs' UUIDs are not in the
summary, so there is no ``UUID`` label: join on ``Hostname`` and ``gpu``.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..optionrow import Option, path

if TYPE_CHECKING:
    from ..report.document import Summary
    from .batch import Batch, Point, RunIdentity, VerdictNow
    from .hub import Exporter

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

DIRECTORY = Option("prometheus_dir", path, None,
                   "--export prometheus: the directory of node_exporter's textfile collector where node 0 "
                   "writes one file per node ({host} in it becomes the node's host name).", "DIR",
                   default_doc="<run-dir>/prometheus")


class PrometheusOutput:
    """The output (exporters/output.py): plain class attributes, no dataclass: the registry
    is read by every `traceml` command, and each dataclass costs its generated methods."""

    kind: str = "prometheus"
    live: bool = True
    where: str = "node_exporter textfiles, one per node"
    extra: str = "prometheus"
    leaves: tuple[str, ...] = ("prometheus",)
    options: tuple[Option, ...] = (DIRECTORY,)

    def start(self, settings: Mapping[str, Any]) -> "Exporter":
        return PrometheusExporter(settings.get(DIRECTORY.key))

    def write(self, summary: "Summary", run_dir: Path, settings: Mapping[str, Any]) -> str:
        raise NotImplementedError("prometheus is written during the run")


OUTPUT = PrometheusOutput()


class PrometheusExporter:
    def __init__(self, directory: Optional[str] = None) -> None:
        self.directory = directory
        self.target = ""
        self._run: Optional[RunIdentity] = None
        self._latest: dict[str, Point] = {}
        self._verdict: Optional[VerdictNow] = None
        self._status = "running"
        #: host names seen in the points, for a run whose node list the cluster did not give
        self._hosts: dict[int, str] = {}

    def open(self, run: RunIdentity) -> None:
        import prometheus_client  # noqa: F401 - the extra; fail here, in this thread, if missing

        self._run = run
        self.target = self.directory or str(Path(run.run_dir) / "prometheus")

    def write(self, batch: Batch) -> None:
        for p in batch.points:
            self._latest[p.series] = p
            if p.node is not None and p.host:
                self._hosts.setdefault(p.node, p.host)
        if batch.verdict is not None:
            self._verdict = batch.verdict
        self._status = batch.status
        self._flush()

    def close(self, final: Batch) -> None:
        self.write(final)

    # -- the files ------------------------------------------------------------------------------
    def host(self, node: int) -> Optional[str]:
        """The node's host name: the cluster's node list, else what its ranks said (node 0: this
        host, where the aggregator runs); None until known (its file waits: a name never changes)."""
        assert self._run is not None
        if node < len(self._run.hostnames):
            return self._run.hostnames[node]
        return self._hosts.get(node) or (socket.gethostname() if node == 0 else None)

    def path(self, node: int) -> Path:
        assert self._run is not None
        host = self.host(node) or f"node{node}"
        base = Path(self.target.replace("{host}", _SAFE.sub("_", host)))
        return base / f"traceml_{_SAFE.sub('_', self._run.run_name)}_{_SAFE.sub('_', host)}.prom"

    def _flush(self) -> None:
        from prometheus_client import write_to_textfile

        assert self._run is not None
        for node in range(self._run.nnodes):
            if self.host(node) is None:
                continue
            path = self.path(node)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(path), self._registry(node))

    def _registry(self, node: int) -> Any:
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Collector(self, node))
        return reg


class _Collector:
    def __init__(self, owner: PrometheusExporter, node: int) -> None:
        self.owner, self.node = owner, node

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        o, run = self.owner, self.owner._run
        assert run is not None
        base = {"run": run.run_name, "job_id": run.job_id or ""}
        fams: dict[str, Any] = {}

        def gauge(name: str, doc: str, labels: dict[str, str], value: Optional[float]) -> None:
            if value is None:
                return
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = GaugeMetricFamily(name, doc, labels=list({**base, **labels}))
            fam.add_metric(list({**base, **labels}.values()), float(value))

        for p in sorted(o._latest.values(), key=lambda p: p.series):
            if p.kind == "rank" and p.node == self.node:
                who = {"rank": str(p.rank), "node": str(p.node), "host": p.host, "Hostname": p.host}
                for key, v in p.values.items():
                    if key in ("step_ms", "own_ms"):
                        gauge(f"traceml_{key[:-3]}_seconds", f"{key[:-3]} time of the rank's latest "
                              "complete step bucket (mean)", who, v / 1e3)
                    elif key == "mem_peak_bytes":
                        gauge("traceml_memory_peak_bytes", "peak memory in the latest bucket", who, v)
                    elif key.endswith("_ms") and key != "step_max_ms":
                        gauge("traceml_phase_seconds", "time in a phase of the step (mean of the latest "
                              "complete bucket)", {**who, "phase": key[:-3]}, v / 1e3)
                gauge("traceml_last_step", "the last step of the rank's latest complete bucket", who, p.x)
            elif p.kind == "node" and p.node == self.node:
                who = {"node": str(p.node), "host": p.host, "Hostname": p.host}
                for key, v in p.values.items():
                    m = re.fullmatch(r"gpu(\d+)_(util_pct|mem_used_bytes)", key)
                    if key == "cpu_pct":
                        gauge("traceml_cpu_percent", "the node's CPU use", who, v)
                    elif key == "ram_used_bytes":
                        gauge("traceml_ram_used_bytes", "the node's RAM in use", who, v)
                    elif m and m.group(2) == "util_pct":
                        gauge("traceml_gpu_util_percent", "GPU utilisation", {**who, "gpu": m.group(1)}, v)
                    elif m:
                        gauge("traceml_gpu_memory_used_bytes", "GPU memory in use", {**who, "gpu": m.group(1)}, v)
            elif p.kind == "all_ranks" and self.node == 0:
                for key, v in p.values.items():
                    m = re.fullmatch(r"(step|own)_(min|median|max)_ms", key)
                    if m:
                        gauge(f"traceml_all_ranks_{m.group(1)}_seconds", f"{m.group(1)} time over all "
                              "ranks in the latest complete bucket", {"stat": m.group(2)}, v / 1e3)
        if self.node == 0:
            gauge("traceml_run_info", "the run (status: running, completed, failed, interrupted)",
                  {"status": o._status}, 1)
            if o._verdict is not None:
                v = o._verdict
                gauge("traceml_verdict_info", "the verdict so far (rank, node, host: the rank it names)",
                      {"kind": v.kind, "severity": v.severity,
                       "rank": "" if v.rank is None else str(v.rank),
                       "node": "" if v.node is None else str(v.node), "host": v.host or ""}, 1)
            gauge("traceml_last_update_timestamp_seconds", "when TraceML last wrote this file", {}, time.time())
        return list(fams.values())
