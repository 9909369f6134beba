"""Pre-flight and the command line of `traceml run`, as a user meets them: the real CLI in a
subprocess, real torchrun and gloo DDP where a run starts.

A launch that cannot work ends with exit status 2, one paragraph naming the problem and the fix,
no traceback, no run directory and no process left; torchrun's own spellings either work on a real
run or are refused with the reason.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SP = Path(sysconfig.get_paths()["purelib"])  # this venv's site-packages (torch among them)

#: a small DDP module: records its argv and the worker count it saw, trains a few traced steps
TRAIN_MODULE = '''
import json, os, sys
import torch, torch.distributed as dist
import traceml_core as traceml

def main():
    traceml.init()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(os.path.join(os.environ["ARGV_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "world": dist.get_world_size()}, f)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(30):
        with traceml.trace_step(model):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.barrier()
    dist.destroy_process_group()
    del model, opt

if __name__ == "__main__":
    main()
'''


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRACEML_"))}
    env["PYTHONPATH"] = str(REPO / "src")
    env["OMP_NUM_THREADS"] = "1"
    env["ARGV_DIR"] = str(tmp / "argv")
    env.update(extra)
    (tmp / "argv").mkdir(exist_ok=True)
    return env


def traceml(tmp: Path, *args: str, python: str = sys.executable, env: dict | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "traceml_core.cli", "run", *args], cwd=tmp, text=True,
                          capture_output=True, env=env or env_for(tmp), timeout=timeout)


def module_package(tmp: Path) -> None:
    (tmp / "pkg").mkdir()
    (tmp / "pkg" / "__init__.py").write_text("")
    (tmp / "pkg" / "train.py").write_text(TRAIN_MODULE)


def assert_refused(p: subprocess.CompletedProcess, tmp: Path, *needles: str) -> None:
    """Exit 2, one paragraph on stderr naming the problem, no traceback, nothing started."""
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = p.stderr.strip()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("traceml: error: "), err
    for n in needles:
        assert n in err, (n, err)
    assert not (tmp / "logs").exists(), "a refused launch left a logs directory behind"


def base_flags(tmp: Path) -> list[str]:
    master, agg = free_ports(2)
    return [f"--logs-dir={tmp / 'logs'}", "--run-name=r", f"--master-port={master}", f"--aggregator-port={agg}"]


# --- refused before anything starts -----------------------------------------------------------------
def test_missing_script(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = traceml(tmp_path, *base_flags(tmp_path), "trian.py")
    assert_refused(p, tmp_path, "trian.py does not exist", "Did you mean train.py?", "Nothing was started")


def test_module_that_does_not_resolve(tmp_path):
    p = traceml(tmp_path, *base_flags(tmp_path), "-m", "pkg.nosuch")
    assert_refused(p, tmp_path, "-m pkg.nosuch does not resolve in the workers' Python",
                   "No module named 'pkg'")


def test_torch_missing_in_the_workers_python(tmp_path):
    """A real interpreter without torch: a fresh venv that sees every package of ours but torch."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = tmp_path / "site"
    site.mkdir()
    for entry in SP.iterdir():
        if not entry.name.startswith(("torch", "functorch", "nvidia", "triton")):
            (site / entry.name).symlink_to(entry)
    (tmp_path / "train.py").write_text("import torch\n")
    env = env_for(tmp_path, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{site}")
    p = traceml(tmp_path, *base_flags(tmp_path), "train.py", python=str(venv / "bin" / "python"), env=env)
    assert_refused(p, tmp_path, "torch cannot be imported by the workers' Python", str(venv / "bin" / "python"),
                   "No module named 'torch'", "install torch there")


@pytest.mark.parametrize("argv,needles", [
    (["--nprocs-per-node=2", "train.py"], ["--nprocs-per-node is not a TraceML or torchrun flag",
                                           "Did you mean --nproc-per-node?"]),
    (["--log-dirs=/x", "train.py"], ["Did you mean --logs-dir (TraceML) or --log-dir (torchrun)?"]),
    (["--frobnicate", "train.py"], ["--frobnicate is not a TraceML or torchrun flag", "after it"]),
    (["--max-restarts=2", "train.py"], ["--max-restarts=2 is refused", "counted twice", "--requeue"]),
    (["--nnodes=1:4", "train.py"], ["elastic node range", "--nnodes=4"]),
    (["--rdzv-conf=timeout=5", "train.py"], ["--rdzv-conf=timeout=5 is refused", "static rendezvous"]),
    (["--rdzv_backend=etcd", "train.py"], ["--rdzv_backend=etcd is refused"]),
    (["--nproc-per-node=gpu", "train.py"], ["--nproc-per-node=gpu is refused", "Pass the number"]),
    (["--nnodes=2", "--rdzv-backend=c10d", "--master-addr=10.0.0.1", "train.py"],
     ["--rdzv-backend=c10d is refused here", "--node-rank"]),
    (["--standalone", "--nnodes=2", "train.py"], ["--standalone runs one node"]),
    (["train.py", "--standalone"], ["--standalone comes after the script train.py", "`--`"]),
    (["train.py", "--rdzv_endpoint=h:1"], ["--rdzv_endpoint comes after the script"]),
])
def test_flags_refused_with_the_reason(tmp_path, argv, needles):
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = traceml(tmp_path, f"--logs-dir={tmp_path / 'logs'}", *argv, timeout=60)
    assert_refused(p, tmp_path, *needles)


def test_more_workers_than_gpus_is_refused():
    """The GPU count comes from the workers' torch; no GPU exists here, so the probe's answer is
    given (the same object the agent's reply becomes)."""
    from traceml_core.launcher.preflight import PreflightError, WorkerProbe, check_probe

    check_probe(WorkerProbe("2.4", 4, None, "python"), 4, "slurm:SLURM_GPUS_ON_NODE")
    check_probe(WorkerProbe("2.4", 0, None, "python"), 8, "cli")  # CPU run: no GPU limit
    with pytest.raises(PreflightError) as exc:
        check_probe(WorkerProbe("2.4", 2, None, "python"), 4, "--nproc-per-node")
    msg = str(exc.value)
    assert "4 workers per node (from --nproc-per-node)" in msg and "only 2 GPU(s)" in msg
    assert "--nproc-per-node=2" in msg


# --- honoured on real runs --------------------------------------------------------------------------
def _ranks_argv(tmp: Path) -> dict[int, dict]:
    return {int(f.stem[4:]): json.loads(f.read_text()) for f in (tmp / "argv").glob("rank*.json")}


def test_module_run_with_torchrun_spellings(tmp_path):
    """`-m pkg.train` with torchrun's underscore spellings, a c10d recipe and torchrun's own
    --log_dir: two workers train, the script sees only its own arguments, torchrun writes its
    worker logs, and the summary has both ranks."""
    module_package(tmp_path)
    master, agg = free_ports(2)
    p = traceml(tmp_path, "--nproc_per_node=2", "--node_rank=0", "--master_addr=127.0.0.1",
                f"--master_port={master}", f"--aggregator_port={agg}", f"--logs_dir={tmp_path / 'logs'}",
                "--run_name=mod", "--rdzv_backend=c10d", "--rdzv_id=job42", f"--log_dir={tmp_path / 'tl'}",
                "-m", "pkg.train", "--lr", "0.1", "--", "--mode", "x")
    assert p.returncode == 0, p.stderr[-3000:]
    seen = _ranks_argv(tmp_path)
    assert sorted(seen) == [0, 1]
    assert all(v["argv"] == ["--lr", "0.1", "--mode", "x"] and v["world"] == 2 for v in seen.values()), seen
    s = json.loads((tmp_path / "logs" / "mod" / "final_summary.json").read_text())
    assert s["run"]["status"] == "completed" and [r["steps"] for r in s["ranks"]] == [30, 30]
    assert any((tmp_path / "tl").rglob("*")), "torchrun's --log_dir got no worker logs"
    assert "static rendezvous" in p.stderr and "--rdzv_id=job42 accepted" in p.stderr


def test_standalone_picks_free_ports(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_MODULE)
    p = traceml(tmp_path, "--standalone", "--nproc-per-node=2", f"--logs-dir={tmp_path / 'logs'}",
                "--run-name=sa", "train.py")
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stderr.splitlines() if "master 127.0.0.1:" in ln)
    assert "master 127.0.0.1:29500" not in line and "aggregator 127.0.0.1:29765" not in line, line
    assert sorted(_ranks_argv(tmp_path)) == [0, 1]


def test_one_node_outside_a_cluster_takes_free_ports_and_prints_them(tmp_path):
    """Another run holds the fixed defaults (29500, 29765) on this machine: a run with no port given
    still starts, on free ports it prints before anything else, and completes."""
    holders = []
    for port in (29500, 29765):
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        holders.append(s)
    try:
        (tmp_path / "train.py").write_text(TRAIN_MODULE)
        p = traceml(tmp_path, "--nproc-per-node=1", f"--logs-dir={tmp_path / 'logs'}", "--run-name=fp", "train.py")
    finally:
        for s in holders:
            s.close()
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stderr.splitlines()
    said = next(i for i, ln in enumerate(lines) if "free ports for this run: master " in ln)
    master, agg = (int(x) for x in re.findall(r"(?:master|aggregator) (\d+)", lines[said]))
    assert {master, agg}.isdisjoint({29500, 29765}) and master != agg, lines[said]
    started = next(i for i, ln in enumerate(lines) if f"master 127.0.0.1:{master}, aggregator 127.0.0.1:{agg}" in ln)
    assert said < started
    s = json.loads((tmp_path / "logs" / "fp" / "final_summary.json").read_text())
    assert s["run"]["status"] == "completed"


def test_every_torchrun_flag_has_a_treatment():
    """A torch upgrade that adds a torchrun flag fails here until runargs.py says what to do with
    it (otherwise it would be refused as unknown)."""
    from torch.distributed.run import get_args_parser

    from traceml_core.runargs import SHORT, TORCHRUN_TREATMENT, _our_keys

    names = set()
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            names.add(SHORT.get(opt) or opt.lstrip("-").replace("_", "-"))
    missing = sorted(n for n in names if n not in TORCHRUN_TREATMENT and n not in _our_keys())
    assert not missing, f"torchrun flags runargs.py does not handle: {missing}"
