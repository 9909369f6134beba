"""Throughput and MFU from the work per step the script declares (``traceml.declare_work``):
tokens/s and samples/s per node, over the attempt's allocation and while stepping, and the model
FLOPs utilisation against the device's dense peak for the declared dtype, where
:data:`PEAK_FLOPS` knows the device. A figure that cannot be had is None, with why and how to get
it in ``not_measured``: never a 0.
"""

from __future__ import annotations

from typing import Optional

from ...rundata import RunData
from .ledger import AttemptLedger, NodeThroughput, Throughput

#: how a script declares its work (the "not measured" words point here)
HOW = ("call traceml.declare_work(tokens_per_step=..., samples_per_step=..., flops_per_step=..., "
       "dtype=\"bf16\") once in the training script (docs/goodput.md#throughput-and-mfu)")

#: dense tensor-core peak FLOP/s by device name (NVML's, which torch.cuda.get_device_name also
#: gives) and dtype, from NVIDIA's data sheets (SXM parts unless named; sparsity not counted).
#: The first entry whose key the device name contains wins, so longer names come first.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp8": 1513e12, "tf32": 378e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "fp8": 1671e12, "tf32": 418e12, "fp32": 60e12}),
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12}),
    ("GH200", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12}),
    ("B200", {"bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12, "tf32": 1100e12, "fp32": 80e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp8": 733e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp8": 242e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
)


def peak_flops(device: Optional[str], dtype: Optional[str]) -> Optional[float]:
    if not device or not dtype:
        return None
    for key, table in PEAK_FLOPS:
        if key.lower() in device.lower():
            return table.get(dtype.lower())
    return None



def throughput(data: RunData, current: AttemptLedger, device: str) -> Throughput:
    """Tokens/s and samples/s per node (over the attempt's allocation, and while stepping) and
    MFU, from the work per step the ranks declared; ``not_measured`` says why a figure is missing.
    Steps an earlier attempt had done already (redone) are not counted as throughput."""
    out = Throughput()
    works = {r.rank: r.facts.work for r in data.ranks if r.facts.work is not None}
    if not works:
        why = f"no rank declared what a step is worth: {HOW}"
        out.not_measured = {"tokens_per_s": why, "samples_per_s": why, "mfu": why}
        return out
    wall = current.wall_s or 0.0
    redone = current.progress.redone_steps or 0
    tokens: dict[int, float] = {}
    samples: dict[int, float] = {}
    step_s: dict[int, list[float]] = {}
    flops = flop_s = 0.0
    peaks: set[Optional[float]] = set()
    names: set[str] = set()
    for r in data.ranks:
        w = works.get(r.rank)
        if w is None:
            continue
        node = r.node or 0
        steps = max(0, max(r.last_step + 1, r.phase("step_ns").count) - redone)
        if w.tokens_per_step is not None:
            tokens[node] = tokens.get(node, 0.0) + w.tokens_per_step * steps
        if w.samples_per_step is not None:
            samples[node] = samples.get(node, 0.0) + w.samples_per_step * steps
        if r.phase("step_ns").count:
            step_s.setdefault(node, []).append(r.phase("step_ns").sum / 1e9)
        if w.flops_per_step is not None:
            flops += w.flops_per_step * r.phase("step_ns").count
            flop_s += r.phase("step_ns").sum / 1e9
            peaks.add(peak_flops(w.device, w.dtype))
            names.add(f"{w.device or 'an unnamed device'} {w.dtype or '(no dtype declared)'}")
    declared = {k: any(getattr(w, k) is not None for w in works.values())
                for k in ("tokens_per_step", "samples_per_step", "flops_per_step")}
    for node in sorted(set(tokens) | set(samples)):
        mean_step = sum(step_s.get(node, [])) / len(step_s[node]) if step_s.get(node) else 0.0

        def rate(amounts: dict[int, float], per: float) -> Optional[float]:
            return round(amounts[node] / per, 2) if node in amounts and per > 0 else None

        out.nodes.append(NodeThroughput(node, rate(tokens, wall), rate(tokens, mean_step),
                                        rate(samples, wall), rate(samples, mean_step)))
    for key, amounts, name in (("tokens_per_s", tokens, "tokens_per_step"), ("samples_per_s", samples, "samples_per_step")):
        if declared[name] and wall > 0:
            setattr(out, key, round(sum(amounts.values()) / wall, 2))
        else:
            out.not_measured[key] = f"no rank declared {name}: {HOW}"
    if device != "cuda":
        out.not_measured["mfu"] = ("no peak FLOP/s for this device (CPU): MFU is measured against a GPU's peak"
                                   if device == "cpu" else "no peak FLOP/s for this device: it is not known to be a GPU")
    elif flops <= 0:
        out.not_measured["mfu"] = f"no rank declared flops_per_step: {HOW}"
    elif len(peaks) != 1 or None in peaks:
        out.not_measured["mfu"] = (f"no peak FLOP/s for this device ({', '.join(sorted(names))}) in TraceML's table "
                                   "(docs/goodput.md#throughput-and-mfu): declare the dtype "
                                   "(declare_work(dtype=\"bf16\")), or tell us the device's peak")
    elif flop_s > 0:
        peak = peaks.pop()
        assert peak is not None
        out.peak_flops, out.peak_source = peak, ", ".join(sorted(names))
        out.mfu = round(flops / flop_s / peak, 4)
    return out
