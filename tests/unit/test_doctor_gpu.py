"""GPU checks behind the NVML interface, with a fake NVML and a fixed torch answer."""

from __future__ import annotations

import os

from doctor_env import CPU_TORCH, cuda_torch, gpus, make, step

from traceml_slurm.doctor import gpu as G
from traceml_slurm.doctor.model import Status
from traceml_core.selftest import FakeNvml, GpuProcess, fake_gpus
from traceml_slurm.doctor.torchprobe import TorchInfo


def test_no_gpu_and_none_asked_is_skipped():
    ctx = make(step())
    for check in (G.check_count, G.check_cuda_init, G.check_free):
        o = check(ctx)
        assert o.status is Status.SKIP and "no GPU" in o.observed


def test_asked_for_gpus_on_a_node_without_any_fails_with_both_ways_out():
    # the local dev cluster: --gres=gpu:2 on /dev/null clones, no driver
    o = G.check_count(make(gpus(2), torch=CPU_TORCH))
    assert o.status is Status.FAIL
    assert "Slurm allocated 2 GPUs" in o.observed and "libnvidia-ml.so.1" in o.observed
    assert "drop --gres" in o.fix and "--ignore gpu" in o.fix
    assert G.check_cuda_init(make(gpus(2), torch=CPU_TORCH)).status is Status.FAIL


def test_all_witnesses_agree():
    o = G.check_count(make(gpus(4), nvml=FakeNvml(fake_gpus(4)), torch=cuda_torch(4)))
    assert o.status is Status.PASS and o.observed.startswith("4 GPUs")
    assert o.data["nvml"] == 4 and o.data["torch"] == 4 and o.data["nproc_per_node"] == 4


def test_torch_seeing_fewer_gpus_fails():
    o = G.check_count(make(gpus(4), nvml=FakeNvml(fake_gpus(4)), torch=cuda_torch(2)))
    assert o.status is Status.FAIL and "torch sees 2" in o.observed


def test_cuda_visible_devices_overridden_by_the_user_fails():
    o = G.check_count(make(gpus(4, CUDA_VISIBLE_DEVICES="0"), nvml=FakeNvml(fake_gpus(4)), torch=cuda_torch(1)))
    assert o.status is Status.FAIL and "CUDA_VISIBLE_DEVICES names 1 devices, not 4" in o.observed
    assert "Do not set CUDA_VISIBLE_DEVICES" in o.fix


def test_fewer_workers_than_gpus_warns_and_more_fails():
    few = G.check_count(make(gpus(4, TRACEML_NPROC_PER_NODE="2"), nvml=FakeNvml(fake_gpus(4)), torch=cuda_torch(4)))
    assert few.status is Status.WARN and "2 GPUs stay idle" in few.observed
    many = G.check_count(make(gpus(2, TRACEML_NPROC_PER_NODE="4"), nvml=FakeNvml(fake_gpus(2)), torch=cuda_torch(2)))
    assert many.status is Status.FAIL and "nproc_per_node=4" in many.observed


def test_gpus_on_the_node_but_none_allocated_warns():
    o = G.check_count(make(step(), nvml=FakeNvml(fake_gpus(8)), torch=cuda_torch(0)))
    assert o.status is Status.WARN and "--gres=gpu:N" in o.fix


def test_cpu_build_of_torch_with_gpus_fails_cuda_init():
    o = G.check_cuda_init(make(gpus(2), nvml=FakeNvml(fake_gpus(2)), torch=CPU_TORCH))
    assert o.status is Status.FAIL and "CPU build" in o.observed


def test_cuda_init_failing_on_a_device_fails():
    o = G.check_cuda_init(make(gpus(2), nvml=FakeNvml(fake_gpus(2)), torch=cuda_torch(2, init_ok=False)))
    assert o.status is Status.FAIL and "ECC" in o.observed
    ok = G.check_cuda_init(make(gpus(2), nvml=FakeNvml(fake_gpus(2)), torch=cuda_torch(2)))
    assert ok.status is Status.PASS and "2 devices" in ok.observed


def test_broken_torch_makes_cuda_init_fail_not_crash():
    o = G.check_cuda_init(make(gpus(1), nvml=FakeNvml(fake_gpus(1)), torch=TorchInfo(error="import torch failed: OSError")))
    assert o.status is Status.FAIL and "sw.torch" in o.fix


def test_foreign_process_on_an_allocated_gpu_fails_but_not_on_another_jobs_gpu():
    devices = fake_gpus(4, processes=[[], [], [GpuProcess(99999, 3 * 1024**3)], []])
    bad = G.check_free(make(gpus(4), nvml=FakeNvml(devices), torch=cuda_torch(4)))
    assert bad.status is Status.FAIL and "GPU 2: pid 99999 (3.0 GiB)" in bad.observed
    # the job holds GPUs 0 and 1 only: a process on GPU 2 belongs to someone else's allocation
    fine = G.check_free(make(gpus(2), nvml=FakeNvml(devices), torch=cuda_torch(2)))
    assert fine.status is Status.PASS and "2 GPUs free" in fine.observed


def test_our_own_process_does_not_count_and_invisible_memory_warns():
    mine = fake_gpus(1, processes=[[GpuProcess(os.getpid(), 10)]])
    assert G.check_free(make(gpus(1), nvml=FakeNvml(mine), torch=cuda_torch(1))).status is Status.PASS
    held = fake_gpus(1, used=20 * 1024**3)
    o = G.check_free(make(gpus(1), nvml=FakeNvml(held), torch=cuda_torch(1)))
    assert o.status is Status.WARN and "no visible process" in o.observed


def test_uuid_lists_in_cuda_visible_devices_map_to_nvml_devices():
    devices = FakeNvml(fake_gpus(3)).devices()
    chosen = G.allocated(devices, [devices[2].uuid[:12], "0"])
    assert [d.index for d in chosen] == [2, 0]


def test_gpu_health_fails_a_hardware_fault_warns_a_slowdown_and_says_what_is_not_measured(tmp_path):
    from traceml_core.sdk.samplers import FakeGpu
    from traceml_core.sdk.samplers.nvml import kernel_xids

    def health(*devices):
        return G.check_health(make(gpus(len(devices)), nvml=FakeNvml(list(devices)), torch=cuda_torch(len(devices))))

    ok = health(FakeGpu(uuid="GPU-a", clock_reasons=0x4 | 0x1), FakeGpu(uuid="GPU-b"))  # power cap, idle: normal
    assert ok.status is Status.PASS and "2 GPUs: no hardware XID" in ok.observed
    assert ok.data["devices"][0]["clock_reasons"] == ["gpu_idle", "sw_power_cap"] and ok.data["faults"] == []
    hot = health(FakeGpu(uuid="GPU-a", clock_reasons=0x40), FakeGpu(uuid="GPU-b"))
    assert hot.status is Status.WARN and hot.data["slowdowns"] == ["GPU 0 held back (hw_thermal_slowdown)"]
    assert "cooling" in hot.fix
    # an application's XID (13) is shown, not blamed; the hardware's (79) and an ECC error are faults
    app = health(FakeGpu(uuid="GPU-a", xids=(13,)))
    assert app.status is Status.PASS and app.data["devices"][0]["xids"] == [13]
    bad = health(FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", xids=(13, 79), ecc_uncorrected=2, clock_reasons=0x8))
    assert bad.status is Status.FAIL and bad.data["faults"] == ["GPU 1: XID 79; 2 uncorrectable ECC error(s)"]
    assert "#SBATCH --exclude=gpu07" in bad.fix and "GPU 1 held back (hw_slowdown)" in bad.observed
    old = health(FakeGpu(uuid="GPU-a", unsupported={"remap_failed", "ecc_corrected"}))
    assert old.status is Status.PASS and "not measured: ecc (Not Supported), remap_failed (Not Supported)" in old.observed
    assert old.data["devices"][0]["ecc_uncorrected"] is None   # not measured, never 0
    assert G.check_health(make(step())).status is Status.SKIP
    # the real backend's XIDs come from the kernel log, by PCI device
    log = tmp_path / "kmsg"
    log.write_text("4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
                   "4,2,3,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n"
                   "4,3,4,-;NVRM: Xid (PCI:0001:5e:00): 48, An uncorrectable double bit error\n")
    assert kernel_xids(str(log)) == {(0, 0x3B, 0): [79, 13], (1, 0x5E, 0): [48]}


def test_the_real_backend_reads_health_through_pynvml_with_the_same_rule(monkeypatch):
    """PynvmlBackend's health reads, on a stand-in ``pynvml`` module with the real one's names (no
    GPU here): the same GpuHealth, the same faults and slowdowns as the fake gives."""
    import sys
    import types

    from traceml_core.sdk.samplers import nvml as N

    class Err(Exception):
        pass

    class PciInfo:
        busId = b"00000000:3B:00.0"

    fake = types.ModuleType("pynvml")
    fake.NVMLError, fake.NVMLError_LibraryNotFound = Err, type("NotFound", (Err,), {})
    fake.NVML_MEMORY_ERROR_TYPE_CORRECTED, fake.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake.NVML_VOLATILE_ECC = 0, 1, 0
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    fake.nvmlDeviceGetIndex = lambda h: int(h[1:])
    fake.nvmlDeviceGetUUID = lambda h: b"GPU-real"
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x80 | 0x4
    fake.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: {0: 5, 1: 0}[kind]
    fake.nvmlDeviceGetPciInfo = lambda h: PciInfo()

    def no_remap(h):
        raise Err("Not Supported")

    fake.nvmlDeviceGetRemappedRows = no_remap
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(N, "_kernel_xids", {(0, 0x3B, 0): [79]})   # what the kernel log said of 0000:3b:00
    h = N.load_nvml().health("h0")
    assert (h.index, h.uuid, h.clock_reasons, h.ecc_corrected, h.ecc_uncorrected, h.xids) == (
        0, "GPU-real", ("sw_power_cap", "hw_power_brake_slowdown"), 5, 0, (79,))
    assert h.remap_failed is None and dict(h.unmeasured) == {"remap_failed": "Not Supported"}
    assert h.faults == ["XID 79"] and h.slowdowns == ["hw_power_brake_slowdown"]
