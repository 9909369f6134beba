"""Software, network and filesystem checks on one node: real files, real sockets, fixed inputs."""

from __future__ import annotations

import os
import socket

import pytest
from doctor_env import CPU_TORCH, ETH, make, step
from testports import free_port

from traceml_slurm.doctor import filesystem as F
from traceml_slurm.doctor import network as N
from traceml_slurm.doctor import software as S
from traceml_slurm.doctor.model import Status
from traceml_slurm.doctor.node import Options
from traceml_slurm.doctor.torchprobe import TorchInfo

# -- software -----------------------------------------------------------------------------------------


def test_broken_torch_is_a_failed_check_with_its_error():
    o = S.check_torch(make(step(), torch=TorchInfo(error="import torch failed: OSError: libcudnn.so.9: cannot open")))
    assert o.status is Status.FAIL and "libcudnn.so.9" in o.observed and "PYTHONPATH" in o.fix
    missing = S.check_torch(make(step(), torch=TorchInfo(error="import torch failed: ModuleNotFoundError: No module named 'torch'")))
    assert missing.status is Status.FAIL and "pip install torch" in missing.fix
    assert S.check_nccl(make(step(), torch=TorchInfo(error="x"))).status is Status.SKIP


def test_cpu_torch_passes_and_has_no_nccl():
    assert S.check_torch(make(step())).status is Status.PASS
    o = S.check_nccl(make(step(), torch=CPU_TORCH))
    assert o.status is Status.SKIP and "CPU build" in o.observed


def test_training_script_missing_broken_and_fine(tmp_path):
    def run(script):
        return S.check_script(make(step(), options=Options(script=script), cwd=str(tmp_path)))

    assert run(None).status is Status.SKIP
    o = run("train.py")
    assert o.status is Status.FAIL and "does not exist" in o.observed and "SLURM_SUBMIT_DIR" in o.fix
    (tmp_path / "train.py").write_text("def f(:\n    pass\n")
    o = run("train.py")
    assert o.status is Status.FAIL and "syntax error at line 1" in o.observed
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert run("train.py").status is Status.PASS


def test_traceml_command_from_another_environment_warns(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cmd = bin_dir / "traceml"
    cmd.write_text("#!/opt/other-venv/bin/python3\nimport sys\n")
    cmd.chmod(0o755)
    o = S.check_traceml(make(step(PATH=str(bin_dir))))
    assert o.status is Status.WARN and "/opt/other-venv/bin/python3" in o.observed
    none = S.check_traceml(make(step(PATH=str(tmp_path / "empty"))))
    assert none.status is Status.WARN and "no `traceml` command on PATH" in none.observed


# -- network ------------------------------------------------------------------------------------------

def test_port_in_use_on_node0_fails_naming_the_port_and_the_process():
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        o = N.check_ports_free(make(step(TRACEML_MASTER_PORT=str(port))))
        assert o.status is Status.FAIL and f"rendezvous port {port} is in use" in o.observed
        assert f"pid {os.getpid()}" in o.observed and "--master-port" in o.fix and "TRACEML_MASTER_PORT" in o.fix
    finally:
        holder.close()
    ok = N.check_ports_free(make(step(TRACEML_MASTER_PORT=str(free_port()), TRACEML_AGGREGATOR_PORT=str(free_port()))))
    assert ok.status is Status.PASS
    other = N.check_ports_free(make(step(SLURM_NODEID="1", SLURMD_NODENAME="gpu08")))
    assert other.status is Status.SKIP and "only node 0" in other.observed


def test_bind_host_that_is_not_ours_fails():
    o = N.check_ports_free(make(step(TRACEML_AGGREGATOR_BIND_HOST="203.0.113.9", TRACEML_MASTER_PORT=str(free_port()))))
    assert o.status is Status.FAIL and "203.0.113.9 is not an address" in o.observed


def test_master_that_does_not_resolve_fails():
    o = N.check_master_resolves(make(step(TRACEML_MASTER_ADDR="no-such-host.invalid")))
    assert o.status is Status.FAIL and "does not resolve" in o.observed and "--master-addr" in o.fix
    one = N.check_master_resolves(make(step(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="localhost",
                                            SLURM_STEP_TASKS_PER_NODE="1")))
    assert one.status is Status.PASS and "127.0.0.1" in one.observed


@pytest.mark.parametrize("spec,ok", [("eth", True), ("eth0", True), ("^lo,docker", True), ("=eth", False),
                                     ("ib", False), ("ib0", False), ("^eth,lo", False)])
def test_nccl_socket_ifname(spec, ok):
    o = N.check_socket_ifname(make(step(NCCL_SOCKET_IFNAME=spec), interfaces=ETH))
    assert (o.status is Status.PASS) is ok, o.observed
    if not ok:
        assert f"NCCL_SOCKET_IFNAME={spec}" in o.observed and "lo, eth0, ib0 (down)" in o.observed


def test_gloo_socket_ifname_loopback_in_multinode_fails():
    o = N.check_socket_ifname(make(step(GLOO_SOCKET_IFNAME="lo"), interfaces=ETH))
    assert o.status is Status.FAIL and "loopback" in o.observed
    assert N.check_socket_ifname(make(step(GLOO_SOCKET_IFNAME="eth0"), interfaces=ETH)).status is Status.PASS
    assert N.check_socket_ifname(make(step(), interfaces=ETH)).status is Status.PASS


def test_real_interfaces_are_listed():
    from traceml_slurm.doctor.netinfo import list_interfaces

    found = {i.name: i for i in list_interfaces()}
    assert "lo" in found and found["lo"].loopback and "127.0.0.1" in found["lo"].addresses


def test_risky_variables_warn():
    o = N.check_risky_vars(make(step(NCCL_IB_DISABLE="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="0")))
    assert o.status is Status.WARN and "NCCL_IB_DISABLE=1" in o.observed and "TORCH_NCCL_ASYNC_ERROR_HANDLING=0" in o.observed
    assert N.check_risky_vars(make(step(NCCL_P2P_DISABLE="0"))).status is Status.PASS


# -- filesystem ---------------------------------------------------------------------------------------

def test_logs_dir_writable_and_not(tmp_path):
    ok = F.check_logs_dir(make(step(TRACEML_LOGS_DIR=str(tmp_path / "logs"))))
    assert ok.status is Status.PASS and "writable" in ok.observed and (tmp_path / "logs").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = F.check_logs_dir(make(step(TRACEML_LOGS_DIR=str(blocker / "logs"))))
    assert bad.status is Status.FAIL and "not writable" in bad.observed and "--logs-dir" in bad.fix
    other = F.check_logs_dir(make(step(TRACEML_LOGS_DIR=str(blocker / "logs"), SLURM_NODEID="1")))
    assert other.status is Status.SKIP and "only node 0 writes" in other.observed


def test_relative_logs_dir_is_taken_from_the_submit_dir(tmp_path):
    o = F.check_logs_dir(make(step(SLURM_SUBMIT_DIR=str(tmp_path))))
    assert o.data["path"] == str(tmp_path / "logs") and o.data["source"] == "slurm:SLURM_SUBMIT_DIR"


class _Vfs:
    def __init__(self, total):
        self.f_blocks, self.f_frsize, self.f_bavail = total // 4096, 4096, total // 8192


def test_small_dev_shm_warns_per_gpu(monkeypatch):
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: _Vfs(64 * 1024**2) if p == "/dev/shm" else real(p))
    o = F.check_shm(make(step(SLURM_GPUS_ON_NODE="4")))
    assert o.status is Status.WARN and "64 MiB for 4 GPUs" in o.observed and "--shm-size" in o.fix
    monkeypatch.setattr(os, "statvfs", lambda p: _Vfs(64 * 1024**3) if p == "/dev/shm" else real(p))
    assert F.check_shm(make(step(SLURM_GPUS_ON_NODE="4"))).status is Status.PASS


def test_missing_dev_shm_warns(tmp_path):
    o = F.check_shm(make(step(), shm_path=str(tmp_path / "nope")))
    assert o.status is Status.WARN and "missing" in o.observed



# -- CPUs for each task (the input-bound verdict's facts, before the run) -----------------------------

def test_cpus_show_the_request_and_warn_when_srun_will_not_pass_it_on(monkeypatch):
    from traceml_slurm import cpus
    from traceml_slurm.doctor import context as C

    monkeypatch.setattr(cpus, "slurm_version", lambda environ: "22.05.8")
    o = C.check_cpus(make(step(SLURM_CPUS_PER_TASK="8", SLURM_CPUS_ON_NODE="16")))
    assert o.status is Status.WARN and o.fix == "In the job script, before srun: `export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK`."
    assert "--cpus-per-task=8; SRUN_CPUS_PER_TASK unset" in o.observed and "16 allocated on the node" in o.observed
    assert "srun of Slurm 22.05.8 does not pass --cpus-per-task=8 on" in o.observed
    assert (o.data["cpus_per_task"], o.data["affinity_cpus"]) == (8, len(os.sched_getaffinity(0)))
    ok = C.check_cpus(make(step(SLURM_CPUS_PER_TASK="8", SRUN_CPUS_PER_TASK="8")))
    assert ok.status is Status.PASS and "SRUN_CPUS_PER_TASK 8" in ok.observed
    assert C.check_cpus(make(step())).status is Status.PASS  # Slurm's default of 1: nothing lost
    monkeypatch.setattr(cpus, "slurm_version", lambda environ: "24.11.1")
    assert C.check_cpus(make(step(SLURM_CPUS_PER_TASK="8"))).status is Status.PASS  # 24.11's srun passes it on
