"""The summary's work at the node and world-size limits: linear in nodes + ranks (issue 15).

Builds the final summary (JSON document, text, HTML page) of a run in which only node 0 joined and
every other node never came, for N nodes and 2N nodes side by side, and prints the time of each
part, the sizes, and the ratio t(2N) / t(N): about 2 when the work is linear, about 4 when it is
quadratic (it was: the topology and the failure diagnosis looped ranks x ranks, so 8,192 nodes took
12.6 s and 65,536 would have taken hours). Peak memory of the whole build is printed as well.

    python benchmarks/summary_scale.py                 # 8,192 / 16,384 / 32,768 / 65,536 nodes x 1
    python benchmarks/summary_scale.py --nodes 4096 --nproc 16
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from traceml_core import limits  # noqa: E402
from traceml_core.aggregator.settings import AggregatorSettings  # noqa: E402
from traceml_core.aggregator.state import RunState  # noqa: E402
from traceml_core.report.render_html import render_html  # noqa: E402
from traceml_core.report.render_txt import render  # noqa: E402
from traceml_core.report.summary import build_summary  # noqa: E402
from traceml_core.aggregator.adapter import run_data  # noqa: E402
from traceml_core.rundata import LaunchEnd  # noqa: E402


def one(nodes: int, nproc: int) -> dict[str, float]:
    st = RunState(AggregatorSettings(run_name="scale", token="t", run_dir=Path("/nonexistent"),
                                     nnodes=nodes, nproc_per_node=nproc))
    st.note_join(0, "node0", "relay", time.time())
    st.finish = LaunchEnd(exit_code=1, reason="nodes never joined", failed_nodes=list(range(1, nodes)),
                          at=time.time())
    data = run_data(st)
    out: dict[str, float] = {}
    t = time.perf_counter()
    summary = build_summary(data)
    out["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    text = render(summary)
    out["text_s"] = time.perf_counter() - t
    t = time.perf_counter()
    page = render_html(summary)
    out["html_s"] = time.perf_counter() - t
    t = time.perf_counter()
    doc = json.dumps(summary)
    out["json_s"] = time.perf_counter() - t
    out["total_s"] = out["build_s"] + out["text_s"] + out["html_s"] + out["json_s"]
    out["json_mib"], out["html_mib"], out["text_kib"] = len(doc) / 2**20, len(page) / 2**20, len(text) / 1024
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="8192,32768", help="comma-separated N (each is run with 2N too)")
    ap.add_argument("--nproc", type=int, default=1)
    ns = ap.parse_args()
    print(f"{'nodes x nproc':>16} {'build s':>8} {'text s':>7} {'html s':>7} {'json s':>7} {'total s':>8} "
          f"{'JSON MiB':>9} {'HTML MiB':>9} {'text KiB':>9}  t(2N)/t(N)")
    for n in [int(x) for x in ns.nodes.split(",")]:
        prev = None
        for nodes in (n, 2 * n):
            if nodes > limits.NODES.hi or nodes * ns.nproc > limits.WORLD_SIZE.hi:
                print(f"{nodes:>7} x {ns.nproc:<6} past the limits ({limits.NODES.hi:,} nodes, "
                      f"{limits.WORLD_SIZE.hi:,} ranks): refused at start-up")
                continue
            r = one(nodes, ns.nproc)
            ratio = f"{r['total_s'] / prev:5.2f}" if prev else ""
            print(f"{nodes:>7} x {ns.nproc:<6} {r['build_s']:8.2f} {r['text_s']:7.2f} {r['html_s']:7.2f} "
                  f"{r['json_s']:7.2f} {r['total_s']:8.2f} {r['json_mib']:9.1f} {r['html_mib']:9.1f} "
                  f"{r['text_kib']:9.1f}  {ratio}", flush=True)
            prev = r["total_s"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
