"""Hostile floods against the real processes: memory, CPU and the job log stay bounded, and the
run's own ranks are neither refused nor slowed.

* a node's relay under 10,000 connections that each park a partial hello (4,096-byte prefix,
  2,000 bytes sent): its RSS grows by at most the pending cap's worth, a rank stepping through it
  meanwhile never waits, and all its records arrive;
* a relay out of file descriptors: it evicts or pauses, it does not spin;
* node 0's aggregator under 20,000 garbage connections: every one counted, a few dozen log lines.

The relay runs in a process of its own (relay_host.py) so its memory and CPU can be read from
/proc; the floods come from another process so they do not share the measuring process's GIL.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aggpeers import NodePeer
from traceml_core.sdk.recorder import StepRecorder
from traceml_core.sdk.tracer import Tracer
from traceml_core.wire.auth import relay_aud
from traceml_core.wire.client import ClientConfig, TelemetryClient

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
TOKEN, RUN = "flood-token-0123456789", "flood"


def _status(pid: int) -> tuple[int, float]:
    """(RSS bytes, user + system CPU seconds) of a process."""
    rss = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int, int]:
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, str(HERE / "relay_host.py"), str(tmp_path / RUN), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line[1]), int(line[2])


def _finish(proc: subprocess.Popen) -> tuple[dict, dict, str]:
    out, err = proc.communicate(input="", timeout=60)
    done = [ln for ln in out.splitlines() if ln.startswith("DONE")][-1].split(" ", 2)
    return json.loads(Path(done[1]).read_text()), json.loads(done[2]), err


def _flood(port: int, n: int, payload: bytes, hold: bool, opened: "mp.Value", release: "mp.Event") -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    held = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if payload:
                s.sendall(payload)
        except OSError:
            continue
        if hold:
            held.append(s)
        else:
            s.close()
        opened.value += 1
    release.wait(120)
    for s in held:
        s.close()


def _start_flood(port: int, n: int, payload: bytes, hold: bool):
    ctx = mp.get_context("fork")
    opened, release = ctx.Value("i", 0), ctx.Event()
    p = ctx.Process(target=_flood, args=(port, n, payload, hold, opened, release), daemon=True)
    p.start()
    return p, opened, release


def _rank(port: int, rank: int = 0) -> tuple[TelemetryClient, StepRecorder]:
    rec = StepRecorder(rank=rank, batch_size=64, seal_interval_s=0.02, max_batches=10000)
    c = TelemetryClient(ClientConfig("127.0.0.1", port, TOKEN, aud=relay_aud(0), run=RUN, node=0, rank=rank,
                                     kind="rank", world=2), source=rec)
    c.start()
    assert c.wait_connected(10.0)
    return c, rec


def _step_for(rec: StepRecorder, seconds: float, times: list[float]) -> None:
    ctx = Tracer(rec).step
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        with ctx:
            pass
        times.append(time.perf_counter() - t0)
        time.sleep(0.001)


def _p999(times: list[float]) -> float:
    return sorted(times)[int(len(times) * 0.999)]


def test_relay_under_10000_parked_partial_hellos_keeps_memory_bounded_and_ranks_unslowed(tmp_path):
    n = 10_000
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < n + 500:
        pytest.skip(f"the open-files limit ({hard}) is too low for {n} connections")
    proc, port, _ = _host(tmp_path)
    try:
        client, rec = _rank(port)
        times: list[float] = []
        _step_for(rec, 2.0, times)     # the baseline: the same steps on this machine, before the flood
        base_rss, _ = _status(proc.pid)
        partial = struct.pack(">I", 4096) + b"\x85" + b"h" * 1999  # a hello-sized prefix, half sent
        flood, opened, release = _start_flood(port, n, partial, hold=True)
        during: list[float] = []
        peak = 0
        deadline = time.monotonic() + 180
        while opened.value < n and time.monotonic() < deadline:
            _step_for(rec, 0.2, during)
            peak = max(peak, _status(proc.pid)[0] - base_rss)
        assert opened.value >= n * 0.95, opened.value
        _step_for(rec, 0.5, during)
        peak = max(peak, _status(proc.pid)[0] - base_rss)
        release.set()
        flood.join(60)
        rec.flush_partial()
        assert client.close(5.0, bye=lambda: {"t": "bye", "rank": 0, "status": "clean",
                                              "steps": rec.count, "dropped": rec.lost, "error": None})
    except BaseException:
        proc.kill()
        raise
    summary, counters, err = _finish(proc)
    base_p, during_p = _p999(times), _p999(during)
    print(f"relay RSS +{peak / 2**20:.1f} MiB under {n} parked partial hellos; rank step p99.9 "
          f"{during_p * 1e3:.2f} ms over {len(during)} steps (before the flood {base_p * 1e3:.2f} ms "
          f"over {len(times)})")
    # the bound: 256 pending x (4 KiB of hello + ~2 KiB of socket and bookkeeping), plus slack
    assert peak < 16 * 2**20, f"relay RSS grew by {peak / 2**20:.1f} MiB"
    assert counters["evicted"] >= n - 256 - counters["handshake_timeouts"] - 64
    # A traced step never waits on the relay: its p99.9 under the flood stays within a few times
    # its own p99.9 before (this machine's load and the flood's CPU included), with a floor for a
    # quiet baseline, and always under 80 ms, so a relay that blocks the training thread for
    # ~100 ms in one step in a thousand or more fails it, whatever the baseline read.
    bound = min(0.08, max(0.02, 3 * base_p))
    assert during_p < bound, (f"a traced step waited on the relay: p99.9 {during_p * 1e3:.1f} ms under "
                              f"the flood, {base_p * 1e3:.1f} ms before (bound {bound * 1e3:.0f} ms)")
    r0 = [r for r in summary["ranks"] if r["rank"] == 0][0]
    assert r0["steps"] == rec.count and rec.lost == 0 and r0["status"] == "clean"
    relay_lines = [ln for ln in err.splitlines() if ln.startswith("[relay]")]
    assert len(relay_lines) < 80, f"{len(relay_lines)} relay log lines for {n} connections"


def test_relay_out_of_file_descriptors_neither_spins_nor_locks_ranks_out(tmp_path):
    proc, port, _ = _host(tmp_path, "3")   # three descriptors to spare
    try:
        flood, opened, release = _start_flood(port, 300, b"", hold=True)
        deadline = time.monotonic() + 60
        while opened.value < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        _, cpu0 = _status(proc.pid)
        time.sleep(3.0)
        _, cpu1 = _status(proc.pid)
        assert cpu1 - cpu0 < 1.0, f"the relay used {cpu1 - cpu0:.2f} s of CPU in 3 s while out of descriptors"
        release.set()
        flood.join(30)
        client, rec = _rank(port)     # once the flood is gone, a real rank gets in
        _step_for(rec, 0.3, [])
        rec.flush_partial()
        assert client.close(5.0, bye=lambda: {"t": "bye", "rank": 0, "status": "clean",
                                              "steps": rec.count, "dropped": rec.lost, "error": None})
    except BaseException:
        proc.kill()
        raise
    summary, counters, err = _finish(proc)
    assert [r["steps"] for r in summary["ranks"] if r["rank"] == 0] == [rec.count]
    assert len([ln for ln in err.splitlines() if ln.startswith("[relay]")]) < 80


def test_aggregator_under_20000_garbage_connections_counts_all_and_logs_a_few_lines(aggregator, capfd):
    n = 20_000
    h = aggregator(nproc_per_node=1)
    real = NodePeer(h.port, 0)
    real.join(0)
    real.steps(0, 5)
    flood, opened, release = _start_flood(h.port, n, b"GARBAGE!" * 8, hold=False)
    deadline = time.monotonic() + 300
    while opened.value < n and time.monotonic() < deadline:
        time.sleep(0.1)
    release.set()
    flood.join(30)
    # every connection the flood opened is refused once the aggregator has read it: on a loaded
    # machine its accept backlog can still hold some when the flood ends (the run's end would
    # then leave them unread, as CI once saw), so the test waits for the count it asserts on
    deadline = time.monotonic() + 300
    while (st := h.status()) is None or st["refused"] < opened.value:
        assert time.monotonic() < deadline, (st, opened.value)
        time.sleep(0.2)
    real.steps(0, 5)
    real.rank_bye(0)
    real.gone(0)
    s = json.loads(h.finish(0).summary_json.read_text())
    err = capfd.readouterr().err
    refused = s["telemetry"]["wire"]["refused"]
    lines = [ln for ln in err.splitlines() if re.match(r"traceml-aggregator: .*(refused|closing)", ln)]
    print(f"{opened.value} garbage connections: {refused} refused, {len(lines)} log lines")
    assert refused == opened.value >= n * 0.95
    assert len(lines) <= 20 + n // 1000 + 2, len(lines)
    assert any("refused so far" in ln for ln in lines), "the running count is logged"
    assert s["ranks"][0]["steps"] == 10
