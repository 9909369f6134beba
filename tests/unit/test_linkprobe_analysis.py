"""Naming the slow node from probe transfers (pure analysis; the measuring is tested on the cluster)."""

from __future__ import annotations

from traceml_core.linkprobe.analysis import CONFIRM_PASSES, Pair, analyse, best_of, confirm, schedule, suspect_pairs

GB = 10**9


def measure(nnodes: int, send_gbps: dict[int, float], recv_gbps: dict[int, float] | None = None,
            fast: float = 2.0):
    """Pairs of the real schedule: a pair goes as fast as the slower of its sender's egress and
    its receiver's ingress."""
    recv_gbps = recv_gbps or {}
    pairs = []
    for rnd in schedule(nnodes):
        for s, d in rnd:
            rate = min(send_gbps.get(s, fast), recv_gbps.get(d, fast))
            pairs.append(Pair(s, d, nbytes=GB // 10, seconds=(GB // 10) / (rate * GB)))
    return pairs


HOSTS = ["n0", "n1", "n2", "n3"]


def test_schedule_sends_each_node_to_two_peers():
    assert schedule(1) == []
    assert schedule(2) == [[(0, 1)], [(1, 0)]]
    rounds = schedule(4)
    assert rounds == [[(0, 1), (1, 2), (2, 3), (3, 0)], [(0, 3), (1, 0), (2, 1), (3, 2)]]
    for n in range(4):
        assert len({d for r in rounds for s, d in r if s == n}) == 2
        assert len({s for r in rounds for s, d in r if d == n}) == 2


def test_a_node_with_slow_egress_is_named_among_three():
    out = analyse(measure(3, {1: 0.0125}), HOSTS[:3], bytes_per_pair=GB // 10, seconds=3.0)
    slow = out["slow_node"]
    assert slow == {"node": 1, "host": "n1", "gbps": 0.0125, "others_gbps": 2.0,
                    "direction": "send", "ratio": 0.0063}
    assert [n["gbps"] for n in out["nodes"]] == [2.0, 0.0125, 2.0]
    assert [n["recv_gbps"] for n in out["nodes"]] == [2.0, 2.0, 2.0], "each receiver had a fast peer"
    assert out["slow_link"] is None and len(out["pairs"]) == 6


def test_a_node_with_slow_ingress_is_named_for_receiving():
    out = analyse(measure(4, {}, {3: 0.1}), HOSTS, bytes_per_pair=GB // 10, seconds=3.0)
    assert out["slow_node"]["node"] == 3 and out["slow_node"]["direction"] == "receive"


def test_equal_links_name_nobody():
    out = analyse(measure(4, {0: 1.9, 1: 2.1, 2: 1.6, 3: 2.0}), HOSTS, bytes_per_pair=1, seconds=1.0)
    assert out["slow_node"] is None and out["slow_link"] is None


def test_two_nodes_name_the_slow_direction_not_a_node():
    out = analyse(measure(2, {1: 0.0125}), HOSTS[:2], bytes_per_pair=GB // 10, seconds=2.0)
    assert out["slow_node"] is None
    assert out["slow_link"] == {"src": 1, "dst": 0, "src_host": "n1", "dst_host": "n0",
                                "gbps": 0.0125, "others_gbps": 2.0}


def test_failed_transfers_are_reported_not_counted_as_slow():
    pairs = measure(3, {})
    pairs[1] = Pair(1, 2, error="connection refused")
    out = analyse(pairs, HOSTS[:3], bytes_per_pair=1, seconds=1.0)
    assert out["pairs"][1]["gbps"] is None and out["pairs"][1]["error"] == "connection refused"
    assert out["slow_node"] is None


def test_a_named_node_or_direction_is_measured_again_before_it_stands():
    slow_sender = analyse(measure(3, {1: 0.0125}), HOSTS[:3], bytes_per_pair=GB // 10, seconds=3.0)
    assert sorted(suspect_pairs(slow_sender)) == [(1, 0), (1, 2)]
    slow_receiver = analyse(measure(4, {}, {3: 0.1}), HOSTS, bytes_per_pair=GB // 10, seconds=3.0)
    assert slow_receiver["slow_node"]["direction"] == "receive"
    assert sorted(suspect_pairs(slow_receiver)) == [(0, 3), (2, 3)]
    two = analyse(measure(2, {1: 0.0125}), HOSTS[:2], bytes_per_pair=GB // 10, seconds=3.0)
    assert sorted(suspect_pairs(two)) == [(0, 1), (1, 0)]
    assert suspect_pairs(analyse(measure(3, {}), HOSTS[:3], bytes_per_pair=GB // 10, seconds=3.0)) == []


def test_a_pair_measured_twice_keeps_its_faster_measurement():
    slow, fast, broken = Pair(1, 0, GB, 10.0), Pair(1, 0, GB, 1.0), Pair(1, 0, error="reset")
    assert best_of(slow, fast) is fast and best_of(fast, slow) is fast
    assert best_of(broken, slow) is slow and best_of(slow, broken) is slow
    # a node slow only while the CPU was busy is not named once its transfers ran fast again
    pairs = measure(3, {1: 0.0125})
    again = {(1, 0): Pair(1, 0, GB // 10, 0.05), (1, 2): Pair(1, 2, GB // 10, 0.05)}
    pairs = [best_of(p, again[(p.src, p.dst)]) if (p.src, p.dst) in again else p for p in pairs]
    assert analyse(pairs, HOSTS[:3], bytes_per_pair=GB // 10, seconds=3.0)["slow_node"] is None


def _judge(hosts):
    return lambda pairs: analyse(pairs, hosts, bytes_per_pair=GB // 10, seconds=3.0)


def _scripted(rates_by_pass: list[float]):
    """Measures again at the next scripted rate (GB/s) each time it is asked; counts the asks."""
    asked: list[tuple[int, int]] = []

    def again(pair):
        asked.append(pair)
        rate = rates_by_pass[min(len(asked) - 1, len(rates_by_pass) - 1)]
        return Pair(pair[0], pair[1], GB // 10, (GB // 10) / (rate * GB))
    return again, asked


def test_a_direction_slowed_by_load_twice_is_not_named_when_a_later_pass_runs_at_the_link():
    # two idle links on a loaded machine (CI: 0.82 against 1.66 GB/s after one pass): the first
    # measurement and the first re-measurement slowed, the second re-measurement at the link's rate
    pairs = measure(2, {0: 0.8})
    again, asked = _scripted([0.8, 0.8, 2.0, 2.0])
    out = confirm(pairs, _judge(HOSTS[:2]), again)
    assert out["slow_link"] is None, out["slow_link"]
    assert len(asked) == 4   # two passes over the direction and its reverse, then nobody suspect
    # what a single pass (the rule before) made of it: a false SLOW LINK
    assert confirm(pairs, _judge(HOSTS[:2]), _scripted([0.8])[0], passes=1)["slow_link"]["gbps"] == 0.8


def test_a_really_slow_link_is_named_after_every_pass_and_costs_no_more():
    pairs = measure(3, {1: 0.0125})
    again, asked = _scripted([0.0125])
    out = confirm(pairs, _judge(HOSTS[:3]), again)
    assert out["slow_node"]["node"] == 1 and out["slow_node"]["gbps"] == 0.0125
    assert len(asked) == CONFIRM_PASSES * 2   # node 1's two sends, in each pass


def test_equal_links_are_judged_once_and_a_stopped_probe_says_so():
    again, asked = _scripted([2.0])
    assert confirm(measure(3, {}), _judge(HOSTS[:3]), again)["slow_node"] is None and asked == []
    assert confirm(measure(3, {1: 0.0125}), _judge(HOSTS[:3]), lambda pair: None) is None
