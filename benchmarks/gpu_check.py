"""GPU check: one short prepared run for a machine with a CUDA GPU (under 5 minutes; ~2 with --quick).

What it measures and checks, on the real device:

1. **Per-step overhead of ``trace_step`` on a CUDA model**, two sizes (a launch-bound small MLP and
   a compute-bound wide one). Blocks of the untraced and the traced loop alternate (ABBA); each
   block is timed on the host (with a ``synchronize`` at its end only) and on the device with a
   pair of CUDA events around the whole block, so the figures are per step of real device work.
   The traced loop is the SDK's CUDA path: phases bracketed by CUDA events, rows committed once
   the events completed, shipped to a real aggregator.
2. **The SDK's CUDA-event phase times are right**: from the aggregator's final summary, forward +
   backward + optimizer per step (CUDA-event times) against the step's own device time measured
   here, and how many rows fell back to host times.
3. **NVML sampling cost**: the system sampler's ``sample()`` (every visible GPU: utilisation,
   memory, temperature, power), microseconds per call (the launcher calls it once a second).
4. **Verdicts end to end**: ``traceml run`` on ``examples/input_bound.py`` must say
   ``input_bound``; on ``examples/ddp_minimal.py`` it must not, with GPU phases and GPU samples
   in the summary.
5. **Communication timing with CUDA events** (NCCL, on min(2, visible) GPUs): ``traceml run`` on
   tests/unit/scripts/comm_train.py, DDP with several gradient buckets, then explicit collectives:
   every bucket and every collective counted with its bytes, an in-flight time measured from the
   events, the summary's device ``cuda`` and its communication section filled, few host-time
   fallbacks, and a communication verdict, if any, with GPU advice.

On a machine without CUDA it says so and exits 0 (so CI can run it anywhere):

    python benchmarks/gpu_check.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TOKEN = "gpu-check-token"
RUN = "gpu-check"
TARGET_US = 5.0
#: the SDK's CUDA phases may differ from the step's device time by this much (launch gaps, idle)
PHASE_TOLERANCE = 0.25


def skip(why: str) -> int:
    print(f"gpu_check: SKIPPED: {why}. Nothing was measured; run this on a machine with a CUDA GPU.")
    return 0


def pairs_median(a: list[float], b: list[float]) -> tuple[float, float, float]:
    d = sorted(y - x for x, y in zip(a, b))
    return statistics.median(a), statistics.median(b), statistics.median(d)


def overhead(torch: Any, traceml: Any, size: str, steps: int, reps: int) -> dict[str, Any]:
    """Paired untraced/traced blocks of one model size; µs per step, host and device."""
    import torch.nn as nn
    import torch.nn.functional as F
    from traceml_core.sdk.tracer import TRACER

    patches = TRACER.patches
    dev = torch.device("cuda", torch.cuda.current_device())
    width, batch = (256, 64) if size == "small" else (4096, 1024)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = [torch.randn(batch, width, device=dev) for _ in range(8)]
    ys = [torch.randn(batch, 1, device=dev) for _ in range(8)]
    rec = TRACER.rec
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def block(traced: bool) -> tuple[float, float]:
        if traced:
            patches.install_global()
            if TRACER.events is not None:     # after the first traced CUDA step
                patches.install_copy_timing()
            TRACER.models.discard(id(model))
            TRACER.register_model(model)
        else:
            patches.uninstall()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev0.record()
        for i in range(steps):
            x, y = xs[i % 8], ys[i % 8]
            if traced:
                with traceml.trace_step(model):
                    loss = F.mse_loss(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            else:
                loss = F.mse_loss(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        ev1.record()
        torch.cuda.synchronize()
        host = (time.perf_counter() - t0) / steps * 1e6
        device = ev0.elapsed_time(ev1) / steps * 1e3
        return host, device

    for _ in range(2):
        block(True)
        block(False)
    ha, hb, da, db = [], [], [], []
    count0 = rec.count
    for i in range(reps):
        order = (False, True) if i % 2 == 0 else (True, False)
        for traced in order:
            h, d = block(traced)
            (hb if traced else ha).append(h)
            (db if traced else da).append(d)
    patches.install_global()
    host = pairs_median(ha, hb)
    device = pairs_median(da, db)
    return {"size": size, "width": width, "batch": batch, "steps_per_block": steps, "blocks": reps,
            "host_untraced_us": host[0], "host_traced_us": host[1], "host_overhead_us": host[2],
            "device_untraced_us": device[0], "device_traced_us": device[1],
            "device_overhead_us": device[2], "traced_steps": rec.count - count0}


def nvml_cost(reps: int = 200) -> Optional[dict[str, Any]]:
    from traceml_core.sdk.samplers.system import SystemSampler, visible_gpus_from_env

    sampler = SystemSampler(gpus=visible_gpus_from_env(os.environ))
    try:
        if sampler.gpu_count == 0:
            return None
        sampler.sample()
        t0 = time.perf_counter()
        for _ in range(reps):
            last = sampler.sample()
        us = (time.perf_counter() - t0) / reps * 1e6
        return {"gpus": sampler.gpu_count, "us_per_sample": us, "us_per_gpu": us / sampler.gpu_count,
                "last": last.get("gpus")}
    finally:
        sampler.close()


def traceml_run(script: str, args: list[str], work: Path, name: str, timeout: float, *,
                nproc: int = 1, env_extra: Optional[dict[str, str]] = None,
                stdout: Optional[list[str]] = None) -> dict[str, Any]:
    """``traceml run`` on ``examples/<script>`` (or the path ``script``); its summary."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(env_extra or {})
    path_ = Path(script) if os.sep in script else REPO / "examples" / script
    cmd = [sys.executable, "-m", "traceml_core.cli", "run", f"--nproc-per-node={nproc}",
           f"--logs-dir={work}", f"--run-name={name}", "--master-port=29640",
           "--aggregator-port=29641", str(path_), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if stdout is not None:
        stdout.append(proc.stdout)
    path = work / name / "final_summary.json"
    if proc.returncode != 0 or not path.exists():
        raise RuntimeError(f"traceml run {script} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(path.read_text())


def comm_checks(torch: Any, work: Path) -> list[tuple[str, bool, str]]:
    """Check 5: DDP buckets and explicit collectives on NCCL, timed with CUDA events."""
    script = str(REPO / "tests" / "unit" / "scripts" / "comm_train.py")
    nproc = min(2, torch.cuda.device_count())
    checks: list[tuple[str, bool, str]] = []
    out: list[str] = []
    s = traceml_run(script, [], work, "comm-ddp", 240, nproc=nproc, stdout=out,
                    env_extra={"COMM_DEVICE": "cuda", "COMM_MODE": "ddp", "COMM_STEPS": "60"})
    facts = [json.loads(line.split(" ", 1)[1]) for line in out[0].splitlines()
             if line.startswith("COMM_FACTS ")]
    f = facts[0] if facts else {}
    c = s.get("communication") or {}
    ranks = [r for r in s.get("ranks", []) if r.get("comm")]
    calls = [r["comm"]["calls_per_step"] for r in ranks]
    nbytes = [r["comm"]["bytes_per_step"] for r in ranks]
    checks.append(("comm (DDP, NCCL): device cuda, every rank's communication measured",
                   s.get("device") == "cuda" and len(ranks) == nproc and bool(c.get("measured")),
                   f"device {s.get('device')}, {len(ranks)} of {nproc} ranks measured"))
    checks.append(("comm (DDP, NCCL): one timed all-reduce per bucket, every gradient byte once",
                   bool(calls) and all(x == f.get("buckets") for x in calls)
                   and all(b == f.get("grad_bytes") for b in nbytes),
                   f"calls/step {calls} (buckets {f.get('buckets')}), bytes/step {nbytes} "
                   f"(gradients {f.get('grad_bytes')})"))
    busy = [r["comm"]["busy_ms"] for r in ranks]
    bw = [r["comm"]["busbw_gbps"] for r in ranks]
    checks.append(("comm (DDP, NCCL): in-flight time from CUDA events, exposed <= in flight",
                   bool(busy) and all(b and b > 0 for b in busy)
                   and all(r["comm"]["exposed_ms"] <= r["comm"]["busy_ms"] * 1.05 + 0.01 for r in ranks),
                   f"busy {busy} ms, exposed {[r['comm']['exposed_ms'] for r in ranks]} ms, busbw {bw} GB/s"))
    bwd = [(r["phases"].get("backward") or {}).get("steady_mean_ms") for r in s.get("ranks", [])]
    checks.append(("comm (DDP, NCCL): backward measured without the wait (>= 0)",
                   all(b is not None and b >= 0 for b in bwd), f"backward {bwd} ms"))
    for v in [s.get("verdict") or {}] + (s.get("other_verdicts") or []):
        if v.get("kind") == "communication_bound":
            checks.append(("comm verdict on a GPU run gives GPU advice, not gloo's",
                           "GLOO_SOCKET_IFNAME" not in v["next_step"], v["next_step"][:160]))
    out.clear()
    s = traceml_run(script, [], work, "comm-explicit", 240, nproc=nproc, stdout=out,
                    env_extra={"COMM_DEVICE": "cuda", "COMM_MODE": "explicit", "COMM_STEPS": "40",
                               "COMM_NUMEL": str(1 << 22)})
    facts = [json.loads(line.split(" ", 1)[1]) for line in out[0].splitlines()
             if line.startswith("COMM_FACTS ")]
    f = facts[0] if facts else {}
    ranks = [r for r in s.get("ranks", []) if r.get("comm")]
    got = [(r["comm"]["calls_per_step"], r["comm"]["bytes_per_step"], r["comm"]["busy_ms"])
           for r in ranks]
    checks.append(("comm (explicit NCCL collectives, async wait included): counted with their bytes",
                   len(ranks) == nproc and all(cl == f.get("calls_per_step") and b == f.get("bytes_per_step")
                                               and busy > 0 for cl, b, busy in got),
                   f"(calls, bytes, busy ms) per rank {got}; expected {f.get('calls_per_step')} calls, "
                   f"{f.get('bytes_per_step')} bytes"))
    return checks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer blocks (about 2 minutes)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    started = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        return skip(f"torch cannot be imported ({exc})")
    if not torch.cuda.is_available():
        return skip(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")

    import traceml_core as traceml
    from traceml_core.aggregator.settings import AggregatorSettings

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} visible")
    checks: list[tuple[str, bool, str]] = []
    out: dict[str, Any] = {"device": props.name, "torch": torch.__version__}
    work = Path(tempfile.mkdtemp(prefix="traceml-gpu-check-"))

    # 1 + 2: overhead, through a real aggregator, and the SDK's CUDA phase times
    steps, reps = (200, 10) if args.quick else (300, 30)
    from _bench_common import LocalRun

    run = LocalRun(AggregatorSettings(run_name=RUN, token=TOKEN, run_dir=work / RUN, port=0,
                                      nnodes=1, nproc_per_node=1, drain_s=2.0))
    h = run.handle
    try:
        ok = traceml.init(aggregator=run.address, token=TOKEN, run_name=RUN, rank=0,
                          local_rank=0, world_size=1, connect_wait=10,
                          max_buffered_steps=1 << 20)
        if not ok or not traceml.stats().get("connected"):
            raise RuntimeError(f"traceml.init did not connect to the aggregator: {traceml.stats()}")
        results = [overhead(torch, traceml, size, steps, reps) for size in ("small", "wide")]
        from traceml_core.sdk.tracer import TRACER

        fallbacks = getattr(TRACER.events, "fallbacks", None)
        traced = sum(r["traced_steps"] for r in results)
        traceml.shutdown()
        res = run.finish(0)
    finally:
        if h.alive():
            run.kill()
    summary = json.loads(res.summary_json.read_text()) if res.summary_json else {}
    rank = (summary.get("ranks") or [{}])[0]
    print(f"\nper-step overhead on the device, {reps} blocks x {steps} steps per loop, alternating; us per step")
    print(f"{'model':<22}{'untraced':>10}{'traced':>10}{'overhead':>10}   {'host: untraced':>15}{'traced':>10}{'overhead':>10}")
    for r in results:
        print(f"{r['size'] + ' ' + str(r['width']) + 'x' + str(r['batch']):<22}"
              f"{r['device_untraced_us']:>10.1f}{r['device_traced_us']:>10.1f}{r['device_overhead_us']:>10.2f}   "
              f"{r['host_untraced_us']:>15.1f}{r['host_traced_us']:>10.1f}{r['host_overhead_us']:>10.2f}")
    worst = max(r["host_overhead_us"] for r in results)
    checks.append(("per-step overhead <= 5 us (host clock, worst model)", worst <= TARGET_US,
                   f"{worst:.2f} us"))
    out["overhead"] = results

    phases = rank.get("phases") or {}
    fwd, bwd, opt = ((phases.get(k) or {}).get("mean_ms") for k in ("forward", "backward", "optimizer"))
    tel = summary.get("telemetry", {})
    checks.append(("every traced step reached the aggregator",
                   tel.get("records_received") == traced and tel.get("records_lost") == 0,
                   f"{tel.get('records_received')} of {traced}, lost {tel.get('records_lost')}"))
    if None not in (fwd, bwd, opt):
        # the steps of both sizes were traced: compare with the step-weighted device time of both
        dev_ms = sum(r["device_traced_us"] * r["traced_steps"] for r in results) / max(1, traced) / 1e3
        phase_ms = fwd + bwd + opt
        rel = abs(phase_ms - dev_ms) / dev_ms if dev_ms else float("inf")
        checks.append(("CUDA-event phases (fwd+bwd+opt) match the step's device time",
                       rel <= PHASE_TOLERANCE,
                       f"{phase_ms:.3f} ms vs {dev_ms:.3f} ms ({100 * rel:.0f} % apart; "
                       f"fwd {fwd:.3f}, bwd {bwd:.3f}, opt {opt:.3f})"))
    else:
        checks.append(("CUDA-event phases recorded", False, f"phases in the summary: {phases}"))
    checks.append(("rows committed with CUDA-event times (host-time fallbacks < 1 %)",
                   fallbacks is not None and fallbacks < 0.01 * max(1, traced),
                   f"{fallbacks} fallbacks of {traced} steps"))
    out["phases_ms"] = {"forward": fwd, "backward": bwd, "optimizer": opt, "fallbacks": fallbacks}

    # 3: NVML
    try:
        nv = nvml_cost()
    except Exception as exc:
        nv = None
        print(f"NVML sampling: unavailable ({type(exc).__name__}: {exc})")
    if nv is None:
        checks.append(("NVML sampling works", False, "no GPU through NVML (pynvml missing or no driver)"))
    else:
        print(f"\nNVML sampling: {nv['us_per_sample']:.0f} us per sample of {nv['gpus']} GPU(s) "
              f"({nv['us_per_gpu']:.0f} us per GPU; once a second: "
              f"{nv['us_per_sample'] / 1e4:.3f} % of one core); last: {nv['last']}")
        checks.append(("NVML sample < 5 ms (1 Hz sampling < 0.5 % of a core)", nv["us_per_sample"] < 5000,
                       f"{nv['us_per_sample']:.0f} us"))
    out["nvml"] = nv

    # 4: verdicts end to end, through `traceml run`
    try:
        slow = traceml_run("input_bound.py", ["--steps", "25"], work, "input", 150)
        kinds = [slow["verdict"]["kind"]] + [v["kind"] for v in slow.get("other_verdicts", [])]
        checks.append(("input_bound example -> input_bound verdict", slow["verdict"]["kind"] == "input_bound",
                       f"verdicts {kinds}"))
        fast = traceml_run("ddp_minimal.py", ["--steps", "300"], work, "minimal", 150)
        ph = fast["ranks"][0]["phases"]
        gpu_seen = fast["system"]["gpu_util_pct_mean"] is not None
        checks.append(("ddp_minimal -> not input_bound; GPU phases and GPU samples in the summary",
                       fast["verdict"]["kind"] != "input_bound" and bool(ph.get("forward"))
                       and bool(ph.get("backward")) and gpu_seen,
                       f"verdict {fast['verdict']['kind']}, forward {ph.get('forward', {}) and ph['forward'].get('mean_ms')} ms, "
                       f"GPU util mean {fast['system']['gpu_util_pct_mean']}"))
    except Exception as exc:
        checks.append(("verdicts end to end", False, f"{type(exc).__name__}: {exc}"))

    # 5: communication timing with CUDA events
    try:
        checks += comm_checks(torch, work)
    except Exception as exc:
        checks.append(("communication timing with CUDA events", False, f"{type(exc).__name__}: {exc}"))

    print("\nchecks:")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    out["checks"] = [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks]
    out["seconds"] = time.monotonic() - started
    print(f"gpu_check: {sum(ok for _, ok, _ in checks)}/{len(checks)} checks passed in "
          f"{out['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
