"""Cross-node verdicts from what agents report (plain dicts, as they arrive over the wire)."""

from __future__ import annotations

from traceml_slurm.doctor import crossnode as X
from traceml_slurm.doctor.model import Status


def facts(rank, *, traceml="0.1.0", master="node1", addrs=("10.0.0.1",), run="ddp-42", port=29500):
    return {"node_rank": rank, "versions": {"python": "3.11.7", "torch": "2.13.0", "traceml": traceml},
            "master_addrs": list(addrs), "logs_dir": "/shared/logs",
            "config": {"nnodes": 2, "master_addr": master, "master_port": port, "aggregator_host": master,
                       "aggregator_port": 29765, "aggregator_bind_host": "0.0.0.0", "run_name": run}}


def test_missing_node_is_named():
    out = X.answers(["node1", "node2"], {"node1": 0.4}, 15, "srun: error: node2: unable to launch")
    assert out["node1"].status is Status.PASS
    assert out["node2"].status is Status.FAIL and "no answer within 15 s" in out["node2"].observed
    assert "unable to launch" in out["node2"].observed and "srun -w node2" in out["node2"].fix


def test_duplicate_ranks_fail_on_both_nodes_and_name_the_missing_rank():
    out = X.node_ranks({"node1": facts(0), "node2": facts(0)}, 2)
    assert all(o.status is Status.FAIL for o in out.values())
    assert "also claimed by node2" in out["node1"].observed and "rank 1 claimed by none" in out["node1"].observed
    ok = X.node_ranks({"node1": facts(0), "node2": facts(1)}, 2)
    assert all(o.status is Status.PASS for o in ok.values())


def test_the_node_with_another_traceml_fails_not_node0():
    out = X.versions({"node1": facts(0), "node2": facts(1, traceml="0.0.9")})
    assert out["node1"].status is Status.PASS
    assert out["node2"].status is Status.FAIL and "traceml 0.0.9 (node 0: 0.1.0)" in out["node2"].observed


def test_master_resolving_differently_fails_on_that_node():
    out = X.master_address({"node1": facts(0), "node2": facts(1, addrs=("127.0.1.1",))})
    assert out["node2"].status is Status.FAIL and "node 0 (node1) resolves it to 10.0.0.1" in out["node2"].observed


def test_config_disagreement():
    out = X.config_agrees({"node1": facts(0), "node2": facts(1, run="ddp-43", port=29600)})
    assert out["node2"].status is Status.FAIL and "run_name=ddp-43 (node 0: ddp-42)" in out["node2"].observed
    assert "master_port=29600" in out["node2"].observed


def test_ports_tell_refused_timeout_and_no_route_apart():
    reach = {
        "node1": {"rendezvous": {"status": "ok", "host": "node1", "port": 29500, "ms": 0.2},
                  "aggregator": {"status": "ok", "host": "127.0.0.1", "port": 29765, "ms": 0.1}},
        "node2": {"rendezvous": {"status": "no-route", "host": "node1", "port": 29500, "detail": "No route to host"},
                  "aggregator": {"status": "timeout", "host": "node1", "port": 29765}},
        "node3": {"rendezvous": {"status": "ok", "host": "node1", "port": 29500, "ms": 0.3},
                  "aggregator": {"status": "refused", "host": "node1", "port": 29765}},
    }
    out = X.ports_reachable(reach, {"rendezvous": "ok", "aggregator": "ok"}, "node1", "127.0.0.1")
    assert out["node1"].status is Status.PASS
    assert "timed out after 3 s" in out["node2"].observed and "no route to host" in out["node2"].observed
    assert "refused" in out["node3"].observed and "listens on 127.0.0.1 only" in out["node3"].observed
    assert "--aggregator-bind-host=0.0.0.0" in out["node3"].fix
    busy = X.ports_reachable(reach, {"rendezvous": "ok", "aggregator": "port 29765 is in use"}, "node1", "0.0.0.0")
    assert "not tried (port 29765 is in use" in busy["node3"].observed and busy["node3"].status is Status.PASS


def test_unshared_logs_dir_warns_and_says_where_the_summary_goes():
    out = X.logs_shared("node1", {"ok": True, "path": "/scratch/logs/.f"},
                        {"node2": {"match": False, "error": "not found", "path": "/scratch/logs/.f"}},
                        "/scratch/logs/ddp-42/final_summary.json")
    assert out["node2"].status is Status.WARN
    assert "node1:/scratch/logs/ddp-42/final_summary.json" in out["node2"].observed
    assert "not seen on node2" in out["node1"].observed


def test_clock_skew_thresholds():
    out = X.clock_skew({"node1": (0.001, 0.001), "node2": (2.5, 0.001), "node3": (400.0, 0.001), "node4": (0.01, 0.002)},
                       "node1")
    assert out["node1"].status is Status.PASS and out["node4"].status is Status.PASS
    assert out["node2"].status is Status.WARN and "+2.50 s" in out["node2"].observed
    assert out["node3"].status is Status.FAIL and "refuses hellos" in out["node3"].observed


def test_gloo_result_checked_against_the_expected_sum():
    good = {"data": {"value": 3.0, "init_s": 0.1, "allreduce_s": 0.001}, "ok": True}
    out = X.gloo_allreduce({"node1": good, "node2": {"data": {"value": 2.0}, "ok": True}}, 2)
    assert out["node1"].status is Status.PASS and out["node2"].status is Status.FAIL
    hung = X.gloo_allreduce({"node2": {"ok": False, "error": "no answer within 15 s", "timed_out": True, "data": {}}}, 2)
    assert hung["node2"].status is Status.FAIL and hung["node2"].observed.startswith("timed out")


def test_aggregator_verdict_per_node():
    started = {"ok": True, "port": 29765}
    sent = {"node1": {"ok": True, "records": 3, "ms": 2.0},
            "node2": {"ok": False, "stage": "connect", "status": "timeout", "host": "node1", "port": 29765},
            "node3": {"ok": False, "stage": "hello", "detail": "stale or missing hello timestamp", "host": "node1",
                      "port": 29765},
            "node4": {"ok": True, "records": 3, "ms": 2.0}}
    finished = {"ranks": [{"rank": 0, "node": 0, "steps": 3}]}
    out = X.aggregator(started, sent, finished, {"node1": 0, "node2": 1, "node3": 2, "node4": 3}, "node1")
    assert out["node1"].status is Status.PASS and "3 test step records of rank 0" in out["node1"].observed
    assert out["node2"].status is Status.FAIL and "timed out after 3 s" in out["node2"].observed
    assert "refused the hello: stale" in out["node3"].observed and "cross.clock-skew" in out["node3"].fix
    assert "summary has none from it" in out["node4"].observed
    down = X.aggregator({"ok": False, "error": "port 29765 is in use"}, {}, {}, {"node1": 0, "node2": 1}, "node1")
    assert all(o.status is Status.FAIL and "could not start the aggregator" in o.observed for o in down.values())


def test_link_probe_names_the_slow_node_with_its_pairs():
    from traceml_core.linkprobe.analysis import Pair, analyse, schedule

    rates = {0: 2.0, 1: 0.0125, 2: 1.8}      # node2 (index 1) sends at 100 Mbit/s
    pairs = [Pair(s, d, nbytes=10**8, seconds=10**8 / (min(rates[s], 2.0) * 1e9))
             for rnd in schedule(3) for s, d in rnd]
    names = ["node1", "node2", "node3"]
    out = X.link_bandwidth(analyse(pairs, names, bytes_per_pair=10**8, seconds=2.0), names)
    assert out["node2"].status is Status.FAIL
    assert "slow link: sending at 0.0125 GB/s" in out["node2"].observed
    assert "to node3 0.0125 GB/s, to node1 0.0125 GB/s" in out["node2"].observed
    assert "ethtool" in out["node2"].fix
    assert out["node1"].status is Status.PASS and out["node3"].status is Status.PASS
    assert len(out["node1"].data["pairs"]) == 4        # its two sends and two receives


def test_link_probe_with_two_nodes_warns_on_both_ends():
    from traceml_core.linkprobe.analysis import Pair, analyse

    pairs = [Pair(0, 1, nbytes=10**8, seconds=0.05), Pair(1, 0, nbytes=10**7, seconds=0.8)]
    out = X.link_bandwidth(analyse(pairs, ["a", "b"], bytes_per_pair=10**8, seconds=1.0), ["a", "b"])
    assert out["a"].status is Status.WARN and out["b"].status is Status.WARN
    assert "the link b -> a runs at 0.0125 GB/s" in out["a"].observed


def test_link_probe_that_could_not_run_fails_with_the_reason():
    from traceml_core.linkprobe.analysis import failed as probe_failed

    out = X.link_bandwidth(probe_failed("only 1 of 3 nodes' launchers answered the probe"), ["a", "b", "c"])
    assert all(o.status is Status.FAIL and "only 1 of 3" in o.observed for o in out.values())


def _bench(cpu, gpus=()):
    return {"cpu": {"gflops": cpu, "threads": 1}, "gpus": [{"index": i, **g} for i, g in enumerate(gpus)]}


def test_compute_speed_warns_on_the_node_far_below_its_peers_and_reads_the_slowest_gpu():
    fast = [{"gflops": 600.0, "h2d_gbps": 24.0}, {"gflops": 610.0, "h2d_gbps": 25.0}]
    out = X.compute_speed({
        "n1": _bench(40.0, fast), "n2": _bench(38.0, fast),
        # node 3: its CPU under a quota, and one GPU throttled to a quarter (the job waits for it)
        "n3": _bench(9.0, [{"gflops": 600.0, "h2d_gbps": 24.0}, {"gflops": 150.0, "h2d_gbps": 24.0}]),
        "n4": None})
    assert {n: o.status for n, o in out.items()} == {"n1": Status.PASS, "n2": Status.PASS, "n3": Status.WARN,
                                                     "n4": Status.SKIP}
    assert out["n3"].observed.startswith("slower than the other nodes: CPU matmul at 9 GFLOP/s against 39 GFLOP/s; "
                                         "GPU matmul at 150 GFLOP/s against 600 GFLOP/s")
    assert "host-to-device copy at 24 GB/s" in out["n3"].observed and "cpu.max" in out["n3"].fix
    assert (out["n3"].data["bench_cpu"], out["n3"].data["bench_gpu"], out["n3"].data["h2d"]) == (9.0, 150.0, 24.0)
    assert "not measured" in out["n4"].observed
    # within half of the others is no finding: nodes of one model differ by a few percent
    assert {o.status for o in X.compute_speed({"a": _bench(40.0), "b": _bench(21.0)}).values()} == {Status.PASS}
    # a CPU-only doctor: no GPU figure is made up
    cpu = X.compute_speed({"a": _bench(40.0), "b": _bench(10.0)})
    assert cpu["b"].status is Status.WARN and cpu["b"].data["bench_gpu"] is None and "GPU" not in cpu["b"].observed
    assert "nothing to compare with" in X.compute_speed({"a": _bench(40.0), "b": None})["a"].observed


def _quota_bench(cpu, quota, throttled):
    return {"cpu": {"gflops": cpu, "threads": 1, "quota_cpus": quota, "throttled": throttled}, "gpus": []}


def test_a_node_whose_own_cpu_quota_throttled_its_matmul_warns_whatever_the_peers_load():
    """node3's cgroup quota (0.2 CPUs) throttled its matmul in 90% of the periods; the peers, on
    cores shared with other processes, are barely faster (the ratio alone says nothing): the quota
    is measured, so node3 is worse than its peers and the check says why. The same quota on every
    node is the job's, not one node's; a throttled node that is not slower is no finding."""
    out = X.compute_speed({"n1": _quota_bench(23.3, None, None), "n2": _quota_bench(22.0, None, None),
                           "n3": _quota_bench(17.8, 0.2, 0.9)})
    assert {n: o.status for n, o in out.items()} == {"n1": Status.PASS, "n2": Status.PASS, "n3": Status.WARN}
    assert out["n3"].observed == ("slower than the other nodes: CPU matmul at 17.8 GFLOP/s against 22.6 GFLOP/s; "
                                  "its cgroup's CPU quota (a limit of 0.2 CPUs) throttled it in 90% of the periods")
    assert (out["n3"].data["cpu_quota"], out["n3"].data["cpu_throttled"]) == (0.2, 0.9)
    obs = {o.host: o for o in X.bench_observations({n: X.bench_figures(b) for n, b in {
        "n1": _quota_bench(23.3, None, None), "n2": _quota_bench(22.0, None, None),
        "n3": _quota_bench(17.8, 0.2, 0.9)}.items()}, {"n3": {"cpu_quota": 0.2, "cpu_throttled": 0.9}})}
    assert obs["n3"].bad and not obs["n1"].bad and obs["n3"].value == 17.8
    # the same quota throttling every node: the job's limit, judged by the ratio only
    same = X.compute_speed({n: _quota_bench(v, 0.2, 0.9) for n, v in (("n1", 23.3), ("n2", 22.0), ("n3", 17.8))})
    assert {o.status for o in same.values()} == {Status.PASS}
    # throttled now and then (under half of the periods), or throttled but not slower: no finding
    assert X.compute_speed({"n1": _quota_bench(23.3, None, None), "n2": _quota_bench(22.0, None, None),
                            "n3": _quota_bench(17.8, 0.2, 0.3)})["n3"].status is Status.PASS
    assert X.compute_speed({"n1": _quota_bench(23.3, None, None), "n2": _quota_bench(22.0, None, None),
                            "n3": _quota_bench(30.0, 0.2, 0.9)})["n3"].status is Status.PASS
