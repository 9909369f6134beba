"""`traceml slurm doctor` on the real local Slurm (network-namespace nodes): every cross-node check
passing on a healthy 2-node job, and failing for a real cause made inside one node:

- a firewall rule (nftables) dropping node 0's aggregator port in node1's namespace -> timed out
- the aggregator bound to loopback (TRACEML_AGGREGATOR_BIND_HOST=127.0.0.1) -> refused
- an unreachable route to node 0 in node2's namespace -> no route
- a private tmpfs over the logs dir in node2's mount namespace -> logs dir not shared
- a different traceml_core/__init__.py bind-mounted on node2 -> versions differ
- NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming an interface that does not exist -> socket check, gloo
- the real aggregator on node 0 (cross.aggregator) behind the same firewall / loopback bind
- node2's agent hanging (a bind-mounted agent module that sleeps) -> the missing node is named
- explicit TRACEML_NODE_RANK=0 on every node with --cluster=none -> duplicate node ranks
- a clock offset on node2 via the TEST HOOK TRACEML_DOCTOR_TEST_CLOCK_OFFSET: a real per-node
  CLOCK_REALTIME skew cannot be made on one machine (time namespaces do not offset REALTIME)

Per-node mounts are made inside the node's slurmd mount namespace (nsenter -t <slurmd pid> -m), so
only the job's processes on that node see them; each is undone in a finally block.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PY = sys.executable
NFT_TABLE = "traceml_doctor_test"
#: under Slurm the ports are derived from the job id unless set; these tests pin them (the firewall
#: rule and the expected messages name them)
PINNED_PORTS = {"TRACEML_MASTER_PORT": "29500", "TRACEML_AGGREGATOR_PORT": "29765"}


@pytest.fixture()
def workdir(slurm_cluster) -> Path:
    """A fresh directory on the shared filesystem (the submit dir, so logs go to <it>/logs)."""
    base = slurm_cluster.jobs_dir / "doctor"
    base.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="doc-", dir=base))


def doctor_job(cluster, workdir: Path, *sbatch: str, args: str = "", env: Optional[dict] = None,
               signal: bool = True, timeout: float = 240) -> tuple[dict, int, str]:
    """Run the doctor in the batch shell of an sbatch job; return (report, exit code, stderr).
    ``--timeout 60`` unless ``args`` sets one: the default 15 s also bounds each node's `import
    torch` child (facts, benchmarks, the gloo all-reduce), which several nodes importing at once
    on a loaded 2-core CI machine can exceed; the checks these tests assert on have bounds of
    their own (a 3 s connect, the aggregator's min(timeout, 15))."""
    if "--timeout" not in args:
        args = f"--timeout 60 {args}"
    lines = ["#!/bin/bash"]
    if signal:
        lines.append("#SBATCH --signal=TERM@60")
    lines += [f"export PYTHONPATH={SRC}", f"export PATH={Path(PY).parent}:$PATH", "unset TRACEML_DOCTOR_TEST_CLOCK_OFFSET"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    lines += [f"cd {workdir}",
              f"{PY} -m traceml_core.cli slurm doctor --json {args} > {workdir}/report.json 2> {workdir}/stderr.txt",
              f"echo $? > {workdir}/rc"]
    job_id, state, _out = cluster.run_job("\n".join(lines) + "\n", *sbatch, timeout=timeout, cwd=workdir)
    stderr = (workdir / "stderr.txt").read_text()
    assert state == "COMPLETED", (state, stderr)
    return json.loads((workdir / "report.json").read_text()), int((workdir / "rc").read_text()), stderr


def checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def node(report: dict, cid: str, name: str) -> dict:
    return checks(report)[cid]["nodes"][name]


@contextmanager
def node_mount(cluster, name: str, target: Path, *how: str) -> Iterator[None]:
    """A mount that only processes of one node (its slurmd and the job steps it starts) see."""
    pid = (cluster.dir / name / "slurmd.pid").read_text().strip()
    subprocess.run(["nsenter", "-t", pid, "-m", "mount", *how, str(target)], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["nsenter", "-t", pid, "-m", "umount", str(target)], check=False, capture_output=True)


TWO = ("-N2", "--ntasks-per-node=1", "--time=30")


def test_healthy_two_node_job_passes_every_cross_check(slurm_cluster, workdir):
    t0 = time.monotonic()
    # (--timeout 60, doctor_job's: a CI run under the default 15 s failed one check of this job)
    report, rc, stderr = doctor_job(slurm_cluster, workdir, *TWO)
    took = time.monotonic() - t0
    c = checks(report)
    failed = {cid: ck["nodes"] for cid, ck in c.items() if ck["status"] == "fail"}
    assert not failed, failed
    for cid in ("cross.answers", "cross.node-ranks", "cross.config-agrees", "cross.master-address",
                "cross.ports-reachable", "cross.versions", "cross.logs-shared", "cross.clock-skew",
                "cross.gloo-allreduce", "cross.aggregator"):
        assert c[cid]["status"] == "pass", (cid, c[cid])
        assert set(c[cid]["nodes"]) == {"node1", "node2"}, cid
    assert c["cross.nccl-bandwidth"]["status"] == "skip"
    assert "sum 3 = 3 over 2 nodes" in node(report, "cross.gloo-allreduce", "node2")["observed"]
    assert "rank 1 reached node 0's aggregator and its summary" in node(report, "cross.aggregator", "node2")["observed"]
    # the link probe between the agents. Between network namespaces a transfer is a memory copy,
    # CPU-bound: on a loaded 2-core CI machine one direction measured 0.82 against 1.66 GB/s and
    # was warned of (a real slow link here is tc's 100 Mbit, 0.0125 GB/s: test_comm_slurm.py)
    bw = checks(report)["cross.link-bandwidth"]
    assert set(bw["nodes"]) == {"node1", "node2"}, bw
    assert all(o["status"] == "pass" or (o["status"] == "warn" and all(p["gbps"] > 0.1 for p in o["data"]["pairs"]))
               for o in bw["nodes"].values()), bw
    link = node(report, "cross.link-bandwidth", "node2")
    assert link["data"]["gbps"] > 0.1 and [(p["src"], p["dst"]) for p in link["data"]["pairs"]] == [(0, 1), (1, 0)]
    assert "sends" in link["observed"] and "to node1" in link["observed"]
    # the controller facts come from the real scontrol
    for cid in ("ctl.job", "ctl.nodes", "ctl.gres", "ctl.partition", "time.left", "time.signal"):
        assert c[cid]["status"] == "pass", (cid, c[cid])
    assert "via scontrol" in c["ctl.job"]["nodes"]["node1"]["observed"]
    assert "--signal=TERM@60" in c["time.signal"]["nodes"]["node1"]["observed"]
    assert report["summary"]["failed"] == 0 and rc == 0
    assert report["job"]["context"] == "batch shell" and report["job"]["nodes"] == ["node1", "node2"]
    assert took < 200, f"default tier took {took:.1f} s on 2 nodes"


def test_launch_config_is_the_one_print_config_resolves(slurm_cluster, workdir):
    """The doctor resolves inside each node's srun step with the same resolver as --print-config."""
    script = "\n".join([
        "#!/bin/bash", f"export PYTHONPATH={SRC}", f"cd {workdir}",
        f"{PY} -m traceml_core.cli slurm doctor --json --ignore gpu,sw,net,fs,time,ctl,cross > report.json 2>/dev/null",
        f"srun --ntasks-per-node=1 bash -c '{PY} -m traceml_core.cli run --print-config --json > pc-$SLURM_NODEID.json'",
    ]) + "\n"
    _job, state, _ = slurm_cluster.run_job(script, *TWO, cwd=workdir, timeout=120)
    assert state == "COMPLETED"
    report = json.loads((workdir / "report.json").read_text())
    for rank, name in enumerate(("node1", "node2")):
        printed = json.loads((workdir / f"pc-{rank}.json").read_text())["config"]
        doctor = node(report, "slurm.launch-config", name)["data"]["config"]
        assert doctor == printed, name


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables (apt-get install nftables) for the firewall rule")
def test_firewall_version_logs_clock_and_ifname_faults_on_one_node(slurm_cluster, workdir):
    logs = workdir / "logs"
    logs.mkdir()
    alt = workdir / "alt_init.py"
    alt.write_text((SRC / "traceml_core" / "__init__.py").read_text().replace('__version__ = "', '__version__ = "9.9.9-'))
    slurm_cluster.on_node("node1", "nft", "add", "table", "inet", NFT_TABLE)
    try:
        slurm_cluster.on_node("node1", "nft", "add chain inet " + NFT_TABLE + " input { type filter hook input priority 0 ; }")
        slurm_cluster.on_node("node1", "nft", "add", "rule", "inet", NFT_TABLE, "input", "iif", "eth0", "tcp", "dport",
                              "29765", "drop")
        with node_mount(slurm_cluster, "node2", logs, "-t", "tmpfs", "tmpfs"), \
                node_mount(slurm_cluster, "node2", SRC / "traceml_core" / "__init__.py", "--bind", str(alt)):
            report, rc, _ = doctor_job(slurm_cluster, workdir, *TWO, env={
                "NCCL_SOCKET_IFNAME": "ib0", "TRACEML_DOCTOR_TEST_CLOCK_OFFSET": "node2=400", **PINNED_PORTS})
    finally:
        slurm_cluster.on_node("node1", "nft", "delete", "table", "inet", NFT_TABLE, check=False)
    assert rc == 1
    ports = node(report, "cross.ports-reachable", "node2")
    assert ports["status"] == "fail" and "aggregator node1:29765 timed out after 3 s" in ports["observed"]
    assert "rendezvous node1:29500 ok" in ports["observed"]
    assert node(report, "cross.ports-reachable", "node1")["status"] == "pass"  # node 0 itself is not firewalled
    versions = node(report, "cross.versions", "node2")
    assert versions["status"] == "fail" and "traceml 9.9.9-0.1.0 (node 0: 0.1.0)" in versions["observed"]
    assert node(report, "cross.versions", "node1")["status"] == "pass"
    shared = node(report, "cross.logs-shared", "node2")
    assert shared["status"] == "warn" and "not the one node 0 writes to" in shared["observed"]
    assert f"node1:{logs}/" in shared["observed"]
    skew = node(report, "cross.clock-skew", "node2")
    assert skew["status"] == "fail" and skew["observed"].startswith("+40")
    ifname = checks(report)["net.socket-ifname"]
    assert ifname["status"] == "fail" and "NCCL_SOCKET_IFNAME=ib0 matches no interface" in json.dumps(ifname["nodes"])
    assert checks(report)["cross.gloo-allreduce"]["status"] == "pass"  # gloo uses the open rendezvous port
    agg = node(report, "cross.aggregator", "node2")  # the real aggregator behind the same firewall
    assert agg["status"] == "fail" and "timed out" in agg["observed"]
    assert node(report, "cross.aggregator", "node1")["status"] == "pass"


def test_aggregator_on_loopback_is_refused_and_wrong_gloo_interface_fails_the_allreduce(slurm_cluster, workdir):
    report, rc, _ = doctor_job(slurm_cluster, workdir, *TWO, env={
        "TRACEML_AGGREGATOR_BIND_HOST": "127.0.0.1", "GLOO_SOCKET_IFNAME": "ib0", **PINNED_PORTS})
    assert rc == 1
    ports = node(report, "cross.ports-reachable", "node2")
    assert ports["status"] == "fail" and "aggregator node1:29765 refused" in ports["observed"]
    assert "listens on 127.0.0.1 only" in ports["observed"]
    assert node(report, "cross.ports-reachable", "node1")["status"] == "pass"  # node 0 reaches 127.0.0.1
    agg = node(report, "cross.aggregator", "node2")
    assert agg["status"] == "fail" and "refused" in agg["observed"]
    gloo = checks(report)["cross.gloo-allreduce"]
    assert gloo["status"] == "fail" and "ib0" in json.dumps(gloo["nodes"])
    assert "GLOO_SOCKET_IFNAME names ib0, which does not exist" in json.dumps(checks(report)["net.socket-ifname"])


def test_no_route_to_node0_from_an_salloc_shell(slurm_cluster, workdir):
    """From an salloc shell (the login host coordinates) with node2 unable to route to node1."""
    n1 = slurm_cluster.node_ip("node1")
    slurm_cluster.on_node("node2", "ip", "route", "add", "unreachable", f"{n1}/32")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_DOCTOR_")}
        env.update(PYTHONPATH=str(SRC), PATH=f"{Path(PY).parent}:{env.get('PATH', '')}", **PINNED_PORTS)
        p = slurm_cluster.run("salloc", *TWO, PY, "-m", "traceml_core.cli", "slurm", "doctor", "--json",
                              "--ignore", "cross.gloo-allreduce,cross.aggregator", env=env, cwd=workdir, check=False,
                              timeout=120)
    finally:
        slurm_cluster.on_node("node2", "ip", "route", "del", "unreachable", f"{n1}/32", check=False)
    report = json.loads(p.stdout)
    assert report["job"]["context"] == "salloc shell" and p.returncode == 1
    ports = node(report, "cross.ports-reachable", "node2")
    assert ports["status"] == "fail" and "no route to host" in ports["observed"]
    assert "rendezvous node1:29500 no route to host" in ports["observed"]
    assert node(report, "cross.answers", "node2")["status"] == "pass"  # it still reached the login host


def test_a_node_whose_agent_hangs_is_named(slurm_cluster, workdir):
    hang = workdir / "hang_agent.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    with node_mount(slurm_cluster, "node2", SRC / "traceml_slurm" / "doctor" / "agent.py", "--bind", str(hang)):
        t0 = time.monotonic()
        report, rc, stderr = doctor_job(slurm_cluster, workdir, *TWO, args="--timeout 3")
        took = time.monotonic() - t0
    missing = node(report, "cross.answers", "node2")
    assert missing["status"] == "fail" and "no answer within 3 s" in missing["observed"]
    assert node(report, "cross.answers", "node1")["status"] == "pass" and rc == 1
    assert "waiting for agents on 2 nodes" in stderr  # the wait said what it waited for
    assert took < 40


def test_every_node_claiming_rank_0_is_caught(slurm_cluster, workdir):
    report, rc, _ = doctor_job(slurm_cluster, workdir, *TWO, env={
        "TRACEML_CLUSTER": "none", "TRACEML_NNODES": "2", "TRACEML_NODE_RANK": "0", "TRACEML_MASTER_ADDR": "node1"})
    ranks = checks(report)["cross.node-ranks"]
    assert ranks["status"] == "fail" and "also claimed by" in node(report, "cross.node-ranks", "node2")["observed"]
    assert "rank 1 claimed by none" in node(report, "cross.node-ranks", "node1")["observed"]
    assert checks(report)["cross.gloo-allreduce"]["status"] == "skip" and rc == 1


def test_gpus_requested_on_nodes_without_any_fail_clearly(slurm_cluster, workdir):
    """The dev cluster's GRES are /dev/null clones: Slurm allocates GPUs that do not exist."""
    report, rc, _ = doctor_job(slurm_cluster, workdir, *TWO, "--gres=gpu:2",
                               args="--ignore cross.gloo-allreduce,cross.ports-reachable,cross.logs-shared")
    count = node(report, "gpu.count", "node2")
    assert count["status"] == "fail" and "Slurm allocated 2 GPUs but this node has none usable" in count["observed"]
    assert "drop --gres" in count["fix"]
    assert "gpu:a100:2" in checks(report)["ctl.gres"]["nodes"]["node1"]["observed"]
    assert rc == 1
