"""Everything that needs torch runs here, in a child process, never in the doctor itself.

Why a child: importing torch costs a second or more, may hang on a slow filesystem, may crash the
interpreter (a CUDA build without its libraries, a half-installed wheel). In a child each of those
is a failed check with a reason, bounded by a timeout, and the doctor keeps going.

``python -m traceml_slurm.doctor.torchprobe info [--cuda-init] [--bench]``  versions, CUDA build,
devices, and the micro-benchmarks (a matmul on the CPU and on each device, the host-to-device copy)
``python -m traceml_slurm.doctor.torchprobe gloo ADDR PORT RANK WORLD TIMEOUT``  one all-reduce
``python -m traceml_slurm.doctor.torchprobe nccl ADDR PORT RANK WORLD TIMEOUT SIZES``  bandwidth

The child prints a line ``TRACEML_DOCTOR_RESULT <json>`` (other output, say from a
sitecustomize, is ignored); :func:`run_probe` starts it and reads the last such line. ``info``
prints one after each stage (:data:`STALLED_IN`), so a child stopped at the timeout still says how far
it got: an import that did not finish is not a broken torch, and CUDA that did not initialise is
not a slow import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

MARKER = "TRACEML_DOCTOR_RESULT "
#: what the doctor asks of torch on every node: versions, devices, and CUDA initialised on every
#: device torch sees (when it sees none, CUDA's error, which the GPU checks show when Slurm allocated
#: GPUs), then the micro-benchmarks. Always the same, so it can start before anything else is known
#: (doctor --local).
INFO_ARGS = ("info", "--cuda-init", "--bench")
#: ``info``'s stages, each reported when it is done: torch imported with its facts (versions, CUDA
#: build, gloo), CUDA initialised on each device, the micro-benchmarks run. What the probe was doing
#: when its time ran out is the stage after the last one reported.
FACTS, CUDA, BENCH = "facts", "cuda", "bench"
#: what did not finish, by the last stage reported (none: the import itself)
IMPORT = "`import torch`"
STALLED_IN = {None: IMPORT, FACTS: "CUDA initialisation", CUDA: "the micro-benchmarks", BENCH: "the probe's exit"}
#: the micro-benchmarks: best of BENCH_REPS windows of BENCH_WINDOW_S each. A window is longer than
#: a CPU quota's period (100 ms by default), so a cgroup CPU limit shows in every window; the best
#: window ignores a moment of load from elsewhere.
BENCH_REPS = 3
BENCH_WINDOW_S = 0.2
#: CPU matmul side (float32: 2*N^3 flops, a few ms on one core) and the GPU's (bf16)
BENCH_CPU_N = 256
BENCH_GPU_N = 4096
#: bytes of one host-to-device copy (pinned memory)
BENCH_H2D_BYTES = 64 << 20


# -- parent side -----------------------------------------------------------------------------------

@dataclass
class ProbeResult:
    """What a child said (``data``), or why it said nothing (``error``)."""

    data: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def _child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment, plus our package's directory at the END of PYTHONPATH.

    At the end, so that whatever the user put first (a different torch, a broken one) is what the
    child imports, exactly as the training would.
    """
    env = dict(environ)
    ours = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ours not in parts:
        parts.append(ours)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class ProbeProcess:
    """A started child; :meth:`result` waits for it, at most ``timeout`` seconds after its start."""

    def __init__(self, args: Sequence[str], timeout: float, environ: Optional[Mapping[str, str]] = None,
                 python: Optional[str] = None) -> None:
        self.args = list(args)
        self.timeout = timeout
        self.started = time.monotonic()
        cmd = [python or sys.executable, "-m", "traceml_slurm.doctor.torchprobe", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=_child_env(os.environ if environ is None else environ),
                                     start_new_session=True, text=True, errors="replace")
        self._result: Optional[ProbeResult] = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def done(self) -> bool:
        return self._result is not None or self.proc.poll() is not None

    def result(self) -> ProbeResult:
        if self._result is not None:
            return self._result
        left = max(0.0, self.timeout - self.elapsed())
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            self._result = ProbeResult(error=f"no answer within {self.timeout:.0f} s", seconds=self.elapsed(),
                                       timed_out=True, data=_parse(out) or {})
            return self._result
        self._result = _interpret(self.proc.returncode, out, err, self.elapsed())
        return self._result

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_probe(args: Sequence[str], timeout: float, environ: Optional[Mapping[str, str]] = None) -> ProbeResult:
    return ProbeProcess(args, timeout, environ).result()


def _parse(out: str) -> Optional[dict[str, Any]]:
    for line in reversed((out or "").splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _interpret(code: int, out: str, err: str, seconds: float) -> ProbeResult:
    data = _parse(out)
    if data is not None:
        return ProbeResult(data=data, seconds=seconds)
    tail = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
    last = tail[-1].strip() if tail else "no output"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return ProbeResult(error=f"python died of {name} ({last})", seconds=seconds)
    return ProbeResult(error=f"exit status {code}: {last}", seconds=seconds)


@dataclass
class TorchInfo:
    """torch as the training would see it on this node (from ``torchprobe info``)."""

    error: Optional[str] = None
    version: Optional[str] = None
    path: Optional[str] = None
    cuda_build: Optional[str] = None
    device_count: Optional[int] = None
    nccl_version: Optional[str] = None
    gloo: Optional[bool] = None
    cuda_init: list[dict[str, Any]] = field(default_factory=list)
    cuda_error: Optional[str] = None
    import_s: Optional[float] = None
    #: what did not finish within the timeout ("`import torch`", "CUDA initialisation", "the
    #: micro-benchmarks"), None when the probe answered in time. After the import, the facts
    #: above are real and ``error`` is None: only what came after is missing
    stalled: Optional[str] = None
    #: the probe's bound, seconds (for the words "did not finish within N s")
    timeout_s: Optional[float] = None
    #: the micro-benchmarks (:func:`_bench`): ``cpu`` {gflops, threads}, ``gpus`` [{index, gflops,
    #: h2d_gbps}], ``error``; None when they did not run
    bench: Optional[dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def stall_words(self) -> Optional[str]:
        """"CUDA initialisation did not finish within 15 s", None when nothing stalled."""
        if self.stalled is None:
            return None
        return f"{self.stalled} did not finish within {self.timeout_s or 0:.0f} s"

    @classmethod
    def from_probe(cls, r: ProbeResult, timeout_s: Optional[float] = None) -> "TorchInfo":
        d = r.data
        stalled = STALLED_IN.get(d.get("stage"), IMPORT) if r.timed_out else None
        if stalled == IMPORT:   # nothing of torch is known; not a broken torch either
            info = cls(stalled=stalled, timeout_s=timeout_s)
            info.error = info.stall_words
            return info
        if not r.ok and not d.get("version"):
            return cls(error=r.error)
        return cls(error=d.get("error") or (None if stalled else r.error), version=d.get("version"), path=d.get("path"),
                   cuda_build=d.get("cuda_build"), device_count=d.get("device_count"),
                   nccl_version=d.get("nccl_version"), gloo=d.get("gloo"), cuda_init=list(d.get("cuda_init") or []),
                   cuda_error=d.get("cuda_error"), import_s=d.get("import_s"),
                   bench=d.get("bench") if isinstance(d.get("bench"), dict) else None,
                   stalled=stalled, timeout_s=timeout_s)


# -- child side ------------------------------------------------------------------------------------

def _emit(data: dict[str, Any]) -> None:
    sys.stdout.write(MARKER + json.dumps(data) + "\n")
    sys.stdout.flush()


def _best_rate(work: Any, amount: float, sync: Any = None) -> float:
    """``amount`` per second of ``work()``, the best of :data:`BENCH_REPS` windows of
    :data:`BENCH_WINDOW_S` (``sync()`` waits for queued device work)."""
    work()
    if sync is not None:
        sync()
    best = 0.0
    for _ in range(BENCH_REPS):
        n, t0 = 0, time.perf_counter()
        while True:
            work()
            n += 1
            if sync is not None:
                sync()
            dt = time.perf_counter() - t0
            if dt >= BENCH_WINDOW_S:
                break
        best = max(best, n * amount / dt)
    return best


def _throttled_share(before: Optional[tuple[int, int]], after: Optional[tuple[int, int]]) -> Optional[float]:
    """The share of the cgroup's CPU-quota periods during the benchmark in which the quota
    throttled it (None: no cpu controller, or no period passed: no quota)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return round((after[1] - before[1]) / (after[0] - before[0]), 3)


def _bench(torch: Any, devices: list[int]) -> dict[str, Any]:
    """The doctor's micro-benchmarks: a float32 matmul on the CPU (with the threads torch uses here,
    as the training's main process would; with the CPU quota of its cgroup and the share of the
    quota's periods that throttled it meanwhile, which tells a quota from other processes' load), and on each CUDA device that initialised a bf16 matmul and a pinned
    host-to-device copy. Figures only: the nodes are compared with each other by the coordinator
    (crossnode.compute_speed) and kept across jobs (docs/node-health.md)."""
    from traceml_core.selftest import cpu_cgroup

    out: dict[str, Any] = {}
    try:
        n = BENCH_CPU_N
        a, b = torch.randn(n, n), torch.randn(n, n)
        cg = cpu_cgroup()
        before = cg.periods() if cg is not None else None
        gflops = _best_rate(lambda: torch.mm(a, b), 2.0 * n ** 3 / 1e9)
        after = cg.periods() if cg is not None else None
        out["cpu"] = {"gflops": round(gflops, 3), "threads": int(torch.get_num_threads()), "n": n,
                      "quota_cpus": cg.quota_cpus() if cg is not None else None,
                      "throttled": _throttled_share(before, after)}
    except BaseException as exc:  # noqa: BLE001 - report it, keep the other figures
        out["cpu"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    gpus = []
    for i in devices:
        row: dict[str, Any] = {"index": i}
        try:
            dev = torch.device(f"cuda:{i}")
            n = BENCH_GPU_N
            a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
            row["gflops"] = round(_best_rate(lambda: torch.mm(a, b), 2.0 * n ** 3 / 1e9, sync), 1)
            host = torch.empty(BENCH_H2D_BYTES, dtype=torch.uint8).pin_memory()
            dst = torch.empty(BENCH_H2D_BYTES, dtype=torch.uint8, device=dev)
            row["h2d_gbps"] = round(_best_rate(lambda: dst.copy_(host, non_blocking=True),
                                               BENCH_H2D_BYTES / 1e9, sync), 3)
            del a, b, host, dst
            torch.cuda.empty_cache()
        except BaseException as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        gpus.append(row)
    out["gpus"] = gpus
    return out


def _info(cuda_init: bool, bench: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - a broken torch raises anything
        return {"error": f"import torch failed: {type(exc).__name__}: {exc}".strip()}
    out["import_s"] = round(time.perf_counter() - t0, 3)
    out["version"] = str(getattr(torch, "__version__", "?"))
    out["path"] = str(Path(getattr(torch, "__file__", "") or "?").parent)
    try:
        out["cuda_build"] = torch.version.cuda
        import torch.distributed as dist

        out["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
        out["device_count"] = int(torch.cuda.device_count()) if out["cuda_build"] else 0
        if out["cuda_build"]:
            try:
                out["nccl_version"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            except Exception as exc:  # noqa: BLE001
                out["nccl_version"] = None
                out["nccl_error"] = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:  # noqa: BLE001
        out["error"] = f"torch is importable but broken: {type(exc).__name__}: {exc}"
        return out
    _emit(dict(out, stage=FACTS))
    if cuda_init and out.get("device_count"):
        inits = []
        for i in range(out["device_count"]):
            t1 = time.perf_counter()
            try:
                torch.zeros(1, device=f"cuda:{i}")
                torch.cuda.synchronize(i)
                free, total = torch.cuda.mem_get_info(i)
                inits.append({"index": i, "ok": True, "seconds": round(time.perf_counter() - t1, 3),
                              "free": int(free), "total": int(total)})
            except BaseException as exc:  # noqa: BLE001
                inits.append({"index": i, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
        out["cuda_init"] = inits
    elif cuda_init and out.get("cuda_build"):
        try:
            torch.cuda.init()
        except BaseException as exc:  # noqa: BLE001
            out["cuda_error"] = f"{type(exc).__name__}: {exc}"[:300]
    _emit(dict(out, stage=CUDA))
    if bench:
        out["bench"] = _bench(torch, [d["index"] for d in out.get("cuda_init") or [] if d.get("ok")])
    out["stage"] = BENCH
    return out


def _init_url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"tcp://{host}:{port}"


def _gloo(addr: str, port: int, rank: int, world: int, timeout: float) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method=_init_url(addr, port), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    t1 = time.perf_counter()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    t2 = time.perf_counter()
    dist.destroy_process_group()
    return {"value": float(value.item()), "expected": world * (world + 1) / 2.0,
            "init_s": round(t1 - t0, 3), "allreduce_s": round(t2 - t1, 4)}


def _nccl(addr: str, port: int, rank: int, world: int, timeout: float, sizes: Sequence[int]) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=_init_url(addr, port), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    rows = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device="cuda")
        for _ in range(2):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        iters = 5
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        algbw = size / dt
        rows.append({"bytes": size, "seconds": round(dt, 6), "algbw_gbs": round(algbw / 1e9, 3),
                     "busbw_gbs": round(algbw * 2 * (world - 1) / world / 1e9, 3)})
    dist.destroy_process_group()
    return {"sizes": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    what = argv[0] if argv else "info"
    try:
        if what == "info":
            _emit(_info("--cuda-init" in argv, "--bench" in argv))
        elif what == "gloo":
            addr, port, rank, world, timeout = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5])
            _emit(_gloo(addr, port, rank, world, timeout))
        elif what == "nccl":
            addr, port, rank, world, timeout = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5])
            sizes = [int(s) for s in argv[6].split(",")]
            _emit(_nccl(addr, port, rank, world, timeout, sizes))
        else:
            _emit({"error": f"unknown probe {what!r}"})
    except BaseException as exc:  # noqa: BLE001 - report, never a traceback as the only output
        _emit({"error": f"{type(exc).__name__}: {exc}"[:500]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
