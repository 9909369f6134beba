"""Core's self-test entry point: what a cluster plugin's preflight (``traceml slurm doctor``) uses of
core to try a node's telemetry path for real, without reaching into the launcher, the aggregator or
the SDK. Everything here runs the real parts a training run uses; only the run's identity is a test's.

- :class:`TestAggregator`: the real aggregator process on a given port; :meth:`TestAggregator.finish`
  writes its summary and says which ranks it heard;
- :func:`send_test_telemetry`: what one node does in a real run: its relay joins node 0's
  aggregator as the node's link, a training process connects to the relay and sends a few step
  records and a bye, and the relay closes with the node's bye;
- the link probe between the nodes as ``traceml run``'s launcher runs it (:class:`ProbeRun`,
  :class:`ProbeServer`, :func:`measure_links`);
- the node's GPUs as the SDK's sampler reads them through NVML (:func:`load_nvml`, ...);
- the link probe's rule on per-node rates, as a run's summary applies it to node evidence
  (:func:`link_observations_of`), so the doctor's probe is judged as a run's is, and the same rule
  for any rate measured on each node (:func:`slower_than_peers`: the doctor's micro-benchmarks).

The plugin depends on this module, on the launch config (``traceml_core.config``), on the plugin
interface (``traceml_core.plugins``) and on the transport (``traceml_core.wire``) only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .linkprobe.probe import ProbeRun

#: step records each node sends in a test (send_test_telemetry)
TEST_RECORDS = 3
#: names imported on first use: the link probe and its analysis cost ~0.3 s to import, the SDK's
#: samplers package ~0.1 s, and a doctor --local on a CPU node needs neither before it answers
_NVML = ".sdk.samplers.nvml"
_LAZY = {"DEFAULT_BYTES": ".linkprobe.probe", "ROUNDS_BUDGET_S": ".linkprobe.probe", "ProbeRun": ".linkprobe.probe",
         "ProbeServer": ".linkprobe.probe", "probe_failed": ".linkprobe.analysis", "FakeNvml": _NVML,
         "GpuDevice": _NVML, "GpuProcess": _NVML, "NvmlBackend": _NVML, "NvmlUnavailable": _NVML, "fake_gpus": _NVML,
         "load_nvml": _NVML, "link_observations_of": ".report.nodeevidence",
         "slower_than_peers": ".report.nodeevidence", "BENCH_SLOW_FRACTION": ".report.thresholds",
         "cpu_cgroup": ".cgroupcpu", "median": ".report.stats"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __package__)
        return getattr(module, "failed" if name == "probe_failed" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["BENCH_SLOW_FRACTION", "DEFAULT_BYTES", "ROUNDS_BUDGET_S", "TEST_RECORDS", "FakeNvml", "GpuDevice", "GpuProcess", "NvmlBackend",
           "NvmlUnavailable", "ProbeRun", "ProbeServer", "TestAggregator", "fake_gpus", "link_observations_of", "load_nvml", "measure_links",
           "probe_failed", "send_test_telemetry", "slower_than_peers", "cpu_cgroup", "median"]


class TestAggregator:
    """The real aggregator of a test run, in a temporary run directory removed at the end."""

    __test__ = False  # not a pytest test class

    def __init__(self, *, run: str, token: str, job: Optional[str], bind_host: str, port: int, nnodes: int,
                 master_addr: str = "", wait_s: float = 10.0) -> None:
        from .aggregator.process import start_aggregator
        from .aggregator.settings import AggregatorSettings

        self.dir = tempfile.mkdtemp(prefix="traceml-selftest-aggregator-")
        settings = AggregatorSettings(
            run_name=run, token=token, run_dir=Path(self.dir) / run, job_id=job, bind_host=bind_host, port=port,
            nnodes=nnodes, nproc_per_node=1, node_join_window_s=wait_s, master_addr=master_addr,
            port_source="self-test")
        try:
            self._handle: Any = start_aggregator(settings, ready_timeout=wait_s)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.port: int = self._handle.port

    @classmethod
    def start(cls, **kw: Any) -> tuple[Optional["TestAggregator"], Optional[str]]:
        """``(aggregator, None)``, or ``(None, why it did not start)``: never raises for a port in use,
        a bind address that is not ours or an aggregator that does not come up."""
        from .errors import TraceMLError

        try:
            return cls(**kw), None
        except TraceMLError as exc:
            return None, str(exc)
        except OSError as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def records(self) -> int:
        return int((self._handle.status() or {}).get("records", 0))

    def finish(self, expect_records: int, wait_s: float) -> dict[str, Any]:
        """Wait (bounded) for ``expect_records``, end the run, read the summary: ``{"ok", "status",
        "ranks": [{"rank", "node", "host", "steps"}], "error"}``; the run directory is removed."""
        deadline = time.monotonic() + wait_s
        status = self._handle.status() or {}
        while int(status.get("records", 0)) < expect_records and time.monotonic() < deadline:
            time.sleep(0.1)
            status = self._handle.status() or {}
        result = self._handle.finish(0, reason="self-test")
        ranks: list[dict[str, Any]] = []
        error = result.error
        if result.summary_json is not None:
            try:
                summary = json.loads(Path(result.summary_json).read_text())
                ranks = [{"rank": r.get("rank"), "node": r.get("node"), "host": r.get("host"), "steps": r.get("steps")}
                         for r in summary.get("ranks", [])]
            except (OSError, ValueError) as exc:
                error = f"cannot read the summary: {exc}"
        self.close()
        return {"ok": result.summary_json is not None, "status": status, "ranks": ranks, "error": error}

    def close(self) -> None:
        """Kill the aggregator if it still runs and remove the run directory (idempotent)."""
        if self._handle is not None:
            self._handle.kill()
            self._handle = None
        shutil.rmtree(self.dir, ignore_errors=True)


def send_test_telemetry(addr: str, port: int, *, token: str, run: str, job: Optional[str], rank: int, world: int,
                        hostname: str, timeout: float) -> dict[str, Any]:
    """One node's part of a run, for real: its relay (joining ``addr:port`` as node ``rank`` of
    ``world``), a training process sending :data:`TEST_RECORDS` step records and its bye through it,
    then the node's bye. ``{"ok": True, "records", "ms"}`` or ``{"ok": False, "stage", "detail"}``
    (stage: connect, hello, send); never raises for a network failure."""
    from .launcher.relay import Relay
    from .wire.auth import make_hello, relay_aud
    from .wire.client import Link, LinkError
    from .wire.protocol import STEP_COLUMNS

    t0 = time.monotonic()
    try:
        relay = Relay(token=token, run_name=run, job_id=job, node=rank, nnodes=world, nproc_per_node=1,
                      upstream=(addr, port), hostname=hostname, flush_s=0.0, warn=lambda _m: None,
                      client_options={"connect_timeout": timeout}).start()
    except OSError as exc:
        return {"ok": False, "stage": "connect", "detail": exc.strerror or str(exc)}
    try:
        if not relay.wait_connected(timeout):
            cs = relay.client.stats()
            return {"ok": False, "stage": "hello", "detail": str(cs.refused or cs.last_error or "no answer to the hello")}
        link = Link.connect(relay.host, relay.port, lambda: make_hello(
            token, aud=relay_aud(rank), run=run, job=job, node=rank, rank=rank, kind="rank", host=hostname,
            world=world, extra={"local_rank": 0}), timeout=timeout)
        n, now = TEST_RECORDS, time.time_ns()
        cols = {c: [-1] * n for c in STEP_COLUMNS}
        cols.update(step=list(range(n)), t_end_ns=[now] * n, step_ns=[1_000_000] * n)
        link.send({"t": "steps", "rank": rank, "seq": 0, "n": n, "cols": cols, "dropped": 0})
        link.send({"t": "bye", "rank": rank, "status": "clean", "steps": n, "dropped": 0, "error": None})
        link.close()
        if not relay.drain(timeout):
            return {"ok": False, "stage": "send", "detail": "the relay could not forward the records in time"}
    except (LinkError, OSError) as exc:
        return {"ok": False, "stage": "send", "detail": str(exc)}
    finally:
        relay.close(timeout, bye={"t": "bye", "status": "clean", "exit_code": 0})
    return {"ok": True, "records": TEST_RECORDS, "ms": round((time.monotonic() - t0) * 1000, 1)}


def measure_links(run: "ProbeRun", hosts: list[str], ports: list[int], *, nbytes: Optional[int] = None,
                  wait_s: float = 5.0, budget_s: Optional[float] = None) -> dict[str, Any]:
    """The link probe's rounds over every node's :class:`ProbeServer` (node 0 runs them), as the
    launcher does; never raises for a malformed request (the answer says why)."""
    from .linkprobe.analysis import failed
    from .linkprobe.probe import DEFAULT_BYTES, ROUNDS_BUDGET_S, coordinate

    try:
        return coordinate(run, hosts, ports=ports, nbytes=DEFAULT_BYTES if nbytes is None else nbytes, wait_s=wait_s,
                          budget_s=ROUNDS_BUDGET_S if budget_s is None else budget_s)
    except (KeyError, TypeError, ValueError) as exc:
        return failed(f"malformed request ({type(exc).__name__}: {exc})")
