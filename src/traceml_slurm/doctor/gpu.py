"""GPU checks: the counts agree, CUDA initialises, the GPUs are ours alone.

Four witnesses count GPUs and they must agree: Slurm (``SLURM_GPUS_ON_NODE``), the device list it
exports (``CUDA_VISIBLE_DEVICES``), NVML, and torch (``torch.cuda.device_count()``); the launch
config's ``nproc_per_node`` must not exceed them.

A node with no GPU and a job that asked for none: "skipped: no GPU". A job that asked for GPUs on a
node where none exist (no driver, or a test cluster whose GRES are placeholders, like the local dev
cluster's /dev/null clones) FAILS: the launcher would start one worker per allocated GPU and each
would die at its first CUDA call. The fix says both ways out: drop the GPU request (TraceML then
starts CPU workers) or, for a CPU script on purpose, ``--ignore gpu``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from ..context import Context
from ..controller import ControllerError
from .controller import _facts
from .model import CheckSpec, Outcome, failed, passed, skipped, warned
from .node import NodeContext
from .thresholds import GPU_FOREIGN_MEMORY_BYTES
from .torchprobe import FACTS, IMPORT, STALLED_IN

if TYPE_CHECKING:
    from traceml_core.selftest import GpuDevice

NO_GPU = "no GPU"
NO_REAL_GPU_FIX = ("This node has no usable NVIDIA GPU. If the partition has none (a test cluster whose GRES are "
                   "placeholders), drop --gres/--gpus so TraceML starts CPU workers, or pass --ignore gpu for a "
                   "CPU-only script on purpose; otherwise ask the admins about the driver on {host} (nvidia-smi).")


def visible_devices(ctx: NodeContext) -> Optional[list[str]]:
    visible = ctx.facts.env.cuda_visible_devices
    return None if visible is None else list(visible)


def allocated(devices: list[GpuDevice], visible: Optional[list[str]]) -> list[GpuDevice]:
    """The NVML devices this job may use: those named by CUDA_VISIBLE_DEVICES (index or UUID)."""
    if visible is None:
        return list(devices)
    out = []
    for v in visible:
        for d in devices:
            if (v.isdigit() and d.index == int(v)) or (not v.isdigit() and d.uuid.startswith(v)):
                out.append(d)
                break
    return out


def _nproc(ctx: NodeContext) -> Optional[int]:
    c = ctx.launch().config
    return c.nproc_per_node if c is not None else None


def _job_gpu_request(ctx: NodeContext) -> Optional[str]:
    """What the job asked for in GPUs, from the controller (a shell on the login host has none of
    the per-node variables); None when the controller cannot be asked."""
    job = _facts(ctx, "job")
    if isinstance(job, ControllerError):
        return None  # no scontrol/pyslurm here, or the controller did not answer
    if job.tres_per_node and "gpu" in job.tres_per_node:
        return f"{job.tres_per_node} per node"
    if job.gres_per_node:
        return "; ".join(f"{h}: {g}" for h, g in sorted(job.gres_per_node.items())[:4])
    return "no GPUs"


def check_count(ctx: NodeContext) -> Outcome:
    if ctx.context is Context.SALLOC_SHELL:
        # the login host: no SLURM_GPUS_ON_NODE here, whatever the job asked for
        asked_text = _job_gpu_request(ctx)
        request = (f"the job asked for {asked_text} (from the controller)" if asked_text else
                   "what the job asked for is not in this shell's environment and the controller could not be asked")
        return skipped(f"this is the salloc shell on {ctx.hostname}, not a node of job {ctx.job_id}: its GPUs say "
                       f"nothing about the job's; {request}. Check a node of the job with `srun --overlap -N1 "
                       f"traceml slurm doctor --local`, or drop --local", job_gpus=asked_text)
    asked = ctx.gpus_on_node()
    visible = visible_devices(ctx)
    devices, nvml_error = ctx.nvml_devices()
    n_nvml = len(devices) if devices is not None else None
    if asked == 0 and not n_nvml:
        why = nvml_error or "NVML sees 0 devices"
        return skipped(f"{NO_GPU} (the job asked for none; {why})", nvml=n_nvml, slurm=asked)
    torch = ctx.torch()
    n_torch = torch.device_count if torch.ok else None
    nproc = _nproc(ctx)
    data = {"slurm": asked, "cuda_visible_devices": visible, "nvml": n_nvml, "torch": n_torch,
            "nproc_per_node": nproc, "nvml_error": nvml_error, "torch_error": torch.error}
    slurm = (ctx.gpus().source or "slurm:SLURM_GPUS_ON_NODE").removeprefix("slurm:")
    witnesses = (f"{slurm}={asked}, CUDA_VISIBLE_DEVICES="
                 f"{'unset' if visible is None else ','.join(visible) or 'empty'}, NVML "
                 f"{n_nvml if n_nvml is not None else 'unavailable'}, torch "
                 f"{n_torch if n_torch is not None else 'unavailable'}, nproc_per_node {nproc}")
    if asked == 0:
        return warned(f"this node has {n_nvml} GPUs but the job allocated none ({witnesses})",
                      "Request them: `--gres=gpu:N` or `--gpus-per-node=N` (TraceML starts one worker per GPU).", **data)
    if not n_nvml:
        return failed(f"Slurm allocated {asked} GPUs but this node has none usable ({nvml_error or 'NVML sees 0'}; "
                      f"{witnesses})", NO_REAL_GPU_FIX.format(host=ctx.hostname), **data)
    problems = []
    if visible is not None and len(visible) != asked:
        problems.append(f"CUDA_VISIBLE_DEVICES names {len(visible)} devices, not {asked}")
    if n_nvml < asked:
        problems.append(f"NVML sees only {n_nvml}")
    if n_torch is not None and n_torch != asked:
        problems.append(f"torch sees {n_torch}")
    if nproc is not None and nproc > asked:
        problems.append(f"nproc_per_node={nproc} would start more workers than GPUs")
    if problems:
        fix = ("Do not set CUDA_VISIBLE_DEVICES yourself (Slurm sets it per job), and let TraceML read the GPU count "
               "(drop --nproc-per-node / TRACEML_NPROC_PER_NODE).")
        if n_torch == 0 and torch.cuda_build is None and torch.ok:
            fix = "torch is a CPU build: install a CUDA build of torch in this environment."
        return failed(f"{asked} GPUs allocated, but " + "; ".join(problems) + f" ({witnesses})", fix, **data)
    if nproc is not None and nproc < asked:
        return warned(f"{asked} GPUs but nproc_per_node={nproc}: {asked - nproc} GPUs stay idle ({witnesses})",
                      "Drop --nproc-per-node / TRACEML_NPROC_PER_NODE so TraceML starts one worker per GPU.", **data)
    return passed(f"{asked} GPUs ({witnesses})", **data)


def check_cuda_init(ctx: NodeContext) -> Outcome:
    asked = ctx.gpus_on_node()
    devices, nvml_error = ctx.nvml_devices()
    if asked == 0 and not devices:
        return skipped(NO_GPU)
    torch = ctx.torch()
    if torch.stalled == IMPORT:
        return skipped(f"not measured: {torch.stall_words} (see sw.torch)")
    if not torch.ok:
        return failed(f"torch is unusable, so CUDA cannot be tried: {torch.error}",
                      "Fix the torch installation first (see sw.torch).")
    if torch.stalled == STALLED_IN[FACTS]:
        return failed(f"{torch.stall_words} on {ctx.hostname} ({asked} GPUs allocated)",
                      "A GPU or driver that hangs: check `nvidia-smi` and `dmesg` for Xid errors on this node, or "
                      "exclude it. A first CUDA context can also be slow: rerun with `--timeout 60` to tell.",
                      stalled=torch.stalled, timeout_s=torch.timeout_s)
    if not torch.cuda_build:
        return failed(f"torch {torch.version} is a CPU build: it cannot use the {asked} allocated GPUs",
                      "Install a CUDA build of torch matching the driver (pip install torch from the CUDA index).",
                      version=torch.version)
    if not torch.device_count:
        err = torch.cuda_error or nvml_error or "torch.cuda.device_count() is 0"
        return failed(f"CUDA finds no device: {err}", NO_REAL_GPU_FIX.format(host=ctx.hostname), cuda=torch.cuda_build)
    bad = [d for d in torch.cuda_init if not d.get("ok")]
    if bad:
        first = bad[0]
        return failed(f"CUDA fails on {len(bad)} of {len(torch.cuda_init)} devices; cuda:{first['index']}: {first.get('error')}",
                      "A GPU in a bad state (Xid error, ECC, another process holding it in exclusive mode): "
                      "ask the admins to check it, or exclude this node (--exclude).", devices=torch.cuda_init)
    slowest = max((d.get("seconds", 0.0) for d in torch.cuda_init), default=0.0)
    return passed(f"CUDA {torch.cuda_build} initialises on {len(torch.cuda_init)} devices (slowest {slowest:.2f} s)",
                  devices=torch.cuda_init)


def check_free(ctx: NodeContext) -> Outcome:
    asked = ctx.gpus_on_node()
    devices, nvml_error = ctx.nvml_devices()
    if not devices:
        return skipped(NO_GPU if asked == 0 else f"no NVML ({nvml_error}); see gpu.count")
    mine = allocated(devices, visible_devices(ctx))
    own = {os.getpid(), os.getppid()}
    foreign = []
    crowded = []
    for d in mine:
        procs = [p for p in d.processes if p.pid not in own]
        if procs:
            shown = ", ".join(f"pid {p.pid}" + (f" ({p.used_bytes / 1024**3:.1f} GiB)" if p.used_bytes else "") for p in procs)
            foreign.append(f"GPU {d.index}: {shown}")
        elif d.memory_used >= GPU_FOREIGN_MEMORY_BYTES:
            crowded.append(f"GPU {d.index}: {d.memory_used / 1024**3:.1f} GiB used with no visible process")
    data = {"devices": [{"index": d.index, "uuid": d.uuid, "memory_used": d.memory_used,
                         "processes": [p.pid for p in d.processes]} for d in mine]}
    if foreign:
        return failed("processes of others run on this job's GPUs: " + "; ".join(foreign),
                      "Another job or a leftover process is using the GPUs: end it (yours) or tell the admins; the "
                      "training would run out of memory or crawl.", **data)
    if crowded:
        return warned("; ".join(crowded),
                      "Memory is held from outside this job's view (another container?); check nvidia-smi on the node.", **data)
    return passed(f"{len(mine)} GPUs free of other processes", **data)


def check_health(ctx: NodeContext) -> Outcome:
    """NVML's health facts of the job's GPUs (the SDK's NVML layer, the real pynvml or the fake):
    a hardware fault (an XID of the hardware's, uncorrectable ECC errors, a failed row remapping)
    fails, a thermal or power slowdown warns. The outcome's ``faults`` and ``slowdowns`` go into
    the node store (doctor/nodehealth.py): a fault excludes the node at once, a slowdown when it
    repeats."""
    asked = ctx.gpus_on_node()
    devices, nvml_error = ctx.nvml_devices()
    if not devices:
        return skipped(NO_GPU if asked == 0 else f"no NVML ({nvml_error}); see gpu.count")
    nv = ctx.nvml()
    rows = []
    for d in allocated(devices, visible_devices(ctx)):
        try:
            rows.append(nv.health(nv.handle_by_index(d.index)))
        except Exception as exc:  # noqa: BLE001 - one device that cannot be read is not measured
            rows.append(None)
            ctx.progress.debug(f"GPU {d.index}: health not read ({type(exc).__name__}: {exc})")
    read = [h for h in rows if h is not None]
    faults = [f"GPU {h.index}: {'; '.join(h.faults)}" for h in read if h.faults]
    slowdowns = [f"GPU {h.index} held back ({', '.join(h.slowdowns)})" for h in read if h.slowdowns]
    unmeasured = sorted({f"{k} ({why})" for h in read for k, why in h.unmeasured})
    data = {"devices": [h.to_json() for h in read], "faults": faults, "slowdowns": slowdowns,
            "unmeasured": unmeasured}
    tail = f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""
    if faults:
        return failed("hardware fault: " + "; ".join(faults + slowdowns) + tail,
                      f"A GPU with a hardware fault slows or kills every job on it: exclude {ctx.node} "
                      f"(#SBATCH --exclude={ctx.node}) and tell the admins (nvidia-smi -q on {ctx.node}).", **data)
    if slowdowns:
        return warned("clocks reduced by heat or power: " + "; ".join(slowdowns) + tail,
                      f"The clocks are reduced: ask the admins to check {ctx.node}'s cooling and power "
                      "(nvidia-smi -q -d PERFORMANCE); `traceml slurm nodes` excludes it when it repeats.", **data)
    if not read:
        return skipped("NVML could not read any device's health" + tail, **data)
    return passed(f"{len(read)} GPUs: no hardware XID, no uncorrectable ECC error, no thermal or power slowdown"
                  + tail, **data)


CHECKS = (
    CheckSpec("gpu.count", "GPU counts agree", check_count),
    CheckSpec("gpu.cuda-init", "CUDA initialises", check_cuda_init),
    CheckSpec("gpu.free", "GPUs free of other processes", check_free),
    CheckSpec("gpu.health", "GPU health (XID, ECC, thermal and power slowdowns)", check_health),
)
