"""The node system sampler: real /proc for CPU and RAM, a fake NVML for the GPU fields."""

from __future__ import annotations

import time

from traceml_core.sdk.samplers import FakeGpu, FakeNvml, SystemReporter, SystemSampler
from traceml_core.sdk.samplers.system import visible_gpus_from_env
from traceml_core.wire.protocol import GPU_FIELDS, SYSTEM_FIELDS

GIB = 1024**3


def test_gpu_fields_flow_into_samples():
    nv = FakeNvml([
        FakeGpu(uuid="GPU-a", util_pct=97, mem_used=70 * GIB, mem_total=80 * GIB, temp_c=71, power_w=612.5),
        FakeGpu(uuid="GPU-b", util_pct=3, mem_used=1 * GIB, temp_c=35, power_w=80.0, unsupported={"power_w"}),
    ])
    s = SystemSampler(nv)
    time.sleep(0.05)
    sample = s.sample()
    assert tuple(sample) == SYSTEM_FIELDS
    a, b = sample["gpus"]
    assert tuple(a) == GPU_FIELDS
    assert a == {"index": 0, "util_pct": 97, "mem_used": 70 * GIB, "mem_total": 80 * GIB,
                 "temp_c": 71, "power_w": 612.5}
    assert b["util_pct"] == 3 and b["power_w"] is None, "an unsupported field is None, not 0"
    assert s.gpu_note == "2 GPU(s) via NVML"
    assert sample["ram_total"] > sample["ram_used"] > 0
    assert sample["cpu_pct"] is None or 0.0 <= sample["cpu_pct"] <= 100.0
    nv.gpus[0].util_pct = 12                   # values are read live on every sample
    assert s.sample()["gpus"][0]["util_pct"] == 12


def test_visible_devices_select_gpus_by_index_or_uuid():
    nv = FakeNvml([FakeGpu(uuid=f"GPU-{i}", util_pct=10 * i) for i in range(4)])
    assert visible_gpus_from_env({"CUDA_VISIBLE_DEVICES": "GPU-3,1"}) == ["GPU-3", "1"]
    s = SystemSampler(nv, gpus=visible_gpus_from_env({"CUDA_VISIBLE_DEVICES": "GPU-3,1"}))
    assert [(g["index"], g["util_pct"]) for g in s.sample()["gpus"]] == [(3, 30), (1, 10)]
    s2 = SystemSampler(nv, gpus=["7", "2"])
    assert [g["index"] for g in s2.sample()["gpus"]] == [2] and "skipped 7" in s2.gpu_note


def test_no_driver_says_so_once_and_samples_cpu_and_ram(traceml_log):
    s = SystemSampler(FakeNvml(unavailable="NVML Shared Library Not Found"))
    samples = [s.sample() for _ in range(3)]
    assert all(x["gpus"] == [] and x["ram_total"] for x in samples)
    notes = [r.getMessage() for r in traceml_log.records if "no GPU telemetry" in r.getMessage()]
    assert len(notes) == 1 and "NVML Shared Library Not Found" in notes[0]


def test_the_real_backend_without_a_driver_is_not_an_error(traceml_log):
    s = SystemSampler()          # pynvml on this machine: no driver here, or real GPUs on a node
    sample = s.sample()
    assert isinstance(sample["gpus"], list)
    assert s.gpu_note
    s.close()


def test_reporter_sends_system_frames_through_the_relay_to_node_0(rig):
    """What each node's launcher runs: a reporter feeding its relay's link to the aggregator."""
    import json

    nv = FakeNvml([FakeGpu(util_pct=55, temp_c=66)])
    h = rig(nproc_per_node=1)
    reporter = SystemReporter(lambda: SystemSampler(nv), h.relays[0].submit, node=0, host="node0",
                              interval=0.05).start()
    deadline = time.monotonic() + 10
    while reporter.frames < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    reporter.stop()
    s = json.loads(h.finish(0).summary_json.read_text())
    node = s["system"]["nodes"][0]
    assert node["node"] == 0 and node["samples"] >= 3
    gpu = node["gpus"][0]
    assert gpu["util_pct_mean"] == 55 and gpu["temp_c_max"] == 66


def test_one_nvml_layer_serves_the_sampler_and_the_doctor():
    """The sampler and the doctor read GPUs through the same module: the real backend and the fake
    have the same interface, and the doctor's default loader is that module's."""
    import inspect

    from traceml_core.sdk.samplers import nvml
    from traceml_slurm.doctor.node import NodeContext

    wanted = [n for n in vars(nvml.NvmlBackend) if not n.startswith("_")]
    assert {"init", "devices", "driver_version", "processes", "utilization_pct", "power_w"} <= set(wanted)
    for name in wanted:
        real = inspect.signature(getattr(nvml.PynvmlBackend, name))
        fake = inspect.signature(getattr(nvml.FakeNvml, name))
        assert list(real.parameters) == list(fake.parameters), name
    # the doctor's default loader (None: looked up on first use, so a doctor on a CPU node never
    # imports the samplers) is core's self-test entry, which is this module's loader
    from traceml_core import selftest

    assert inspect.signature(NodeContext).parameters["nvml_loader"].default is None
    assert selftest.load_nvml is nvml.load_nvml
    # the doctor's snapshot comes from the same per-field reads the sampler makes
    fake = nvml.FakeNvml(nvml.fake_gpus(2, used=5, processes=[[nvml.GpuProcess(7, 1)]]))
    devs = fake.devices()
    assert [(d.index, d.memory_used, d.processes) for d in devs] == [(0, 5, (nvml.GpuProcess(7, 1),)), (1, 5, ())]
    # the real backend on this machine: started, or refused with a one-line reason (no driver here)
    try:
        real_nv = nvml.load_nvml()
    except nvml.NvmlUnavailable as exc:
        assert "\n" not in str(exc) and str(exc)
        s = SystemSampler()
        assert s.gpu_count == 0 and str(exc) in s.gpu_note
    else:
        try:
            assert all(isinstance(d, nvml.GpuDevice) for d in real_nv.devices())
        finally:
            real_nv.shutdown()
